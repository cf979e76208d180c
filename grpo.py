"""GRPO: group-relative advantages, the clipped policy loss, chunked log-probs, packing, the update.

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

Data layout. `update` and `compute_old_logprobs` take a batch: a list of `TrainSeq`:
    input_ids  list[int]   prompt + response (the final, purified tokens), length L
    loss_mask  list[int]   1 on tokens the policy sampled, 0 on prompt and tool-output tokens
    advantage  float       the trajectory's advantage (from `compute_advantages`)
    old_logp   (L,) | None log-prob of each token under the policy that sampled the batch, as
                           recomputed by `compute_old_logprobs` on the final tokens (the paper's
                           code recomputes them too); read only where loss_mask is 1. None is
                           allowed in the first mini-batch of `update`: the policy has not moved
                           yet there, so the update's own forward pass gives them (detached),
                           exactly, and the separate pass is saved
    is_weight  (L,) | None per-token importance weight (SAAR's truncated IS weight on replaced
                           tokens, 1 elsewhere); detached, multiplies the policy loss
    ref_logp   (L,) | None reference-model log-probs, needed only when kl_coef > 0
Every per-token field is aligned with input_ids: entry t belongs to token t (the log-prob of
token t given tokens < t). Entry 0 has no prediction, so loss_mask[0] must be 0.

Micro-batches are packed: several trajectories concatenated into one row with position_ids
restarting at 0 for each, attention_mask None. transformers (5.x) detects the packing from
position_ids (`masking_utils.find_packed_sequence_indices`) and builds a block-diagonal causal
mask for sdpa/eager; flash-attention uses varlen kernels, so there is no padding at all. With
that mask, sdpa still computes every query against every key of the row, (row length)^2 work,
most of it masked away; `packed_attention` gives a model an sdpa that runs each sequence of a
packed row alone (varlen, as flash-attention does), which train.py and sft.py use.
A GRPO group's samples share their prompt. With share_prompts (and `packed_attention`), consecutive
trajectories with the same prompt are packed behind one copy of it: the first whole, each other one
from its first response token on, its positions going on from the prompt's length, and its queries
attending to that prompt and to itself (a tree, as in prefix-sharing trainers). Prompt tokens carry no
loss, so this is the same loss and gradient, up to float rounding, for fewer tokens: a
SmolLM2-135M demo step trains on about 30% fewer.
Distributed: run under torchrun with the model wrapped by FSDP2 `fully_shard` (the decoder layers,
then the root); each rank holds its own share of the trajectories. FSDP's gradient reduction
averages over ranks, so each rank scales its loss by the world size; with the global normaliser
the sum over ranks is exactly the one-process gradient. Ranks also run equal numbers of
micro-batches (empty ones run as zero-weight dummies), since every forward has collectives.
"""
from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "verl-token-mean")
KL_TYPES = ("kl", "low_var_kl")  # veRL's names for Schulman's k1 and k3 estimators


@dataclass
class LossScaler:
    """Loss scaling for fp16 training, in the manner of torch.amp.GradScaler. The loss is multiplied by
    `scale` before backward, so that small fp16 gradients do not underflow, and the gradients are
    divided by it again before the clip. Static when growth_interval is 0. Dynamic otherwise: a
    mini-batch whose losses are finite but whose gradient is not has overflowed in fp16, so its
    optimizer step is skipped and the scale halved; after growth_interval good steps in a row the
    scale doubles. A non-finite gradient at min_scale is not an overflow: it stops the update."""
    scale: float = 1.0
    growth_interval: int = 0
    min_scale: float = 1.0
    good_steps: int = 0
    skipped_steps: int = 0

    def can_skip(self) -> bool:
        return self.growth_interval > 0 and self.scale > self.min_scale

    def overflowed(self) -> None:
        self.scale, self.good_steps, self.skipped_steps = max(self.scale / 2, self.min_scale), 0, self.skipped_steps + 1

    def stepped(self) -> None:
        self.good_steps += 1
        if self.growth_interval > 0 and self.good_steps >= self.growth_interval:
            self.scale, self.good_steps = self.scale * 2, 0


class NonFiniteLossError(RuntimeError):
    """A NaN/inf loss or gradient; raised before optimizer.step, with the gradients zeroed."""


@dataclass
class TrainSeq:
    """One sequence of the update, built from a rollout.Trajectory: prompt and response joined into one token
    list, with every per-token field over the whole of it (the layout above). A rollout.Trajectory keeps its
    prompt apart and its loss_mask and logprobs cover the response only; here the prompt's positions are in
    the mask, as 0s (train.py prepends them)."""
    input_ids: list[int]
    loss_mask: list[int]
    advantage: float = 0.0
    old_logp: list[float] | torch.Tensor | None = None
    is_weight: list[float] | torch.Tensor | None = None
    ref_logp: list[float] | torch.Tensor | None = None


# ----------------------------------------------------------------------------- advantages

def compute_advantages(rewards: torch.Tensor | Sequence[float], group_ids: Sequence[Hashable] | None = None, *,
                       group_size: int | None = None, norm_std: bool = True,
                       eps: float = 1e-6) -> tuple[torch.Tensor, dict]:
    """GRPO advantages: reward minus its group's mean, divided by the group's std if norm_std.

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

def _aggregate(x: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor | None, *, agg: str,
               normaliser: float | None, max_len: int | None) -> torch.Tensor:
    # where (not multiply) so that masked entries contribute an exact 0, NaN or not.
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if agg == "token-mean":
        n = mask.sum().item() if normaliser is None else normaliser
        return x.sum() / max(n, 1)
    n_seq = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    seq_sum = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, seq_ids, x)  # (S,)
    n = n_seq if normaliser is None else normaliser
    if agg == "seq-mean-token-sum":
        return seq_sum.sum() / max(n, 1)
    if agg == "seq-mean-token-mean":
        seq_tok = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, seq_ids, mask.to(x.dtype))
        return (seq_sum / seq_tok.clamp(min=1)).sum() / max(n, 1)
    if agg == "seq-mean-token-sum-norm":
        return seq_sum.sum() / (max(n, 1) * max_len)
    if agg == "verl-token-mean":
        # veRL's dp_actor with dynamic batch sizes: a token-mean inside each micro-batch, weighted by the
        # micro-batch's share of the mini-batch's sequences (n: all ranks' sequences). Between token-mean and
        # seq-mean, and it depends on how the micro-batches were cut
        return x.sum() / mask.sum().clamp(min=1) * n_seq / max(n, 1)
    raise ValueError(f"unknown agg {agg!r}; choose one of {AGG_MODES}")


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
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; choose one of {AGG_MODES}")
    if agg == "seq-mean-token-sum-norm" and not max_len:
        raise ValueError("agg='seq-mean-token-sum-norm' needs max_len (Dr.GRPO's constant normaliser)")
    mask = mask.bool()
    adv = adv.expand_as(logp)
    if seq_ids is None and agg != "token-mean":
        if logp.dim() != 2:
            raise ValueError(f"agg={agg!r} on {logp.dim()}-D tensors needs seq_ids")
        seq_ids = torch.arange(logp.shape[0], device=logp.device)[:, None].expand_as(logp)
    if seq_ids is not None:
        seq_ids = seq_ids.reshape(-1)
    flat = lambda x: x.reshape(-1)  # noqa: E731
    logp, mask, adv = flat(logp), flat(mask), flat(adv)
    # Non-loss positions of the inputs may hold anything (NaN included): zero them so that no
    # 0 * NaN reaches the gradient of logp there.
    zero = lambda x: torch.where(mask, flat(x).detach().float(), 0.0)  # noqa: E731
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
        ref_logp = zero(ref_logp)
        if kl_type == "kl":
            kl = logp - ref_logp
        elif kl_type == "low_var_kl":
            d = torch.clamp(ref_logp - logp, -20.0, 20.0)
            kl = torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
        else:
            raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {KL_TYPES}")
        kl_loss = _aggregate(kl, mask, seq_ids, agg=agg, normaliser=normaliser, max_len=max_len)
        stats["kl"] = _masked_mean(kl.detach(), mask)
        loss = loss + kl_coef * kl_loss
    stats["n_tokens"] = mask.sum().detach()
    return loss, stats


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------- log-probs

def _chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = F.linear(h, weight, bias).float() / temperature  # (C, V): one chunk only
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, *,
                   attention_mask: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                   chunk_size: int = 1024, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs (B, T) float32 of a Hugging Face causal LM, differentiable.

    input_ids, position_ids: (B, T); a packed row has position_ids restarting at 0 for each
    sequence and attention_mask None; padded rows are right-padded with attention_mask (B, T).
    out[b, t] = log p(input_ids[b, t] | the earlier tokens of its sequence); 0 at sequence starts
    (position 0) and, if mask (B, T) is given, wherever mask is 0 (not computed at all).
    The decoder body runs once; lm_head is applied chunk_size tokens at a time under activation
    checkpointing, so no (T, vocab) logits tensor exists, in forward or backward.
    """
    # The full model is called (not model.model) so FSDP2's root hooks gather lm_head/embeddings;
    # logits_to_keep=1 makes its own lm_head call cost one row, and a hook takes the hidden states.
    captured = {}
    hook = model.get_decoder().register_forward_hook(lambda mod, args, out: captured.__setitem__("h", out[0]))
    try:
        model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
              use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    h = captured["h"]  # (B, T, H)
    want = position_ids > 0
    if mask is not None:
        want = want & mask.bool()
    rows, cols = want.nonzero(as_tuple=True)  # (M,), (M,)
    h_prev = h[rows, _predecessors(position_ids)[rows, cols]]  # (M, H): the state before token t predicts token t
    targets = input_ids[rows, cols]  # (M,)
    head = model.get_output_embeddings()
    parts = []
    for s in range(0, targets.numel(), chunk_size):
        args = (h_prev[s:s + chunk_size], head.weight, head.bias, targets[s:s + chunk_size], temperature)
        if torch.is_grad_enabled():
            # Backward recomputes this chunk's logits instead of keeping them.
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not parts:
        return out + 0.0 * h.sum()  # keeps the graph connected (FSDP backward must still run)
    return out.index_put((rows, cols), torch.cat(parts))


def _predecessors(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): the index of the token before each one in its sequence: t - 1, except for the first
    token of a shared-prompt branch (its position is not one more than the previous token's), whose
    predecessor is the prompt's last token, at (the index where its run's first position 0 is) + position - 1."""
    T = position_ids.shape[1]
    idx = torch.arange(T, device=position_ids.device).expand_as(position_ids)
    run = torch.cummax(torch.where(position_ids == 0, idx, 0), dim=1).values  # (B, T): where each run starts
    jump = torch.ones_like(position_ids, dtype=torch.bool)
    jump[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return torch.where(jump & (position_ids > 0), run + position_ids - 1, idx - 1)


# ----------------------------------------------------------------------------- packing

PACKED_SDPA = "sdpa_packed"  # the attention implementation name `packed_attention` registers


def _packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_ids=None, **kwargs):
    """transformers attention function: sdpa, but a packed row (batch 1, no cache, position_ids starting at 0 and
    jumping somewhere) runs one sdpa per segment, without the row's block-diagonal mask. A segment starting at
    position 0 is a sequence, causal on itself; one starting at position p > 0 is a shared-prompt branch, whose
    queries see the first p tokens of the last sequence (the prompt) and, causally, themselves. Anything else
    (padded rows, prefill, decode with its cache) goes to transformers' own sdpa unchanged.
    query (1, H, T, D), key/value (1, Hkv, T, D) -> (1, T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    T = query.shape[2]
    cuts = None
    if (query.shape[0] == 1 and T > 1 and key.shape[2] == T and position_ids is not None
            and position_ids.dim() == 2 and getattr(module, "sliding_window", None) is None
            and kwargs.get("softcap") is None and kwargs.get("position_bias") is None and position_ids[0, 0] == 0):
        pos = position_ids[0]
        cuts = ((pos[1:] != pos[:-1] + 1).nonzero()[:, 0] + 1).tolist()  # where segments start, after the first
    if not cuts:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    bounds, firsts = [0] + cuts + [T], [0] + pos[cuts].tolist()  # segment starts, and their first positions
    out, run = [], 0  # run: where the last sequence (position 0) starts
    for a, b, p in zip(bounds, bounds[1:], firsts):
        if p == 0:
            run = a
            out.append(F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b],
                                                      dropout_p=dropout, scale=scaling, is_causal=True,
                                                      enable_gqa=gqa))  # (1, H, b - a, D)
            continue
        k = torch.cat([key[:, :, run:run + p], key[:, :, a:b]], 2)  # (1, Hkv, p + b - a, D): prompt, then branch
        v = torch.cat([value[:, :, run:run + p], value[:, :, a:b]], 2)
        see = torch.ones(b - a, p + b - a, dtype=torch.bool, device=query.device).tril(p)  # the prompt, causal after
        out.append(F.scaled_dot_product_attention(query[:, :, a:b], k, v, attn_mask=see, dropout_p=dropout,
                                                  scale=scaling, enable_gqa=gqa))
    return torch.cat(out, 2).transpose(1, 2).contiguous(), None


def packed_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model that uses "sdpa" to `_packed_sdpa` (the same sdpa, sequence by sequence
    in packed rows). Why: sdpa under the block-diagonal mask of a packed row computes all (row length)^2
    query-key pairs; one sequence at a time computes only the pairs inside each. On 2 CPU cores, SmolLM2-135M's
    forward and backward over a 3835-token row of 8 trajectories went from 22.3 s to 13.1 s. Returns whether the
    model was switched (other implementations, e.g. flash-attention's varlen kernels, are left alone)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(PACKED_SDPA, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # padded rows and decode keep sdpa's masks
    model.set_attn_implementation(PACKED_SDPA)
    return True


def pack(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing: indices into lengths, each bin summing to <= max_tokens."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > max_tokens:
            raise ValueError(f"trajectory {i} has {lengths[i]} tokens, more than max_tokens_per_micro="
                             f"{max_tokens}; raise it to at least the longest trajectory")
        for b in range(len(bins)):
            if room[b] >= lengths[i]:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_tokens - lengths[i])
    return bins


def _pad_groups(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    # The padded baseline: consecutive trajectories, rows * longest <= max_tokens.
    bins: list[list[int]] = []
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(f"trajectory {i} has {n} tokens, more than max_tokens_per_micro={max_tokens}")
        if bins and (len(bins[-1]) + 1) * max(n, *(lengths[j] for j in bins[-1])) <= max_tokens:
            bins[-1].append(i)
        else:
            bins.append([i])
    return bins


def _split_to(bins: list[list[int]], k: int, lengths: Sequence[int]) -> list[list[int]]:
    # FSDP ranks must run the same number of forwards: split the heaviest multi-item bins
    # (never exceeding the budget), then add empty bins, which run as zero-weight dummies.
    bins = [list(b) for b in bins]
    while len(bins) < k:
        splittable = [b for b in bins if len(b) > 1]
        if not splittable:
            bins.append([])
            continue
        b = max(splittable, key=lambda b: sum(lengths[i] for i in b))
        bins.append(b[len(b) // 2:])
        del b[len(b) // 2:]
    return bins


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(x: float, op: str, device: torch.device) -> float:
    """x summed/maxed/minned over ranks; x itself when not distributed."""
    if not _dist_on():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.item()


def shared_prompts(trajs: Sequence[TrainSeq]) -> list[int]:
    """How many leading tokens each trajectory shares with the first of its run (0: it starts a run). A run is
    consecutive trajectories with the same prompt, its first's tokens before its first loss token, outside the
    loss in each of them too (a GRPO group's samples, as train.py orders them)."""
    out, first, P = [], None, 0
    for t in trajs:
        ids = torch.as_tensor(t.input_ids)
        if (first is not None and len(ids) > P and torch.equal(ids[:P], first[:P])
                and not torch.as_tensor(t.loss_mask[:P]).any()):
            out.append(P)
            continue
        first, m = ids, torch.as_tensor(t.loss_mask).nonzero()
        P = int(m[0, 0]) if m.numel() else len(ids)
        out.append(0)
    return out


def _pack_runs(lengths: Sequence[int], shared: Sequence[int], max_tokens: int) -> list[list[int]]:
    """`pack`, with each run of shared-prompt trajectories kept together, costing its tokens behind one prompt
    (a run over max_tokens is cut into consecutive pieces, each with its own copy of the prompt)."""
    units, cost = [], []
    for i, (n, s) in enumerate(zip(lengths, shared)):
        if s and units and cost[-1] + n - s <= max_tokens:
            units[-1].append(i)
            cost[-1] += n - s
        else:
            units.append([i])
            cost.append(n)
    return [[i for u in b for i in units[u]] for b in pack(cost, max_tokens)]


def _plan(lengths: Sequence[int], max_tokens: int, packed: bool, device: torch.device,
          shared: Sequence[int] | None = None) -> list[list[int]]:
    if packed:
        bins = _pack_runs(lengths, shared, max_tokens) if shared and any(shared) else pack(lengths, max_tokens)
    else:
        bins = _pad_groups(lengths, max_tokens)
    return _split_to(bins, int(_all_reduce(len(bins), "max", device)), lengths)


def _shares(model: torch.nn.Module, share_prompts: bool, packed: bool) -> bool:
    """Shared-prompt packing needs `_packed_sdpa`, the one attention here that reads its branches."""
    return share_prompts and packed and getattr(model.config, "_attn_implementation", None) == PACKED_SDPA


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (R, L) long
    position_ids: torch.Tensor  # (R, L) long
    attention_mask: torch.Tensor | None  # (R, L), None when packed
    seq_ids: torch.Tensor  # (R, L): which trajectory of the micro-batch each slot holds (a shared prompt: the first's)
    loss_mask: torch.Tensor  # (R, L) bool, 0 on padding
    old_logp: torch.Tensor  # (R, L) float32, 0 where old_known is False
    old_known: torch.Tensor  # (R, L) bool: the trajectory came with old_logp
    adv: torch.Tensor  # (R, L) float32
    is_weight: torch.Tensor | None  # (R, L) float32
    ref_logp: torch.Tensor | None  # (R, L) float32
    lengths: list[int]  # each trajectory's tokens
    n_slots: int  # R * L, real tokens + padding
    shared: list[int] | None = None  # packed with share=True: the prompt tokens each shares (`shared_prompts`)


def _field(t: TrainSeq, name: str, i: int) -> torch.Tensor | None:
    v = getattr(t, name)
    if v is None:
        return None
    v = torch.as_tensor(v, dtype=torch.float32).flatten().cpu()
    if v.numel() != len(t.input_ids):
        raise ValueError(f"trajectory {i}: {name} has {v.numel()} entries, input_ids has {len(t.input_ids)}")
    return v


def collate(trajs: Sequence[TrainSeq], *, packed: bool = True, device: torch.device | str = "cpu",
            pad_id: int = 0, share: bool = False) -> MicroBatch:
    """Build one micro-batch: a single packed (1, N) row, or right-padded (R, L) rows. share (packed only): a
    trajectory that shares its run's prompt (`shared_prompts`) enters from its first token after it."""
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("ids", "pos", "seq", "mask", "old", "known", "adv", "isw",
                                                           "ref")}
    has_isw = any(t.is_weight is not None for t in trajs)
    has_ref = all(t.ref_logp is not None for t in trajs)
    shared = shared_prompts(trajs) if packed and share else [0] * len(trajs)
    for k, (t, s) in enumerate(zip(trajs, shared)):
        n = len(t.input_ids)
        cols["ids"].append(torch.tensor(t.input_ids, dtype=torch.long)[s:])
        cols["pos"].append(torch.arange(s, n))
        cols["seq"].append(torch.full((n - s,), k))
        cols["mask"].append(torch.tensor(t.loss_mask, dtype=torch.bool)[s:])
        old = _field(t, "old_logp", k)
        cols["old"].append(old[s:] if old is not None else torch.zeros(n - s))
        cols["known"].append(torch.full((n - s,), old is not None))
        cols["adv"].append(torch.full((n - s,), float(t.advantage)))
        isw = _field(t, "is_weight", k)
        cols["isw"].append(isw[s:] if isw is not None else torch.ones(n - s))
        ref = _field(t, "ref_logp", k)
        cols["ref"].append(ref[s:] if ref is not None else torch.zeros(n - s))
    lengths = [len(t.input_ids) for t in trajs]
    if packed:
        out = {k: torch.cat(v)[None] for k, v in cols.items()}  # (1, N)
        attn = None
    else:
        L = max(lengths)
        fill = {"ids": pad_id, "pos": 0, "seq": 0, "mask": False, "old": 0.0, "known": True, "adv": 0.0, "isw": 1.0,
                "ref": 0.0}
        out = {k: torch.stack([F.pad(x, (0, L - x.numel()), value=fill[k]) for x in v]) for k, v in cols.items()}
        out["pos"] = torch.arange(L).expand(len(trajs), L).contiguous()
        out["seq"] = torch.arange(len(trajs))[:, None].expand(len(trajs), L).contiguous()
        attn = torch.stack([torch.arange(L) < n for n in lengths]).long().to(device)
    out = {k: v.to(device, non_blocking=True) for k, v in out.items()}
    return MicroBatch(
        input_ids=out["ids"], position_ids=out["pos"], attention_mask=attn, seq_ids=out["seq"],
        loss_mask=out["mask"], old_logp=out["old"], old_known=out["known"], adv=out["adv"],
        is_weight=out["isw"] if has_isw else None, ref_logp=out["ref"] if has_ref else None,
        lengths=lengths, n_slots=out["ids"].numel(), shared=shared if any(shared) else None)


def _rows_to_seqs(x: torch.Tensor, mb: MicroBatch, packed: bool) -> list[torch.Tensor]:
    """Per-token values of a micro-batch, x (1, N) packed or (R, L) padded, back to one (L_i,) tensor per sequence
    (a shared prompt's positions, which carry no loss, as 0)."""
    if packed and mb.shared:
        parts = x[0].split([n - s for n, s in zip(mb.lengths, mb.shared)])
        return [torch.cat([p.new_zeros(s), p]) for p, s in zip(parts, mb.shared)]
    if packed:
        return list(x[0].split(mb.lengths))
    return [x[r, :n] for r, n in enumerate(mb.lengths)]


def check_batch(batch: Sequence[TrainSeq], *, need_old: bool = True, need_ref: bool = False) -> None:
    """Raise ValueError naming the trajectory and field of the first malformed entry."""
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
        if need_old and t.old_logp is None:
            raise ValueError(f"trajectory {i}: old_logp is missing; fill it with compute_old_logprobs")
        if need_ref and t.ref_logp is None:
            raise ValueError(f"trajectory {i}: ref_logp is missing but kl_coef > 0")
        for name in ("old_logp", "is_weight", "ref_logp"):
            _field(t, name, i)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision for one forward pass: matmuls in `dtype`, the fp32 weights and optimizer state kept (the
    single-process analogue of FSDP2's MixedPrecisionPolicy). None: no autocast, everything in the weights' dtype."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


@torch.no_grad()
def compute_old_logprobs(model: torch.nn.Module, batch: Sequence[TrainSeq], *, max_tokens_per_micro: int,
                         chunk_size: int = 1024, temperature: float = 1.0,
                         autocast_dtype: torch.dtype | None = None, packed: bool = True,
                         share_prompts: bool = True) -> list[torch.Tensor]:
    """Log-probs of each trajectory's tokens (list of (L_i,) float32 CPU tensors), no grad.

    Only loss tokens are computed (0 elsewhere). Used for old_logp (the current policy, before
    the update) and for ref_logp (a reference model). autocast_dtype: compute the forward in this
    dtype (torch.autocast), as the update does, so that old and new log-probs are taken alike; packed,
    share_prompts: as `update`'s (packed=False: right-padded rows).
    """
    check_batch(batch, need_old=False)
    was_training = model.training
    model.eval()
    device = _device(model)
    lengths = [len(t.input_ids) for t in batch]
    share = _shares(model, share_prompts, packed)
    out: list[torch.Tensor | None] = [None] * len(batch)
    try:
        for idx in _plan(lengths, max_tokens_per_micro, packed, device, shared_prompts(batch) if share else None):
            dummy = not idx
            mb = collate([batch[i] for i in (idx or [0])], packed=packed, device=device, share=share)
            with _autocast(device, autocast_dtype):
                lp = token_logprobs(model, mb.input_ids, mb.position_ids, attention_mask=mb.attention_mask,
                                    mask=mb.loss_mask, chunk_size=chunk_size, temperature=temperature).cpu()
            if not dummy:
                for i, part in zip(idx, _rows_to_seqs(lp, mb, packed)):
                    out[i] = part
    finally:
        model.train(was_training)
    return out


# ----------------------------------------------------------------------------- update

def warmup_lambda(warmup_steps: int, from_zero: bool = False) -> Callable[[int], float]:
    """LR multiplier for LambdaLR: linear warmup over warmup_steps scheduler steps, then 1.

    Ours starts at 1/warmup_steps, so the first step already moves the weights. from_zero is veRL's constant
    schedule with warmup (multiplier step/warmup_steps): its first step has lr 0."""
    if from_zero:
        return lambda step: min(1.0, step / max(1, warmup_steps))
    return lambda step: min(1.0, (step + 1) / max(1, warmup_steps))


def make_optimizer(model: torch.nn.Module, *, lr: float = 2e-6, weight_decay: float = 0.01,
                   betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 20, from_zero: bool = False):
    """AdamW (veRL's defaults; the paper's lr 2e-6, 20 warmup steps) and its warmup scheduler."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            betas=betas, weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_lambda(warmup_steps, from_zero))


def loss_normaliser(mini_batch: Sequence[TrainSeq], agg: str, device: torch.device | str = "cpu") -> float:
    """The mini-batch's global count, summed over ranks: loss tokens (token-mean) or trajectories."""
    local = sum(sum(t.loss_mask) for t in mini_batch) if agg == "token-mean" else len(mini_batch)  # else: sequences
    return _all_reduce(float(local), "sum", torch.device(device))


def freeze_below(model: torch.nn.Module, train_layers: int) -> None:
    """Train only the top `train_layers` decoder layers and the final norm (0, or at least as many as the model
    has: everything trains, embeddings included).

    The frozen bottom gets no backward pass at all (its outputs need no grad), so a step costs about
    forward + 2 x (share trained) forwards; the optimizer must be built after this, on the trainable params.
    """
    decoder = model.get_decoder()
    if train_layers > 0 and (not hasattr(decoder, "layers") or not hasattr(decoder, "norm")):
        raise ValueError(f"train_layers={train_layers}: {type(model).__name__} has no decoder .layers/.norm; "
                         "use train_layers=0")
    every = train_layers <= 0 or train_layers >= len(decoder.layers)
    model.requires_grad_(every)
    if every:
        return
    for layer in decoder.layers[-train_layers:]:
        layer.requires_grad_(True)
    decoder.norm.requires_grad_(True)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model: torch.nn.Module, rank: int, alpha: float, train_layers: int = 0) -> None:
    """LoRA adapters (the peft library) on every linear layer of the top `train_layers` decoder layers (0: all
    layers); only the adapters train. A departure from the paper, which trains all weights: the frozen weights
    get no weight gradient (about a third fewer FLOPs per trained token) and the optimizer keeps state for the
    adapters alone. The adapters start at zero (B = 0), so the policy starts as the warm start. They are
    injected in place: the model keeps its class and its forward, so the engine and the update use it as is;
    `merge_lora` gives plain weights for an engine copy or a saved folder."""
    from peft import LoraConfig, inject_adapter_in_model
    n = len(model.get_decoder().layers)
    layers = list(range(n - train_layers, n)) if 0 < train_layers < n else list(range(n))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                                       layers_to_transform=layers), model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def merge_lora(state: dict, scale: float) -> dict:
    """A LoRA model's state dict (add_lora) as the plain model's: W + scale * B @ A under W's own name, the
    adapters dropped. scale = alpha / rank. A state without adapters comes back unchanged."""
    out = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if key.endswith(".base_layer.weight"):
            prefix = key[:-len(".base_layer.weight")]
            a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]  # (r, in), (out, r)
            value = (value.float() + scale * (b.float() @ a.float())).to(value.dtype)
        out[key.replace(".base_layer.", ".")] = value
    return out


def _set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    # transformers 5.x renamed gradient_checkpointing_* to activation_checkpointing_*.
    if hasattr(model, "activation_checkpointing_enable"):
        if on != model.is_activation_checkpointing:
            if on:
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.activation_checkpointing_disable()
    elif on != model.is_gradient_checkpointing:
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batch: Sequence[TrainSeq], *,
           mini_batch_size: int, max_tokens_per_micro: int, grad_clip: float | None = 1.0,
           agg: str = "token-mean", max_len: int | None = None, clip_low: float = 0.2, clip_high: float = 0.28,
           dual_clip_c: float | None = 10.0, kl_coef: float = 0.0, kl_type: str = "low_var_kl",
           temperature: float = 1.0, chunk_size: int = 1024, packed: bool = True,
           gradient_checkpointing: bool = False, loss_scale: "float | LossScaler" = 1.0,
           skip_nonfinite: bool = False, autocast_dtype: torch.dtype | None = None,
           share_prompts: bool = True) -> dict:
    """One GRPO step: an optimizer step per mini-batch of mini_batch_size trajectories (in order).

    Each mini-batch is cut into micro-batches of at most max_tokens_per_micro tokens (packed rows
    by first-fit-decreasing; packed=False gives right-padded rows, the baseline of the bench),
    whose gradients accumulate. The paper's mini-batch of 32 prompts x 16 samples is
    mini_batch_size=512. Under torch.distributed, mini_batch_size counts this rank's trajectories
    and every rank must have the same number of mini-batches.
    Raises NonFiniteLossError, with the gradients zeroed, before the optimizer.step of a
    mini-batch whose loss (on any rank) or gradient norm is NaN/inf; the mini-batches before it
    have been applied, so the weights are those of the last good step. The one exception is an fp16
    overflow under a dynamic LossScaler (`loss_scale`, updated in place): that mini-batch is skipped. With
    skip_nonfinite (veRL's behaviour), every non-finite mini-batch is skipped instead of raising, and counted
    in "nonfinite_skipped" (and "nonfinite_trailing": how many of them end the step, in a row).
    autocast_dtype: forward passes under torch.autocast in this dtype (mixed precision over fp32 weights;
    the backward follows the forward's dtypes); None: in the weights' own dtype.
    share_prompts: pack a run of trajectories with the same prompt behind one copy of it (see the module
    docstring; only with packed rows and `packed_attention`'s sdpa, else ignored).
    Returns stats (this rank's): "loss"/"pg_loss" averaged over mini-batches; token-weighted means
    of "clipfrac", "clipfrac_lower", "ppo_kl", "kl"; "grad_norm(_max)", "lr", "n_mini_batches", "skipped_steps", "loss_scale",
    "n_micro_batches", "tokens" (the trajectories'), "shared_tokens" (prompt copies not run), "loss_tokens",
    "pad_frac", "tokens_per_s" (the trajectories' tokens a second).
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; choose one of {AGG_MODES}")
    if mini_batch_size < 1 or max_tokens_per_micro < 1:
        raise ValueError("mini_batch_size and max_tokens_per_micro must be positive")
    check_batch(batch, need_old=False, need_ref=bool(kl_coef))
    missing = [i for i, t in enumerate(batch) if t.old_logp is None and i >= mini_batch_size]
    if missing:
        raise ValueError(f"trajectory {missing[0]}: old_logp is missing outside the first mini-batch, where the "
                         "policy has already moved; fill it with compute_old_logprobs before the update")
    device = _device(model)
    world = dist.get_world_size() if _dist_on() else 1
    share = _shares(model, share_prompts, packed)
    model.train()
    _set_checkpointing(model, gradient_checkpointing)

    starts = list(range(0, len(batch), mini_batch_size))
    if _all_reduce(len(starts), "max", device) != _all_reduce(len(starts), "min", device):
        raise ValueError(f"ranks have different numbers of mini-batches (this rank: {len(starts)}); "
                         "give every rank the same number of trajectories")
    scaler = loss_scale if isinstance(loss_scale, LossScaler) else LossScaler(scale=float(loss_scale))
    t0 = time.perf_counter()
    sums: dict[str, float] = {}
    grad_norms, lrs, n_micro, n_tokens, n_shared, n_slots, skipped = [], [], 0, 0, 0, 0, 0
    nonfinite = trailing = 0  # skipped non-finite mini-batches (skip_nonfinite), and how many end the step
    for k, s in enumerate(starts):
        mb = batch[s:s + mini_batch_size]
        normaliser = loss_normaliser(mb, agg, device)
        bins = _plan([len(t.input_ids) for t in mb], max_tokens_per_micro, packed, device,
                     shared_prompts(mb) if share else None)
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for idx in bins:
            dummy = not idx  # an empty bin still runs, so FSDP's collectives line up across ranks
            micro = collate([mb[i] for i in (idx or [0])], packed=packed, device=device, share=share)
            with _autocast(device, autocast_dtype):
                logp = token_logprobs(model, micro.input_ids, micro.position_ids, attention_mask=micro.attention_mask,
                                      mask=micro.loss_mask, chunk_size=chunk_size, temperature=temperature)
            # old log-probs not given (first mini-batch only): the policy has not moved yet, so they are this
            # very forward pass, detached; the ratio is exactly 1 and the gradient that of the surrogate
            old = torch.where(micro.old_known, micro.old_logp, logp.detach())
            loss, st = policy_loss(logp, old, micro.adv, micro.loss_mask, clip_low=clip_low,
                                   clip_high=clip_high, dual_clip_c=dual_clip_c, agg=agg,
                                   is_weight=micro.is_weight, ref_logp=micro.ref_logp, kl_coef=kl_coef,
                                   kl_type=kl_type, normaliser=normaliser, max_len=max_len, seq_ids=micro.seq_ids)
            # The gradient reduction averages over ranks; scaling by world turns it into the sum.
            # a loss scale > 1 keeps fp16 activation gradients from underflowing; undone before the clip
            (loss * (0.0 if dummy else float(world) * scaler.scale)).backward()
            if dummy:
                continue
            losses.append((loss.detach(), idx))
            w = st["n_tokens"].item()
            for key, v in st.items():
                if key != "n_tokens":
                    sums[key] = sums.get(key, 0.0) + v.item() * (w if key != "pg_loss" else 1.0)
            sums["loss_tokens"] = sums.get("loss_tokens", 0.0) + w
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            n_micro += 1
            n_tokens += sum(micro.lengths)
            n_shared += sum(micro.shared or [])
            n_slots += micro.n_slots
        if scaler.scale != 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(scaler.scale)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2 gives a DTensor
        bad = [(j, idx) for j, (loss, idx) in enumerate(losses) if not torch.isfinite(loss)]
        # All ranks decide together, or the healthy ones would hang in the next collective. One max
        # carries both: 2 = a loss is bad somewhere, 1 = only a gradient.
        worst = _all_reduce(2.0 if bad else float(not torch.isfinite(norm).item()), "max", device)
        loss_bad, grad_bad = worst == 2.0, worst == 1.0
        if grad_bad and scaler.can_skip():  # an fp16 overflow: skip this step, halve
            optimizer.zero_grad(set_to_none=True)
            scaler.overflowed()
            skipped += 1
            continue
        if (loss_bad or grad_bad) and skip_nonfinite:
            optimizer.zero_grad(set_to_none=True)
            nonfinite += 1
            trailing += 1
            continue
        if loss_bad or grad_bad:
            optimizer.zero_grad(set_to_none=True)
            where = (f"loss in mini-batch {k} at micro-batch {bad[0][0]} holding trajectories "
                     f"{[s + i for i in bad[0][1]]}" if bad else
                     f"loss in mini-batch {k} on another rank" if loss_bad else f"gradient in mini-batch {k}")
            raise NonFiniteLossError(f"non-finite {where}: "
                                     f"losses={[round(loss.item(), 6) for loss, _ in losses]}, "
                                     f"grad_norm={norm.item()}; the weights were not updated")
        lrs.append(optimizer.param_groups[0]["lr"])
        trailing = 0
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        scaler.stepped()
        grad_norms.append(norm.item())
    dt = time.perf_counter() - t0
    tok = max(sums.pop("loss_tokens", 0.0), 1.0)
    stats = {key: v / tok for key, v in sums.items() if key not in ("pg_loss", "loss")}
    stats.update({
        "loss": sums.get("loss", 0.0) / max(1, len(starts)),
        "pg_loss": sums.get("pg_loss", 0.0) / max(1, len(starts)),
        "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
        "grad_norm_max": max(grad_norms, default=0.0),
        "lr": lrs[-1] if lrs else optimizer.param_groups[0]["lr"],  # the lr of the last step taken
        "n_mini_batches": len(starts),
        "skipped_steps": skipped,
        "nonfinite_skipped": nonfinite,
        "nonfinite_trailing": trailing,
        "loss_scale": scaler.scale,
        "n_micro_batches": n_micro,
        "tokens": n_tokens,
        "shared_tokens": n_shared,
        "loss_tokens": int(tok),
        "pad_frac": 1.0 - (n_tokens - n_shared) / max(1, n_slots),
        "tokens_per_s": n_tokens / max(dt, 1e-9),
    })
    return stats
