"""The engine and the trainer must agree: their log-prob gap on every sampled token, and veRL's correction for it.

CLEANER's code recomputes the old log-probs on the purified tokens (`calculate_log_probs=False`) and never reads
the engine's sampling log-probs. The two differ because kernels and precision differ (SGLang samples in bf16,
the trainer recomputes over fp32 masters), because the engine's weights can be stale (a weight push that failed
leaves the rollout on an old policy, and nothing else in a run would show it), and, for the tokens SAAR spliced
in, because those were sampled with the error in context and are trained without it.

`measure` gives the gap at no forward pass of its own: train.py calls it on the old log-probs the update already
has (for the first mini-batch, those of the update's own forward pass). `correct` is veRL's rollout correction
(`algorithm.rollout_correction`), off by default as in the paper: token-level truncated IS (veRL's
rollout_is=token) or sequence-level rejection (veRL's rollout_rs=sequence). Here pi_old is recomputed on the
purified context, so on SAAR's spliced tokens the token-level weight pi_old/pi_rollout is the importance ratio of
the clean context to the one the token was sampled in. This module imports no project module.
"""
from __future__ import annotations

import math

import torch

OUT_OF_RANGE = math.log(2.0)  # a token whose ratio pi_old/pi_rollout leaves [0.5, 2]


def _log_ratio(t, clamp: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, mask) of one TrainSeq: d = log pi_old - log pi_rollout (L,), 0 (ratio 1) where the loss mask is 0 and
    (clamp) clamped to [-20, 20] as veRL clamps a token's, in float64 (a k3 of 1e-13 must not round to 0); mask
    (L,) bool."""
    mask = torch.as_tensor(t.loss_mask, dtype=torch.bool)
    d = torch.as_tensor(t.old_logp, dtype=torch.float64) - torch.as_tensor(t.rollout_logp, dtype=torch.float64)
    d = torch.where(mask, d, 0.0)
    return (d.clamp(-20.0, 20.0) if clamp else d), mask


def measure(batch) -> dict:
    """The gap on every sampled token of the batch (TrainSeq with old_logp, rollout_logp and spliced, each (L,)):
    the mean k3 estimate of KL(pi_rollout || pi_old), the mean and max |log pi_old - log pi_rollout|, and the share
    of tokens whose ratio leaves [0.5, 2]; for ordinary tokens (mismatch_*) and for SAAR's spliced ones
    (mismatch_*_spliced), with their counts. Sequences without rollout log-probs are skipped."""
    parts = []
    for t in batch:
        if t.rollout_logp is not None and t.old_logp is not None:
            d, mask = _log_ratio(t)
            spliced = torch.as_tensor(t.spliced if t.spliced is not None else [0] * len(mask), dtype=torch.bool)
            parts.append((d[mask], spliced[mask]))  # (M,) each: the tokens with loss mask 1
    if not parts:
        return {}
    d, spliced = (torch.cat(x) for x in zip(*parts))
    out = {}
    for name, x in (("", d[~spliced]), ("_spliced", d[spliced])):
        n = x.numel()
        out.update({f"mismatch_kl{name}": (torch.expm1(x) - x).mean().item() if n else 0.0,  # k3: r - 1 - log r
                    f"mismatch_abs{name}": x.abs().mean().item() if n else 0.0,
                    f"mismatch_abs{name}_max": x.abs().max().item() if n else 0.0,
                    f"mismatch_out{name}": (x.abs() > OUT_OF_RANGE).float().mean().item() if n else 0.0,
                    f"mismatch_tokens{name}": n})
    return out


def correct(batch, mode: str, threshold: float, lower: float = 0.0) -> dict:
    """veRL's rollout correction on the batch, in place, from old_logp and rollout_logp:
    - "token": each token's loss weighted by min(pi_old/pi_rollout, threshold) (is_weight; truncated IS);
    - "seq": a sequence whose ratio prod_t pi_old/pi_rollout leaves [lower, threshold] (lower 0: 1/threshold) is
      dropped from the loss, its loss mask zeroed, so that it leaves the loss's normaliser too (masked IS).
    Returns the share of loss tokens whose weight was truncated, or of sequences (and their tokens) dropped."""
    if mode == "none":
        return {}
    if mode not in ("token", "seq"):
        raise ValueError(f"unknown rollout correction {mode!r}; choose none, token or seq")
    lo = math.log(lower if lower > 0 else 1.0 / threshold)
    clipped = dropped = dropped_tokens = tokens = 0
    for t in batch:
        d, mask = _log_ratio(t, clamp=mode == "token")  # seq: veRL clamps the sum, not each token
        tokens += int(mask.sum())
        if mode == "token":
            ratio = d.exp()  # (L,), 1 where the token is not trained on
            t.is_weight = ratio.clamp(max=threshold).float()
            clipped += int((ratio > threshold).sum())
        elif not lo <= float(d.sum().clamp(-20.0, 20.0)) <= math.log(threshold):
            dropped, dropped_tokens = dropped + 1, dropped_tokens + int(mask.sum())
            t.loss_mask = [0] * len(t.loss_mask)
    if mode == "token":
        return dict(rollout_is_clipped=clipped / max(1, tokens))
    return dict(rollout_is_dropped_seqs=dropped / max(1, len(batch)),
                rollout_is_dropped=dropped_tokens / max(1, tokens))


def warn_once(threshold: float, log):
    """A function of a step's metrics that says once, in plain words, when the ordinary tokens' KL passes
    threshold: the engine's weights may be stale, or its precision far from the trainer's."""
    said = []

    def check(m: dict) -> None:
        kl = m.get("mismatch_kl", 0.0)
        if kl > threshold and not said:
            said.append(kl)
            log(f"warning: step {m['step']}: the engine's sampling log-probs are far from the trainer's (mismatch KL "
                f"{kl:.2e} > --mismatch-warn-kl {threshold:g}, {m.get('mismatch_out', 0.0):.1%} of tokens outside "
                f"ratio [0.5, 2]). The engine's weights may be stale (did the weight push fail, or a prefix cache "
                f"survive it?), or its precision far from the trainer's (--dtype vs --update-dtype).")
    return check
