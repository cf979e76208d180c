"""GRPO: group-relative advantages, the clipped policy loss, old log-probs, the update.

Implements the RL objective of CLEANER (Xu, Chen, Li, 2026), which trains with veRL's GRPO
(recipe/cleaner/*.sh in the official code): advantages are rewards centred (and, by flag,
std-scaled) within the n samples of a prompt; the PPO loss uses asymmetric "clip-higher"
(0.2 / 0.28) and dual-clip (c = 10, on negative advantages only), token-mean aggregation,
no KL term, grad clip 1.0, AdamW with linear warmup, several mini-batch updates per step.
The semantics follow veRL's `verl/trainer/ppo/core_algos.py` (`compute_grpo_outcome_advantage`,
`compute_policy_loss_vanilla`, `agg_loss`, `kl_penalty`). Departures, all deliberate:

- A group of one sample, or with equal rewards, gets advantage exactly 0 (veRL gives a lone
  sample its raw reward); such groups are counted in the stats.
- `seq-mean-token-sum-norm` is Dr.GRPO's form: the mean over sequences of (token sum / max_len).
  veRL's version divides the batch's token sum by max_len without the sequence mean.
- The loss is normalised by the *global* count of the mini-batch (loss tokens for token-mean,
  trajectories for the seq-mean modes), all-reduced across ranks, so micro-batching and N ranks
  give the gradient of one process on the whole mini-batch (veRL scales by micro/mini sizes).
- The LR warmup starts at lr/warmup_steps rather than 0.

`update` and `compute_old_logprobs` take a batch of `TrainSeq`. What makes them fast lives in two leaf
modules: machinery/packing.py cuts a mini-batch into packed micro-batches (`packing.micro_batches`; a group's samples
behind one copy of their prompt with share_prompts) and takes their log-probs (`packing.token_logprobs`);
machinery/precision.py holds autocast, the fp16 loss scaler and the guard that keeps NaN/inf out of optimizer.step.
Distributed: under torchrun, the model wrapped by FSDP2 `fully_shard` (the decoder layers, then the root),
each rank holding its share of the trajectories. FSDP's gradient reduction averages over ranks, so each rank
scales its loss by the world size: with the global normaliser the sum is exactly the one-process gradient.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Callable, get_args

import torch
import torch.distributed as dist

import config
from machinery import packing, precision
from machinery.precision import NonFiniteLossError  # noqa: F401  (callers catch grpo.NonFiniteLossError)

AGG_MODES = get_args(config.AggMode)
KL_TYPES = get_args(config.KlType)


@dataclass
class TrainSeq:
    """One trajectory of the update: prompt and response joined into one token list of length L, every per-token
    field over the whole of it, entry t belonging to token t (the log-prob of token t given tokens < t). Entry 0
    has no prediction, so loss_mask[0] must be 0. (A rollout.Trajectory keeps its prompt apart, its loss_mask and
    logprobs over the response only: `of` prepends the prompt's positions, as 0s.)"""
    input_ids: list[int]  # prompt + response: the final, purified tokens
    loss_mask: list[int]  # 1 on tokens the policy sampled, 0 on prompt and tool-output tokens
    advantage: float = 0.0  # from compute_advantages
    # (L,) log-probs under the policy that sampled the batch, recomputed by compute_old_logprobs on the final
    # tokens (as the paper's code does); read only where loss_mask is 1. None is allowed in the first
    # mini-batch of `update`: the policy has not moved there yet, so its own forward pass gives them (and `update`
    # fills them in, for the mismatch monitor)
    old_logp: list[float] | torch.Tensor | None = None
    is_weight: list[float] | torch.Tensor | None = None  # (L,) a weight on each token's loss (mismatch.correct)
    ref_logp: list[float] | torch.Tensor | None = None  # (L,) reference-model log-probs, for kl_coef > 0
    rollout_logp: list[float] | None = None  # (L,) the engine's sampling log-probs (machinery/mismatch.py)
    spliced: list[int] | None = None  # (L,) 1 on tokens SAAR spliced in (rollout.Trajectory.spliced)

    @classmethod
    def of(cls, traj, advantage: float, trained: bool = True) -> TrainSeq:
        """A rollout.Trajectory's record, its prompt not trained on (nothing of it, when not `trained`)."""
        n = len(traj.prompt_ids)
        mask = traj.loss_mask if trained else [0] * len(traj.loss_mask)
        return cls(input_ids=traj.prompt_ids + traj.response_ids, loss_mask=[0] * n + mask, advantage=advantage, rollout_logp=[0.0] * n + traj.logprobs, spliced=[0] * n + traj.spliced)


def every_call_failed(traj) -> bool:
    """--mask-failed's rule (verifiers PR #1416): the trajectory ran tool calls and none succeeded. SAAR's rolled-back
    executions all failed, so with SAAR on too this is: every call left in the trajectory failed."""
    return traj.num_tool_calls > 0 and traj.num_tool_errors == traj.num_tool_calls


# ----------------------------------------------------------------------------- advantages

def compute_advantages(rewards: torch.Tensor | Sequence[float], group_ids: Sequence[Hashable] | None = None, *,
                       group_size: int | None = None, norm_std: bool = True, baseline: str = "group-mean",
                       eps: float = 1e-6) -> tuple[torch.Tensor, dict]:
    """GRPO advantages: reward minus its group's mean (baseline "group-mean"; "leave-one-out": the mean of the
    group's other samples, RLOO's), divided by the group's std if norm_std.

    rewards: (N,). Groups come from group_ids (N hashables, e.g. prompt indices) or from
    group_size (consecutive runs of that many samples). norm_std=False is Dr.GRPO. The std is
    the unbiased one (torch.std), as in veRL. Returns (adv (N,) float32, stats).
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    n = rewards.numel()
    if (group_ids is None) == (group_size is None):
        raise ValueError("compute_advantages: pass exactly one of group_ids or group_size")
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"compute_advantages: {n} rewards do not split into groups of {group_size}")
        group_ids = [i // group_size for i in range(n)]
    if len(group_ids) != n:
        raise ValueError(f"compute_advantages: {len(group_ids)} group_ids for {n} rewards")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"compute_advantages: non-finite rewards at indices {bad[:10]}")

    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    adv = torch.zeros(n)
    n_zero = 0
    for idx in members.values():
        r = rewards[idx]
        # Equal rewards carry no learning signal; set 0 exactly (r - r.mean() can be 1 ulp off).
        if len(idx) == 1 or bool((r == r[0]).all()):
            n_zero += 1
            continue
        a = r - r.mean()
        if baseline == "leave-one-out":  # r - (sum - r) / (k - 1) = k / (k - 1) * (r - mean)
            a = a * len(idx) / (len(idx) - 1)
        if norm_std:
            a = a / (r.std() + eps)
        adv[idx] = a
    stats = {
        "n_groups": len(members),
        "zero_adv_groups": n_zero,
        "zero_adv_frac": n_zero / max(1, len(members)),
        "reward_mean": rewards.mean().item() if n else 0.0,
        "adv_abs_mean": adv.abs().mean().item() if n else 0.0,
    }
    return adv, stats


def groups_with_signal(group_ids: Sequence[Hashable], outcomes: Sequence[Hashable]) -> set:
    """DAPO dynamic sampling's filter: the groups whose outcomes differ (some right, some wrong). A group with
    one outcome has zero advantage under GRPO, so it adds no gradient, only tokens to the update."""
    seen: dict[Hashable, set] = {}
    for g, o in zip(group_ids, outcomes, strict=True):
        seen.setdefault(g, set()).add(o)
    return {g for g, os_ in seen.items() if len(os_) > 1}


# ----------------------------------------------------------------------------- loss

def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float = 0.28, dual_clip_c: float | None = 10.0,
                agg: str = "token-mean", is_weight: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_type: str = "low_var_kl",
                normaliser: float | None = None, max_len: int | None = None,
                seq_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped PPO/GRPO loss over the tokens with mask 1.

    All tensors share one shape: (B, T), each row one sequence; or any shape (e.g. a packed
    (1, N) row) with seq_ids of that shape numbering the sequences 0..S-1 (needed by the
    seq-mean modes). adv is per token (broadcastable, e.g. (B, 1)).
    normaliser: what the aggregation divides by (loss tokens for token-mean, sequences for the
    seq-mean modes); None counts them in these tensors. `update` passes the mini-batch's global
    count, so micro-batch losses sum to the mini-batch loss. max_len: the constant of
    seq-mean-token-sum-norm. Returns (scalar loss, stats of detached 0-dim tensors).
    """
    logp, mask, adv, seq_ids = _flatten(logp, mask, adv, seq_ids, agg=agg, max_len=max_len)
    # Non-loss positions of the inputs may hold anything (NaN included): zero them so that no
    # 0 * NaN reaches the gradient of logp there.
    zero = lambda x: torch.where(mask, x.reshape(-1).detach().float(), 0.0)  # noqa: E731
    old_logp, adv = zero(old_logp), zero(adv)

    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)  # veRL's clamp: exp() stays finite
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    stats = {"clipfrac": _masked_mean((pg2 > pg1).float(), mask),
             "ppo_kl": _masked_mean(-log_ratio.detach(), mask)}
    if dual_clip_c is not None:
        # Dual-clip (Ye et al. 2020): with A < 0 a huge ratio would make the loss unbounded;
        # cap it at -A * c. Positive advantages are already capped by clip_high.
        if dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
        pg3 = -adv * dual_clip_c
        stats["clipfrac_lower"] = _masked_mean(((pg > pg3) & (adv < 0)).float(), mask)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    if is_weight is not None:
        pg = pg * zero(is_weight)
    loss = _aggregate(pg, mask, seq_ids, agg=agg, normaliser=normaliser, max_len=max_len)
    stats["pg_loss"] = loss.detach()
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = _kl(logp, zero(ref_logp), kl_type)
        stats["kl"] = _masked_mean(kl.detach(), mask)
        loss = loss + kl_coef * _aggregate(kl, mask, seq_ids, agg=agg, normaliser=normaliser, max_len=max_len)
    stats["n_tokens"] = mask.sum().detach()
    return loss, stats


def _flatten(logp, mask, adv, seq_ids, *, agg: str, max_len: int | None):
    """policy_loss's inputs checked and flattened to (M,): logp, mask (bool), adv (broadcast to logp), seq_ids
    (made from the rows of a 2-D batch if the aggregation needs them and none are given; else None)."""
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; choose one of {AGG_MODES}")
    if agg == "seq-mean-token-sum-norm" and not max_len:
        raise ValueError("agg='seq-mean-token-sum-norm' needs max_len (Dr.GRPO's constant normaliser)")
    adv = adv.expand_as(logp)
    if seq_ids is None and agg != "token-mean":
        if logp.dim() != 2:
            raise ValueError(f"agg={agg!r} on {logp.dim()}-D tensors needs seq_ids")
        seq_ids = torch.arange(logp.shape[0], device=logp.device)[:, None].expand_as(logp)
    return (logp.reshape(-1), mask.bool().reshape(-1), adv.reshape(-1),
            None if seq_ids is None else seq_ids.reshape(-1))


def _kl(logp: torch.Tensor, ref_logp: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference: Schulman's k1 ("kl") or k3 ("low_var_kl", clamped
    as veRL clamps it)."""
    if kl_type == "kl":
        return logp - ref_logp
    if kl_type == "low_var_kl":
        d = torch.clamp(ref_logp - logp, -20.0, 20.0)
        return torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {KL_TYPES}")


def _aggregate(x: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor | None, *, agg: str,
               normaliser: float | None, max_len: int | None) -> torch.Tensor:
    """Per-token losses x (M,) to one number, as `agg` says (the modes of veRL's agg_loss; see the docstring)."""
    # where (not multiply) so that masked entries contribute an exact 0, NaN or not.
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if agg == "token-mean":
        n = mask.sum().item() if normaliser is None else normaliser
        return x.sum() / max(n, 1)
    n_seq = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    seq_sum = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, seq_ids, x)  # (S,)
    seq_tok = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, seq_ids, mask.to(x.dtype))  # (S,)
    n = n_seq if normaliser is None else normaliser
    if agg == "seq-mean-token-sum":
        return seq_sum.sum() / max(n, 1)
    if agg == "seq-mean-token-mean":
        return (seq_sum / seq_tok.clamp(min=1)).sum() / max(n, 1)
    if agg == "seq-mean-token-sum-norm":
        return seq_sum.sum() / (max(n, 1) * max_len)
    if agg == "verl-token-mean":
        # veRL's dp_actor with dynamic batch sizes: a token-mean inside each micro-batch, weighted by the
        # micro-batch's share of the mini-batch's sequences (n: all ranks' sequences with a loss token). Between
        # token-mean and seq-mean, and it depends on how the micro-batches were cut
        return x.sum() / mask.sum().clamp(min=1) * (seq_tok > 0).sum() / max(n, 1)
    raise ValueError(f"unknown agg {agg!r}; choose one of {AGG_MODES}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def loss_normaliser(mini_batch: Sequence[TrainSeq], agg: str, device: torch.device | str = "cpu") -> float:
    """The mini-batch's global count, summed over ranks: loss tokens (token-mean) or trajectories with one (a
    sequence that mismatch.correct dropped has none)."""
    local = sum(sum(t.loss_mask) if agg == "token-mean" else any(t.loss_mask) for t in mini_batch)
    return precision.over_ranks(float(local), "sum", torch.device(device))


# ----------------------------------------------------------------------------- update

@torch.no_grad()
def compute_old_logprobs(model: torch.nn.Module, batch: Sequence[TrainSeq], how: config.Update, *,
                         temperature: float, autocast_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Log-probs of each trajectory's tokens (list of (L_i,) float32 CPU tensors), no grad: old_logp (the policy
    before the update) or ref_logp (a reference model). Only loss tokens are computed (0 elsewhere). The
    micro-batches (how.max_tokens_per_micro, how.share_prompts) and autocast_dtype are the update's, so that
    old and new log-probs are taken alike."""
    check_batch(batch, old_from=len(batch))
    was_training = model.training
    model.eval()
    device = _device(model)
    out: list[torch.Tensor | None] = [None] * len(batch)
    try:
        for micro in packing.micro_batches(batch, how.max_tokens_per_micro, device,
                                           share=_shares(model, how.share_prompts)):
            with precision.autocast(device, autocast_dtype):
                lp = packing.token_logprobs(model, micro.input_ids, micro.position_ids, mask=micro.loss_mask,
                                            temperature=temperature).cpu()
            if not micro.dummy:
                for i, part in zip(micro.index, micro.per_sequence(lp)):
                    out[i] = part
    finally:
        model.train(was_training)
    return out


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batch: Sequence[TrainSeq],
           cfg: config.Grpo, how: config.Update, *, mini_batch_size: int, max_len: int, temperature: float,
           scaler: precision.LossScaler, autocast_dtype: torch.dtype | None = None) -> dict:
    """One GRPO step: an optimizer step per mini-batch of mini_batch_size trajectories (in order; the paper's
    32 prompts x 16 samples is 512), its gradient accumulated over micro-batches of at most
    how.max_tokens_per_micro tokens. cfg: the loss and the optimizer step; how: how they run (the machinery).
    Under torch.distributed, mini_batch_size counts this rank's trajectories.
    max_len: Dr.GRPO's constant; temperature: the rollout's; scaler: updated in place; autocast_dtype: the
    forward passes under torch.autocast in this dtype (None: the weights' own).
    A mini-batch whose loss (on any rank) or gradient norm is NaN/inf raises NonFiniteLossError before its
    optimizer.step, the gradients zeroed, the mini-batches before it applied; it is skipped instead if it is
    an fp16 overflow under a dynamic scaler, or any one with how.max_nonfinite_skips > 0 (veRL's behaviour).
    Returns this rank's stats: "loss"/"pg_loss" averaged over mini-batches; token-weighted "clipfrac",
    "clipfrac_lower", "ppo_kl", "kl"; "grad_norm(_max)", "lr", "n_mini_batches", "skipped_steps" (overflows),
    "nonfinite_skipped", "nonfinite_trailing" (those ending the step, in a row), "loss_scale", "n_micro_batches",
    "tokens", "shared_tokens" (prompt copies not run), "loss_tokens", "pad_frac", "tokens_per_s".
    """
    if mini_batch_size < 1 or how.max_tokens_per_micro < 1:
        raise ValueError("mini_batch_size and max_tokens_per_micro must be positive")
    check_batch(batch, old_from=mini_batch_size, need_ref=bool(cfg.kl_coef))
    device = _device(model)
    world = dist.get_world_size() if _dist_on() else 1
    share = _shares(model, how.share_prompts)
    model.train()
    _set_checkpointing(model, how.gradient_checkpointing)
    starts = list(range(0, len(batch), mini_batch_size))
    if precision.over_ranks(len(starts), "max", device) != precision.over_ranks(len(starts), "min", device):
        raise ValueError(f"ranks have different numbers of mini-batches (this rank: {len(starts)}); "
                         "give every rank the same number of trajectories")
    t0 = time.perf_counter()
    sums, counts, grad_norms, lrs, trailing = {}, Counter(), [], [], 0
    for k, s in enumerate(starts):
        mini = batch[s:s + mini_batch_size]
        normaliser = loss_normaliser(mini, cfg.agg, device)
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for micro in packing.micro_batches(mini, how.max_tokens_per_micro, device, share=share):
            with precision.autocast(device, autocast_dtype):
                logp = packing.token_logprobs(model, micro.input_ids, micro.position_ids, mask=micro.loss_mask,
                                              temperature=temperature)
            # old log-probs not given (first mini-batch only): the policy has not moved yet, so they are this
            # very forward pass, detached; the ratio is exactly 1 and the gradient that of the surrogate
            old = torch.where(micro.old_known, micro.old_logp, logp.detach())
            if any(mini[i].old_logp is None for i in micro.index):  # the first mini-batch: kept for the monitor
                for i, part in zip(micro.index, micro.per_sequence(old.cpu())):
                    mini[i].old_logp = part if mini[i].old_logp is None else mini[i].old_logp
            loss, st = policy_loss(logp, old, micro.adv, micro.loss_mask, clip_low=cfg.clip_low,
                                   clip_high=cfg.clip_high, dual_clip_c=cfg.dual_clip_c or None, agg=cfg.agg,
                                   is_weight=micro.is_weight, ref_logp=micro.ref_logp, kl_coef=cfg.kl_coef,
                                   kl_type=cfg.kl_type, normaliser=normaliser, max_len=max_len, seq_ids=micro.seq_ids)
            # The gradient reduction averages over ranks; scaling by world turns it into the sum.
            # a loss scale > 1 keeps fp16 activation gradients from underflowing; undone before the clip
            (loss * (0.0 if micro.dummy else float(world) * scaler.scale)).backward()
            if not micro.dummy:
                losses.append((loss.detach(), micro.index))
                _tally(sums, counts, loss, st, micro)
        norm = precision.unscale_and_clip(model, scaler, cfg.grad_clip)
        skip = precision.skip_or_raise(optimizer, scaler, losses, norm, skip_nonfinite=how.max_nonfinite_skips > 0,
                                       device=device, where=(k, s))
        if skip:  # "overflow" (fp16: the scale was halved) or "nonfinite"; the gradients are zeroed
            counts[skip] += 1
            trailing += skip == "nonfinite"
            continue
        lrs.append(optimizer.param_groups[0]["lr"])
        trailing = 0
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        scaler.stepped()
        grad_norms.append(norm.item())
    return _summary(sums, counts, grad_norms, lrs, trailing, n_mini=len(starts), optimizer=optimizer,
                    scaler=scaler, seconds=time.perf_counter() - t0)


def _tally(sums: dict, counts: Counter, loss: torch.Tensor, st: dict, micro: packing.MicroBatch) -> None:
    """Add a micro-batch's stats: token-weighted (pg_loss and loss as they are) to sums, sizes to counts."""
    w = st["n_tokens"].item()
    for key, v in st.items():
        if key != "n_tokens":
            sums[key] = sums.get(key, 0.0) + v.item() * (w if key != "pg_loss" else 1.0)
    sums["loss_tokens"] = sums.get("loss_tokens", 0.0) + w
    sums["loss"] = sums.get("loss", 0.0) + loss.item()
    counts.update(n_micro_batches=1, tokens=sum(micro.lengths), shared_tokens=sum(micro.shared or []),
                  slots=micro.n_slots)


def _summary(sums: dict, counts: Counter, grad_norms: list, lrs: list, trailing: int, *, n_mini: int,
             optimizer, scaler: precision.LossScaler, seconds: float) -> dict:
    tok = max(sums.pop("loss_tokens", 0.0), 1.0)
    stats = {key: v / tok for key, v in sums.items() if key not in ("pg_loss", "loss")}
    n = max(1, n_mini)
    stats.update(
        loss=sums.get("loss", 0.0) / n, pg_loss=sums.get("pg_loss", 0.0) / n,
        grad_norm=sum(grad_norms) / max(1, len(grad_norms)), grad_norm_max=max(grad_norms, default=0.0),
        lr=lrs[-1] if lrs else optimizer.param_groups[0]["lr"],  # the lr of the last step taken
        n_mini_batches=n_mini, skipped_steps=counts["overflow"], nonfinite_skipped=counts["nonfinite"],
        nonfinite_trailing=trailing, loss_scale=scaler.scale, n_micro_batches=counts["n_micro_batches"],
        tokens=counts["tokens"], shared_tokens=counts["shared_tokens"], loss_tokens=int(tok),
        pad_frac=1.0 - (counts["tokens"] - counts["shared_tokens"]) / max(1, counts["slots"]),
        tokens_per_s=counts["tokens"] / max(seconds, 1e-9))
    return stats


def check_batch(batch: Sequence[TrainSeq], *, old_from: int = 0, need_ref: bool = False) -> None:
    """Raise ValueError naming the trajectory and field of the first malformed entry. old_logp may be None only
    before index old_from (update: in the first mini-batch, where the policy has not moved yet)."""
    for i, t in enumerate(batch):
        n = len(t.input_ids)
        if n < 2:
            raise ValueError(f"trajectory {i}: input_ids has {n} tokens; need a prompt and a response")
        if len(t.loss_mask) != n:
            raise ValueError(f"trajectory {i}: loss_mask has {len(t.loss_mask)} entries, input_ids has {n}")
        if any(m not in (0, 1) for m in t.loss_mask):
            raise ValueError(f"trajectory {i}: loss_mask must hold only 0 and 1")
        if t.loss_mask[0]:
            raise ValueError(f"trajectory {i}: loss_mask[0] is 1, but the first token has no prediction")
        if not math.isfinite(float(t.advantage)):
            raise ValueError(f"trajectory {i}: advantage is {t.advantage}")
        if i >= old_from and t.old_logp is None:
            raise ValueError(f"trajectory {i}: old_logp is missing" + (" outside the first mini-batch, where the "
                             "policy has already moved" if old_from else "") + "; fill it with compute_old_logprobs")
        if need_ref and t.ref_logp is None:
            raise ValueError(f"trajectory {i}: ref_logp is missing but kl_coef > 0")
        for name in ("old_logp", "is_weight", "ref_logp"):
            v = getattr(t, name)
            if v is not None and torch.as_tensor(v).numel() != n:
                raise ValueError(f"trajectory {i}: {name} has {torch.as_tensor(v).numel()} entries, input_ids has {n}")


# ----------------------------------------------------------------------------- optimizer, layers, helpers

def warmup_lambda(warmup_steps: int, from_zero: bool = False) -> Callable[[int], float]:
    """LR multiplier for LambdaLR: linear warmup over warmup_steps scheduler steps, then 1.

    Ours starts at 1/warmup_steps, so the first step already moves the weights. from_zero is veRL's constant
    schedule with warmup (multiplier step/warmup_steps): its first step has lr 0."""
    return lambda step: min(1.0, (step + (0 if from_zero else 1)) / max(1, warmup_steps))


def make_optimizer(model: torch.nn.Module, *, lr: float = 2e-6, weight_decay: float = 0.01,
                   betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 20, from_zero: bool = False):
    """AdamW (veRL's defaults; the paper's lr 2e-6, 20 warmup steps) and its warmup scheduler."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            betas=betas, weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_lambda(warmup_steps, from_zero))


def _set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    # transformers 5.0 has gradient_checkpointing_*; later 5.x releases renamed them activation_checkpointing_*
    # and deprecated the old names (removed in 6)
    new = hasattr(model, "activation_checkpointing_enable")
    if on == (model.is_activation_checkpointing if new else model.is_gradient_checkpointing):
        return
    if on:
        enable = model.activation_checkpointing_enable if new else model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    else:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()


def _shares(model: torch.nn.Module, share_prompts: bool) -> bool:
    """Shared-prompt packing needs packing's sdpa, the one attention here that reads its branches."""
    return share_prompts and getattr(model.config, "_attn_implementation", None) == packing.PACKED_SDPA


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()
