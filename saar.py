"""SAAR: Similarity-Aware Adaptive Rollback (the paper's Sec. 3, Open-CLEANER's `#CLEANER` code).

When a tool call fails, the rollout (rollout.py) hands the trajectory to `retry_failed_call`:
  1. snapshot the trajectory up to and including the failed assistant turn;
  2. append the error text (already cut to 256 characters) as a tool turn, loss mask 0;
  3. regenerate one assistant turn from there with the same sampling params (so the prefix is cached);
  4. split the old and the new turn at the token where the call begins (`split_turn`);
  5. `similarity` on the decoded call segments: >= gamma -> shallow (old reasoning + new call),
     otherwise, or when a turn can't be split -> deep (the new turn whole) (`replace_turn`);
  6. restore the snapshot with the replacement in place of the failed turn, so the error and the retry
     vanish from the sequence, and execute the corrected call; repeat up to `max_retries` per turn;
  7. give up when retries run out: keep the last failed attempt, its error and (after >= 2 retries) a note
     to try another approach, and turn SAAR off for the rest of the trajectory. A regenerated turn with
     no call (the model answered) is kept as it is, after the error, and SAAR turns off too.
Curriculum mixing (each trajectory uses SAAR with probability p) is drawn in rollout.py.

Faithful to the official code by default: similarity on the decoded call text (`<tool_call>...` through
the end of the turn, JSON wrapper included), gamma 0.5 with shallow iff sim >= gamma, 3 retries per turn,
the raw error as feedback, no importance correction. Departures, all flags:
  * `sim_on="code"` compares the extracted code instead (the paper's text says code);
  * `feedback_instruction` appends an explicit "fix the error" line to the feedback;
  * replaced tokens were sampled with the error in context but are trained on the clean one: each is marked
    in `Trajectory.spliced` (the mismatch monitor reports them apart; `--rollout-is token` weights them by
    pi_old(clean)/pi_rollout(sampled), machinery/mismatch.py), and `is_mode="gate"` keeps the error (no replacement)
    when the sequence-level ratio over the replaced tokens falls below `is_gate`, from `engine.score` on the
    purified context;
  * the split position is found on token boundaries by decoding prefixes (binary search instead of the
    official linear scan, O(log n) decodes: the same boundary when the call marker is one token; when it is
    spelled in plain tokens, ours keeps the marker whole in the call, the official scan splits inside it);
  * `sim_eos` compares the call segments with the turn's <|im_end|>, as the official loop generates them.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field


# --------------------------------------------------------------------------- what the model reads from SAAR

# What the model reads from SAAR, after a failed call's result (the tool's reply, tools.py, or rollout.parse_call's
# message, cut to --tool-output-chars): with --feedback-instruction, the fix instruction before it regenerates;
# when SAAR gives up after 2 or more retries, the give-up note
FIX_INSTRUCTION = "\nThe tool call above failed. Fix the error and call the tool again."
# {n}: how often SAAR regenerated the turn before giving up (its retries, as the official note counts them)
GIVE_UP_NOTE = ("\n\nNote: this approach was retried {n} times, failing with the same kind of error each time. "
                "Try another algorithm, method or approach instead.")


# --------------------------------------------------------------------------- pure parts

def similarity(old: str, new: str) -> float:
    """difflib's ratio, exactly as the official code computes it (autojunk left on)."""
    return difflib.SequenceMatcher(None, old, new).ratio()


def split_turn(turn_ids: list[int], *, tokenizer, syntax) -> int | None:
    """Index of the first token of the call: turn_ids[:k] is the reasoning, turn_ids[k:] the call.

    The split falls on a token boundary: k is the longest prefix whose decoded text ends at or before the
    call marker. If the marker shares a token with the reasoning before it, that token goes to the call.
    syntax: the tool format's call syntax, `.start(text)` -> offset of the call or None (rollout.CallSyntax).
    """
    text = tokenizer.decode(turn_ids, skip_special_tokens=False)
    off = syntax.start(text)
    if off is None:
        return None
    lo, hi = 0, len(turn_ids)  # find the largest k with len(decode(ids[:k])) <= off
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(turn_ids[:mid], skip_special_tokens=False)) <= off:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Replacement:
    ids: list[int]
    kind: str                 # "shallow" or "deep"
    similarity: float         # NaN when a turn could not be split
    keep: int                 # how many leading tokens of ids come from the old turn (0 for deep)


def replace_turn(old_turn_ids: list[int], new_turn_ids: list[int], *, tokenizer, syntax, gamma: float = 0.5,
                 sim_on: str = "call", sim_eos: bool = False) -> Replacement:
    """Choose shallow (old reasoning + new call) or deep (new turn whole) replacement. Pure.

    sim_eos: compare the call segments as the official loop has them, run on to the end of the turn: the
    rollout stops at the end of the call, so the turn's end-of-turn token (<|im_end|>) is added to both."""
    k_old = split_turn(old_turn_ids, tokenizer=tokenizer, syntax=syntax)
    k_new = split_turn(new_turn_ids, tokenizer=tokenizer, syntax=syntax)
    if k_old is None or k_new is None:
        return Replacement(list(new_turn_ids), "deep", float("nan"), 0)
    old_call = tokenizer.decode(old_turn_ids[k_old:], skip_special_tokens=False)
    new_call = tokenizer.decode(new_turn_ids[k_new:], skip_special_tokens=False)
    if sim_on == "code":
        old_call, new_call = syntax.code(old_call), syntax.code(new_call)
        if old_call is None or new_call is None:  # a malformed call has no code to compare: deep
            return Replacement(list(new_turn_ids), "deep", float("nan"), 0)
    elif sim_on != "call":
        raise ValueError(f"sim_on must be 'call' or 'code', got {sim_on!r}")
    elif sim_eos:
        eos = tokenizer.eos_token or ""
        old_call, new_call = (c if c.endswith(eos) else c + eos for c in (old_call, new_call))
    sim = similarity(old_call, new_call)
    if sim >= gamma:
        return Replacement(list(old_turn_ids[:k_old]) + list(new_turn_ids[k_new:]), "shallow", sim, k_old)
    return Replacement(list(new_turn_ids), "deep", sim, 0)


# --------------------------------------------------------------------------- the rollback loop

@dataclass
class SaarState:
    """Per-trajectory SAAR state: on/off and the event log."""
    on: bool
    events: list[dict] = field(default_factory=list)


@dataclass
class Outcome:
    """What `retry_failed_call` leaves the rollout: the trajectory is already laid out, and the rollout goes on in one
    of two ways (each event's kind is in `SaarState.events`):
      next_turn None  the turn at the failed position holds the call to keep (a replacement whose call succeeded, or,
                      SAAR having given up, the last failed attempt): append `result`, then `note` (the give-up note,
                      "" for none), as its tool turn.
      next_turn set   the failed turn and its error stay (the model answered instead of calling again, or the gate
                      refused the replacement), and the regenerated turn follows them at next_turn, its generation
                      ended by next_finish: the rollout handles it as any turn.
    """
    result: object
    note: str = ""
    next_turn: int | None = None
    next_finish: str = ""


async def retry_failed_call(traj, start: int, result, *, cfg, state: SaarState, env) -> Outcome:
    """Purify the failed call in the turn at traj.response_ids[start:] (its result not yet appended).

    `cfg` holds SAAR's settings (a config.Saar: gamma, max_retries, sim_on, sim_eos, feedback_instruction,
    is_mode, is_gate). `env` is the rollout's per-trajectory tool environment (rollout.ToolEnv):
    generate, score, parse, execute, truncate, tokenizer, the call syntax, the tool-turn scaffolding and the
    tool-call budget. (This module imports no project module: settings and the rollout both come in duck-typed.)

    Each decision is logged in `state.events` with what it removed and what took its place, as text: the failed
    turn (`failed`), the error the model saw (`error`), the regenerated turn (`regenerated`), the text spliced in
    (`replacement`), and `span`, the response tokens where the replacement (or the regenerated turn) sits.
    """
    def text(ids) -> str:
        return env.tokenizer.decode(ids, skip_special_tokens=False)

    def log(kind: str, similarity=None, **more):
        state.events.append(dict(turn=env.turn, kind=kind, similarity=similarity, gamma=cfg.gamma, retry=retries,
                                 error_kind=result.error_kind, **more))

    retries = 0
    while True:
        if retries >= cfg.max_retries or not env.can_call():
            state.on = False  # give up: keep the last failed attempt and its error
            log("given_up", failed=text(traj.response_ids[start:]), error=env.truncate(result.text))
            return Outcome(result, note=GIVE_UP_NOTE.format(n=retries) if retries >= 2 else "")
        # snapshot = the trajectory up to and including the failed turn; restoring is truncating to `start`
        old_turn, old_logp = traj.response_ids[start:], traj.logprobs[start:]
        old_spliced = traj.spliced[start:]
        feedback = env.truncate(result.text) + (FIX_INSTRUCTION if cfg.feedback_instruction else "")
        fb = env.tool_turn_ids(feedback, env.ended(old_turn))
        if env.left(traj.prompt_ids + traj.response_ids) - len(fb) < 1:
            # no room for the error and a new turn within the response budget: the failed call stays, and
            # the rollout then finds no room for its result either (finish reason "length")
            state.on = False
            log("given_up", failed=text(old_turn), error=env.truncate(result.text), reason="budget")
            return Outcome(result)
        traj.extend(fb, mask=0)
        next_turn = len(traj.response_ids)
        new = await env.generate(traj.prompt_ids + traj.response_ids)  # room if the error and the new turn both stay
        retries += 1
        if not env.parse(new.token_ids).present:
            # the model answered instead of calling again: keep the error and the answer; SAAR off
            traj.extend(new.token_ids, mask=1, logprobs=new.logprobs)
            state.on = False
            log("answered", failed=text(old_turn), error=feedback, regenerated=text(new.token_ids),
                regen_tokens=len(new.token_ids), span=[next_turn, next_turn + len(new.token_ids)])
            return Outcome(result, next_turn=next_turn, next_finish=new.finish_reason)
        rep = replace_turn(old_turn, new.token_ids, tokenizer=env.tokenizer, syntax=env.syntax, gamma=cfg.gamma,
                           sim_on=cfg.sim_on, sim_eos=cfg.sim_eos)
        n_new = len(rep.ids) - rep.keep
        # kept reasoning keeps its log-probs (sampled on the clean context); new tokens keep theirs
        # (sampled with the error in context)
        new_logp = list(old_logp[:rep.keep]) + list(new.logprobs[len(new.token_ids) - n_new:])
        if cfg.is_mode == "gate":
            purified = traj.prompt_ids + traj.response_ids[:start] + rep.ids
            clean = await env.score(purified, len(traj.prompt_ids) + start + rep.keep)
            log_ratio = [c - s for c, s in zip(clean, new_logp[rep.keep:])]
            seq_ratio = math.exp(min(sum(log_ratio), 50.0))
            if seq_ratio < cfg.is_gate:
                # too unlikely on the clean context: keep the error and let the new turn follow it, which
                # is what a raw rollout would have produced; SAAR stays on for later turns
                traj.extend(new.token_ids, mask=1, logprobs=new.logprobs)
                log("gated", rep.similarity, failed=text(old_turn), error=feedback, regenerated=text(new.token_ids),
                    seq_ratio=seq_ratio, regen_tokens=len(new.token_ids),
                    span=[next_turn, next_turn + len(new.token_ids)])
                return Outcome(result, next_turn=next_turn, next_finish=new.finish_reason)
        traj.truncate(start)  # restore the snapshot: the error and the failed call vanish
        # the new tokens are spliced in: sampled with the error in context, trained without it (machinery/mismatch.py)
        traj.extend(rep.ids, mask=1, logprobs=new_logp, spliced=list(old_spliced[:rep.keep]) + [1] * n_new)
        log(rep.kind, rep.similarity, failed=text(old_turn), error=feedback, regenerated=text(new.token_ids),
            replacement=text(rep.ids), regen_tokens=len(new.token_ids), span=[start, start + len(rep.ids)])
        result = await env.execute(env.parse(rep.ids), retry=True)
        if result.ok:
            return Outcome(result)
