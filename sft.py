"""sft.py: the supervised cold start, tool-use SFT before RL.

Paper: CLEANER starts GRPO from cold-start SFT checkpoints (Gen-Verse/Qwen3-4B-RA-SFT,
Gen-Verse/Qwen2.5-7B-RA-SFT) trained on DemyAgent/Open-AgentRL's RA-SFT tool-use conversations,
so that RL begins from a model that already calls the interpreter. This script is that step:
cross-entropy on the assistant tokens only, over conversations of the shape
    user (problem) -> assistant (reasoning + one call) -> tool output -> assistant (\\boxed{answer}).

Data: `--data synth` (the default) generates warm-up conversations with data/synth.py: problems
that are easier than the RL ones, so RL still meets failing tool calls for SAAR to clean. Any
other value is a JSONL of chat conversations in the OpenAI messages format (for users with the
RA-SFT data, converted): assistant messages may carry `tool_calls`, answered by `tool` messages.

Layout. Every sequence is built token for token the way rollout.py builds a trajectory, so RL
starts from a model that already produces the rollout's layout:
    rollout.prompt_ids(...)                         the first user turn, templated once   mask 0
    encode(assistant turn, cut at the call's end)   ends with "```\\n" or "</tool_call>"  mask 1
    encode(rollout.tool_turn_text(output, ended=False))  <|im_end|>, user turn, assistant  mask 0
    encode(final answer) + [eos]                    eos is <|im_end|>                     mask 1
Departures from a plain chat-template SFT, all for that reason: a call turn is not closed with
<|im_end|> by the model (the scaffolding does it); whatever followed the first call inside one
assistant message is dropped (generation stops there); tool outputs are cut in the middle to
--tool-output-chars (256; train.py passes the rollout's); a call is rendered in the chosen tool
format whatever the data's tool was named, with the code from `arguments.code`. For generated data
the tool output is the program's raw stdout, trailing newline included, which is exactly what the
sandbox shows the model during RL.

Training: AdamW, linear warmup then linear decay, packed micro-batches (packing.pack), log-probs from
packing.token_logprobs (lm_head applied in chunks, only on loss tokens: never a (T, vocab) float32
tensor), token-mean loss over each optimizer batch. The paper's SFT recipe (LLaMA-Factory style,
several epochs on 3K conversations) is not reproduced; this is a CPU-sized warm-up.

    python sft.py                                   # SmolLM2-135M on 128 generated conversations
    python sft.py --data ra_sft.jsonl --model Qwen/Qwen3-4B-Instruct-2507 --tool_format hermes
train.py calls `warm_start` (at the end), which runs this once per model and settings and caches it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import sys
import time
import typing
from importlib import metadata
from pathlib import Path

import torch

import config
import grpo
import rollout
import tools
from data import synth
from data.benchmarks import jsonl_rows
from data.models import load_model, load_tokenizer, resolve
from machinery import checkpoint, packing
from machinery.cache import built_once, cache_dir, hash_files
from machinery.policy import freeze_below


Args = config.SftArgs  # model and seed (config.Common), the cold start's own settings (config.Sft)


MARKER = "cleaner_sft.json"
EVAL_SEED_OFFSET = 10_000  # eval problems come from another seed's stream than the training ones
TOOL_FORMATS = typing.get_args(config.CallFormat)


# --------------------------------------------------------------------------- conversations -> tokens

def _content(m: dict, where: str) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, list):  # OpenAI content parts
        if not all(isinstance(x, dict) and isinstance(x.get("text", ""), str) for x in c):
            raise ValueError(f"{where}: field 'content' is a list but not of {{type, text}} parts")
        return "".join(x.get("text", "") for x in c)
    if not isinstance(c, str):
        raise ValueError(f"{where}: field 'content' must be a string, got {type(c).__name__}")
    return c


def _tool_call(tool_calls, where: str) -> rollout.Call:
    """The one call of an OpenAI-format turn, for the offered tool it names (another name, as public data names
    the interpreter variously, e.g. python: the Python tool), with the one argument the rollout renders."""
    if not isinstance(tool_calls, list) or not tool_calls:
        raise ValueError(f"{where}: field 'tool_calls' must be a non-empty list")
    if len(tool_calls) > 1:
        raise ValueError(f"{where}: {len(tool_calls)} tool calls in one turn; the rollout runs one call per turn")
    tc = tool_calls[0]
    f = tc.get("function", tc) if isinstance(tc, dict) else None
    args = f.get("arguments") if isinstance(f, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: tool_calls[0].function.arguments is not valid JSON ({e.msg})") from None
    name = f.get("name") if isinstance(f, dict) else None
    tool = (tools.TOOLS.get(name) if isinstance(name, str) else None) or tools.TOOLS[tools.PythonTool.name]
    value = args.get(tool.arg) if isinstance(args, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: tool_calls[0].function.arguments has no {tool.arg!r} string")
    return rollout.Call(tool.name, {tool.arg: value})


def call_turn_text(message: dict, tool_format: str, where: str = "message") -> str:
    """An assistant turn that calls the tool, as the model should write it: ending at the call's end marker.

    A call in `tool_calls` is rendered in `tool_format` after the content; otherwise the content must
    already hold one. Text after the first call is dropped: the rollout stops generating there.
    """
    text = _content(message, where)
    if message.get("tool_calls"):
        call = rollout.call_text(_tool_call(message["tool_calls"], where), tool_format)
        text = (text.rstrip() + ("\n\n" if tool_format == "markdown" else "\n") if text.strip() else "") + call
    start = rollout.find_call_start(text, tool_format)
    if start is None:
        raise ValueError(f"{where}: a tool result follows, but the turn holds no {tool_format} call")
    if tool_format == "markdown":
        close = text.find("```", text.index("\n", start) + 1)
        if close < 0:
            raise ValueError(f"{where}: the ```python block is never closed")
        text, stop = text[:close] + "```\n", "```\n"  # the rollout's stop string is the closing fence + newline
    else:
        close = text.find("</tool_call>", start)
        if close < 0:
            raise ValueError(f"{where}: <tool_call> is never closed by </tool_call>")
        text, stop = text[:close + len("</tool_call>")], "</tool_call>"
    if text.find(stop) != len(text) - len(stop):
        raise ValueError(f"{where}: {stop!r} occurs before the call ends; the rollout would stop generating there")
    call = rollout.parse_call(text, tool_format)
    if call.args is None:
        raise ValueError(f"{where}: {call.error or 'no call'}")
    return text


def encode_conversation(tokenizer, messages: list[dict], *, tool_format: str, tool_output_chars: int = 256,
                        where: str = "conversation") -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one conversation, laid out token for token as rollout.py builds a trajectory.

    Leading system messages and the first user message are templated once with the chat template
    (as rollout.prompt_ids does: with the tool schema for hermes). Mask 1 on assistant tokens,
    including the <|im_end|> that ends an answer; 0 on the prompt, tool outputs and scaffolding.
    """
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if "user" not in roles:
        raise ValueError(f"{where}: no user message")
    k = roles.index("user")
    if any(r != "system" for r in roles[:k]):
        raise ValueError(f"{where}: only system messages may come before the first user message")
    if roles[-1] != "assistant":
        raise ValueError(f"{where}: the last message must be the assistant's, got role {roles[-1]!r}")
    head = [{"role": r, "content": _content(m, f"{where}, message {i}")} for i, (r, m) in
            enumerate(zip(roles[:k + 1], messages[:k + 1]))]
    ids = list(tokenizer.apply_chat_template(head, tools=tools.schemas() if tool_format == "hermes" else None,
                                             add_generation_prompt=True, tokenize=True, return_dict=False))
    mask = [0] * len(ids)

    def add(text_or_ids, m: int):
        t = tokenizer.encode(text_or_ids, add_special_tokens=False) if isinstance(text_or_ids, str) else text_or_ids
        ids.extend(t)
        mask.extend([m] * len(t))

    i = k + 1
    while i < len(messages):
        at = f"{where}, message {i}"
        if roles[i] != "assistant":
            raise ValueError(f"{at}: expected an assistant message, got role {roles[i]!r}")
        nxt = roles[i + 1] if i + 1 < len(roles) else None
        if nxt == "tool":
            add(call_turn_text(messages[i], tool_format, at), 1)
            out = rollout.truncate_middle(_content(messages[i + 1], f"{where}, message {i + 1}"), tool_output_chars)
            add(rollout.tool_turn_text(out, tool_format, ended=False), 0)
            if i + 2 < len(roles) and roles[i + 2] == "tool":
                raise ValueError(f"{where}, message {i + 2}: a second tool result for one turn; "
                                 "the rollout runs one call per turn")
            i += 2
            continue
        if messages[i].get("tool_calls"):
            raise ValueError(f"{at}: the assistant calls a tool but no tool message follows")
        add(tokenizer.encode(_content(messages[i], at), add_special_tokens=False) + [tokenizer.eos_token_id], 1)
        if nxt == "user":  # not something the rollout produces; kept so plain multi-turn chats still load
            user = _content(messages[i + 1], f"{where}, message {i + 1}")
            add(f"\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n", 0)
            i += 2
        elif nxt is None:
            i += 1
        else:
            raise ValueError(f"{where}, message {i + 1}: role {nxt!r} cannot follow an assistant answer")
    return ids, mask


def load_conversations(path: str, n: int = 0) -> list[tuple[str, list[dict]]]:
    """Rows of a JSONL file: {"messages": [...]} (or a bare list of messages) -> (file:line, messages)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--data {path}: no such file (use 'synth' for generated conversations)")
    rows = []
    for where, row in jsonl_rows(Path(path)):  # a line that is not JSON: a DataError naming it
        msgs = row.get("messages") if isinstance(row, dict) else row
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise ValueError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
        rows.append((where, msgs))
        if n and len(rows) >= n:
            break
    if not rows:
        raise ValueError(f"{path}: no conversations")
    return rows


def build_dataset(tokenizer, *, data: str, n: int, tool_format: str, tool_output_chars: int, max_len: int,
                  seed: int, fix_fraction: float = 0.0) -> list[tuple[list[int], list[int]]]:
    """Tokenized (ids, mask) pairs; conversations the rollout cannot represent are skipped, with reasons."""
    if data == "synth":
        rows = [(c["id"], c["messages"]) for c in synth.warmup_conversations(n, seed, tool_format, fix_fraction)]
    else:
        rows = load_conversations(data, n)
    seqs, problems, too_long = [], [], 0
    for where, msgs in rows:
        try:
            ids, mask = encode_conversation(tokenizer, msgs, tool_format=tool_format,
                                            tool_output_chars=tool_output_chars, where=where)
        except ValueError as e:
            if data == "synth":
                raise  # our own data must always convert
            problems.append(str(e))
            continue
        if len(ids) > max_len:
            too_long += 1
            continue
        seqs.append((ids, mask))
    if problems:
        print(f"[sft] skipped {len(problems)} of {len(rows)} conversations the rollout cannot represent, e.g.:",
              *problems[:3], sep="\n  ", file=sys.stderr)
    if too_long:
        print(f"[sft] dropped {too_long} conversations longer than max_len={max_len} tokens", file=sys.stderr)
    if not seqs:
        raise ValueError(f"--data {data}: no usable conversations")
    return seqs


def dataset(args: Args, tokenizer) -> list[tuple[list[int], list[int]]]:
    """The (ids, mask) pairs `run` trains on, for these arguments (`cache_key` keys the warm start on them)."""
    return build_dataset(tokenizer, data=args.sft.data, n=args.sft.n_conversations, tool_format=args.sft.tool_format,
                         tool_output_chars=args.sft.tool_output_chars, max_len=args.sft.max_len, seed=args.common.seed,
                         fix_fraction=args.sft.fix_fraction)


# --------------------------------------------------------------------------- training

def _micro_batch(seqs, idx: list[int]):
    """Pack conversations into one row: position_ids restart at 0 for each, attention_mask None."""
    ids = torch.tensor([t for i in idx for t in seqs[i][0]])[None]  # (1, T)
    mask = torch.tensor([m for i in idx for m in seqs[i][1]])[None]  # (1, T)
    pos = torch.cat([torch.arange(len(seqs[i][0])) for i in idx])[None]  # (1, T)
    return ids, pos, mask


def masked_nll(model, seqs, idx: list[int], *, micro_tokens: int, normaliser: float, backward: bool) -> float:
    """Sum over the conversations idx of -log p(loss tokens) / normaliser; backpropagates micro-batch by micro-batch."""
    total = 0.0
    for bin_ in packing.pack([len(seqs[i][0]) for i in idx], micro_tokens):
        ids, pos, mask = _micro_batch(seqs, [idx[j] for j in bin_])
        logp = packing.token_logprobs(model, ids, pos, mask=mask)  # (1, T), 0 off the mask
        loss = -(logp * mask).sum() / normaliser
        if backward:
            loss.backward()
        total += loss.item()
    return total


def train(model, seqs: list[tuple[list[int], list[int]]], *, epochs: int, lr: float, batch_size: int,
          micro_tokens: int, warmup_steps: int, weight_decay: float, grad_clip: float, seed: int,
          train_layers: int = 0, log=None) -> list[dict]:
    """AdamW on the masked token-mean NLL; returns one dict per optimizer step."""
    from tqdm import tqdm
    model.train()
    freeze_below(model, train_layers)
    rng = random.Random(seed)
    batches = []
    for _ in range(epochs):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        batches += [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    total = len(batches)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    # warmup to lr, then linear decay to 0 at the last step: short runs end gently
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / max(1, warmup_steps),
                                                                 (total - s) / max(1, total - warmup_steps)))
    per_epoch = math.ceil(len(seqs) / batch_size)
    stats, t0 = [], time.time()
    bar = tqdm(total=total, desc="sft", leave=False, disable=None)
    for step, idx in enumerate(batches):
        t = time.time()
        n_loss = sum(sum(seqs[i][1]) for i in idx)
        n_tok = sum(len(seqs[i][0]) for i in idx)
        loss = masked_nll(model, seqs, idx, micro_tokens=micro_tokens, normaliser=max(n_loss, 1), backward=True)
        if not math.isfinite(loss):
            raise grpo.NonFiniteLossError(f"sft step {step}: loss is {loss}")
        norm = torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], grad_clip if grad_clip > 0 else float("inf"))
        cur_lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dt = time.time() - t
        s = dict(step=step + 1, epoch=step // per_epoch + 1, loss=loss, grad_norm=float(norm), lr=cur_lr,
                 tokens=n_tok, loss_tokens=n_loss, tok_per_s=n_tok / dt, elapsed_s=time.time() - t0)
        stats.append(s)
        bar.update(1)
        bar.write(f"[sft] step {s['step']}/{total} epoch {s['epoch']} loss {loss:.4f} grad {s['grad_norm']:.2f} "
                  f"lr {cur_lr:.2e} {s['tok_per_s']:.0f} tok/s {s['elapsed_s']:.0f}s", file=sys.stderr)
        if log is not None:
            log(s)
    bar.close()
    freeze_below(model, 0)
    model.eval()
    return stats


# --------------------------------------------------------------------------- evaluation

def _last_line(s: str) -> str:
    lines = [ln.strip() for ln in s.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def evaluate(engine, tokenizer, *, tool_format: str, n: int, seed: int, max_turn_tokens: int = 384) -> dict:
    """Roll out held-out warm-up problems at T=1 as train.py does (a machinery/engines.py engine, the real sandbox, SAAR
    off), with two turns at most: a call, and an answer after its output.

    blocks: first turns holding a call that parses; right: those whose code ran and printed the answer as
    its last line; final: responses whose last \\boxed{} is right.
    """
    from reward import grade_math
    from sandbox import Sandbox
    t0 = time.time()
    problems = synth.make_problems(n, seed + EVAL_SEED_OFFSET, difficulty="warmup")  # task "math"
    cfg = config.Rollout(tool_format=tool_format, max_turns=2, max_turn_tokens=max_turn_tokens,
                         max_response_tokens=4 * max_turn_tokens, temperature=1.0)
    with Sandbox(slots=2, timeout_s=4.0) as sb:
        trajs, finals = asyncio.run(rollout.rollout_and_grade(
            engine, sb, tokenizer, problems, cfg, grade=lambda p, t: grade_math(t.final_text(tokenizer), p.answer),
            seeds=[seed + i for i in range(n)]))
    first = [t.turns[0] if t.turns and t.turns[0]["turn"] == 0 else None for t in trajs]
    return dict(n=n, blocks=sum(c is not None and c["error_kind"] != "malformed" for c in first),
                right=sum(c is not None and c["ok"] and _last_line(c["output"]) == p.answer for c, p in zip(first, problems)),
                final=sum(finals), seconds=time.time() - t0, sample=trajs[0].text)


def _evaluate_model(model, tokenizer, args: Args) -> dict:
    from machinery.engines import build_engine
    # a fresh one each time: no prefix KV of older weights
    eng = build_engine("hf", tokenizer, model=model.eval(), max_batch=8)
    try:
        return evaluate(eng, tokenizer, tool_format=args.sft.tool_format, n=args.sft.eval_n, seed=args.common.seed)
    finally:
        eng.shutdown()


def describe(r: dict) -> str:
    return (f"python block {r['blocks']}/{r['n']}, block prints the answer {r['right']}/{r['n']}, "
            f"final \\boxed right {r['final']}/{r['n']} ({r['seconds']:.0f} s)")


# --------------------------------------------------------------------------- the run

def run(args: Args) -> dict:
    """Load, tokenize, (evaluate the base), train, save, evaluate. Returns a summary dict."""
    save = args.sft.save or (str(Path(args.sft.out) / "model") if args.sft.out else "")
    if not save:
        raise ValueError("nowhere to save the model: give --save or --out")
    if args.sft.threads:
        torch.set_num_threads(args.sft.threads)
    torch.manual_seed(args.common.seed)
    t_start = time.time()
    tok = load_tokenizer(args.common.model)
    seqs = dataset(args, tok)
    n_tok, n_loss = sum(len(s[0]) for s in seqs), sum(sum(s[1]) for s in seqs)
    print(f"[sft] {len(seqs)} conversations, {n_tok} tokens ({n_loss} in the loss, longest "
          f"{max(len(s[0]) for s in seqs)}), model {args.common.model}, tool format {args.sft.tool_format}", file=sys.stderr)
    model = load_model(args.common.model)
    packing.packed_attention(model)  # packed rows: sdpa sequence by sequence, not over the whole row
    summary = dict(args=config.flat(args), conversations=len(seqs), tokens=n_tok, loss_tokens=n_loss)
    if args.sft.eval_n and args.sft.eval_base:
        summary["eval_base"] = _evaluate_model(model, tok, args)
        print(f"[sft] base model: {describe(summary['eval_base'])}", file=sys.stderr)
    logf = None
    if args.sft.out:
        Path(args.sft.out).mkdir(parents=True, exist_ok=True)
        logf = open(Path(args.sft.out) / "log.jsonl", "w")
    try:
        t0 = time.time()
        stats = train(model, seqs, epochs=args.sft.epochs, lr=args.sft.lr, batch_size=args.sft.batch_size,
                      micro_tokens=max(args.sft.micro_tokens, max(len(s[0]) for s in seqs)),
                      warmup_steps=args.sft.warmup_steps, weight_decay=args.sft.weight_decay, grad_clip=args.sft.grad_clip,
                      seed=args.common.seed, train_layers=args.sft.train_layers, log=(lambda s: print(json.dumps(s), file=logf, flush=True)) if logf else None)
        summary["train_s"] = round(time.time() - t0, 1)
    finally:
        if logf:
            logf.close()
    summary["first_loss"], summary["last_loss"] = stats[0]["loss"], stats[-1]["loss"]
    meta = dict(base_model=args.common.model, tool_format=args.sft.tool_format, seed=args.common.seed,
                conversations=len(seqs), data=args.sft.data, train_s=summary["train_s"],
                first_loss=summary["first_loss"], last_loss=summary["last_loss"], created=time.time(), pid=os.getpid(),
                args=config.flat(args))
    summary["saved"] = checkpoint.save_model(model, tok, save, {MARKER: json.dumps(meta, indent=1)})
    print(f"[sft] trained {len(stats)} steps in {summary['train_s']:.0f} s (loss {summary['first_loss']:.3f} -> "
          f"{summary['last_loss']:.3f}); saved {summary['saved']}", file=sys.stderr)
    if args.sft.eval_n:
        summary["eval_sft"] = _evaluate_model(model, tok, args)
        if "eval_base" in summary:
            print(f"[sft] base model: {describe(summary['eval_base'])}", file=sys.stderr)
        print(f"[sft] after SFT:  {describe(summary['eval_sft'])}", file=sys.stderr)
        print(f"[sft] a sample after SFT:\n{summary['eval_sft']['sample'][:1200]}", file=sys.stderr)
    summary["total_s"] = round(time.time() - t_start, 1)
    if args.sft.out:
        (Path(args.sft.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---------------------------------------------------------------------- the warm start: this cold start, trained once

# train.py's (and bench/rollout.py's) call: sft.run on generated conversations, cached under <cache_dir>/sft/<key>. The
# key covers what it trains on (the conversations' tokens), its settings, the base model's files and the library
# versions, not the source of any module: an ablation that edits saar.py reuses it, a reworded prompt or error text
# does not.

def _warm_start_complete(folder: Path) -> bool:
    try:
        meta = json.loads((folder / MARKER).read_text())
        json.loads((folder / "config.json").read_text())
        return isinstance(meta, dict) and (folder / "model.safetensors").exists()
    except (OSError, ValueError):
        return False


def sft_args(model_name: str, tool_format: str, seed: int, n: int, overrides: dict) -> Args:
    """sft.py's arguments for a warm start (no evaluation, no log folder; overrides: other config.Sft fields)."""
    unknown = set(overrides) - {f.name for f in dataclasses.fields(config.Sft)}
    if unknown:
        raise TypeError(f"warm_start: unknown Args fields {sorted(unknown)}")
    return Args(common=config.Common(model=model_name, seed=seed),
                sft=config.Sft(tool_format=tool_format, n_conversations=n, **(dict(eval_n=0, out="") | overrides)))


def cache_key(model_name: str, tool_format: str, seed: int, n: int, overrides: dict) -> str:
    """sha256 of what the cold start trains on (the tokenized conversations and their loss masks: the prompts,
    the tool's texts and the sandbox's real errors, as the rollout writes them), its settings (not where it
    saves), the base model's files (a local folder or an offline model's built folder; a hub id by name) and
    the torch and transformers versions. No source is hashed: editing saar.py or grpo.py keeps the cold start,
    rewording a prompt or an error text changes the conversations and so the key."""
    args = sft_args(model_name, tool_format, seed, n, overrides)
    seqs = dataset(args, load_tokenizer(model_name))
    settings = {k: v for k, v in config.flat(args).items() if k not in ("model", "save", "out")}
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    h.update(json.dumps(seqs).encode())
    folder = Path(resolve(model_name))
    if folder.is_dir():
        hash_files(h, folder, skip=(MARKER,))  # a warm start's own build record changes with every build
    else:  # a hub id
        h.update(model_name.encode())
    h.update(" ".join(metadata.version(d) for d in ("torch", "transformers")).encode())
    return h.hexdigest()[:12]


def warm_start(model_name: str, *, tool_format: str = "markdown", seed: int = 0, n: int = 128,
               cache: str | os.PathLike | None = None, **overrides) -> str:
    """Path of a model fine-tuned by sft.py for (model, tool_format, seed, n, overrides), trained once on
    generated warm-up conversations and cached under <cache_dir>/sft/<key> (cache_key: the conversations' tokens,
    the settings, the base model's files, the library versions).

    overrides are other config.Sft fields (e.g. epochs=1); they are part of the cache key. No evaluation
    runs here. Processes that start at once (torchrun's ranks) train it once and share it (machinery/cache.py's built_once).
    """
    p = Path(model_name).expanduser()
    digest = cache_key(str(p.resolve()) if p.exists() else model_name, tool_format, seed, n, overrides)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", p.name or model_name)[-40:]
    final = Path(cache) if cache is not None else cache_dir() / "sft"
    final = final / f"{slug}-{tool_format}-s{seed}-n{n}-{digest}"
    if _warm_start_complete(final):
        print(f"[sft] warm start: using cached {final}", file=sys.stderr)
        return str(final)

    def build(tmp: Path):
        print(f"[sft] warm start: no cached model for {model_name} ({tool_format}, seed {seed}, n {n}); "
              f"fine-tuning once into {final}", file=sys.stderr)
        # under torchrun each rank has its share of the cores (one thread on a CPU); the others wait for this one
        threads = torch.get_num_threads()
        try:
            run(sft_args(model_name, tool_format, seed, n, overrides | dict(
                save=str(tmp), threads=threads * int(os.environ.get("LOCAL_WORLD_SIZE", 1)))))
        finally:
            torch.set_num_threads(threads)
    return str(built_once(final, build, _warm_start_complete))


if __name__ == "__main__":
    run(config.cli(Args, (__doc__ or "").strip().splitlines()[0]))
