"""machinery/precision.py: the update's numerics: dtype names, mixed precision, fp16 loss scaling, the non-finite guard.

Machinery, not algorithm: none of it changes the GRPO objective. The weights and the optimizer state stay
float32, and --update-dtype picks the compute dtype of the update's forward and backward passes: `autocast` on one process, FSDP2's MixedPrecisionPolicy under torchrun (train.py). A
float16 backward needs its loss scaled so that small gradients do not underflow: `LossScaler`, built from the
config by `loss_scaler`. `native_bf16` tells whether a CPU multiplies bfloat16 in hardware.

After a mini-batch's backward, grpo.update calls `unscale_and_clip` and then `skip_or_raise`: a NaN/inf loss or
gradient never reaches optimizer.step. An fp16 overflow under a dynamic scale skips its mini-batch (as
torch.amp.GradScaler does); anything else non-finite stops the update with NonFiniteLossError, or, by flag,
skips it too (veRL's behaviour). All ranks take the same decision, since each next step has collectives:
`over_ranks`, the project's one all-reduce of a number (grpo.py and packing.py use it too).

This module imports no project module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class NonFiniteLossError(RuntimeError):
    """A NaN/inf loss or gradient; raised before optimizer.step, with the gradients zeroed."""


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


def loss_scaler(cfg) -> LossScaler:
    """The scaler of a config.Update (duck-typed: update_dtype, loss_scale, loss_scale_growth). Only a float16
    backward is scaled by default (1024, dynamic); --loss-scale sets the start, for any dtype."""
    fp16 = cfg.update_dtype == "float16"  # the backward's dtype: what a loss scale protects
    return LossScaler(scale=cfg.loss_scale or (1024.0 if fp16 else 1.0),
                      growth_interval=cfg.loss_scale_growth if fp16 else 0)


def unscale_and_clip(model: torch.nn.Module, scaler: LossScaler, grad_clip: float) -> torch.Tensor:
    """Divide the gradients by the loss scale, clip their norm (0: no clip); returns the norm before the clip."""
    if scaler.scale != 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(scaler.scale)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2 gives a DTensor


def skip_or_raise(optimizer, scaler: LossScaler, losses: list, norm: torch.Tensor, *, skip_nonfinite: bool,
                  device: torch.device, where: tuple[int, int]) -> str | None:
    """None if a mini-batch's losses (its micro-batches': (0-dim loss, their trajectories' indices)) and gradient
    norm are finite on every rank. Otherwise the gradients are zeroed and it returns "overflow" (a non-finite
    gradient under a dynamic scaler that can still halve: halved) or "nonfinite" (with skip_nonfinite), or
    raises NonFiniteLossError. where: the mini-batch's number and the index of its first trajectory."""
    bad = [(j, idx) for j, (loss, idx) in enumerate(losses) if not torch.isfinite(loss)]
    # All ranks decide together, or the healthy ones would hang in the next collective. One max
    # carries both: 2 = a loss is bad somewhere, 1 = only a gradient.
    worst = over_ranks(2.0 if bad else float(not torch.isfinite(norm).item()), "max", device)
    loss_bad, grad_bad = worst == 2.0, worst == 1.0
    if not (loss_bad or grad_bad):
        return None
    optimizer.zero_grad(set_to_none=True)
    if grad_bad and scaler.can_skip():  # an fp16 overflow: skip this step, halve
        scaler.overflowed()
        return "overflow"
    if skip_nonfinite:
        return "nonfinite"
    k, s = where
    what = (f"loss in mini-batch {k} at micro-batch {bad[0][0]} holding trajectories "
            f"{[s + i for i in bad[0][1]]}" if bad else
            f"loss in mini-batch {k} on another rank" if loss_bad else f"gradient in mini-batch {k}")
    raise NonFiniteLossError(f"non-finite {what}: losses={[round(loss.item(), 6) for loss, _ in losses]}, "
                             f"grad_norm={norm.item()}; the weights were not updated")


def over_ranks(x: float, op: str, device: torch.device) -> float:
    """x summed, maxed or minned ("sum", "max", "min") over torchrun's ranks, in float64 (exact for counts); x itself
    on one process. The one all-reduce of a number: grpo.update, packing's plan and the non-finite guard use it."""
    if not (dist.is_available() and dist.is_initialized()):
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.item()


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision for one forward pass: matmuls in `dtype`, the fp32 weights and optimizer state kept (the
    single-process analogue of FSDP2's MixedPrecisionPolicy). None: no autocast, everything in the weights' dtype."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (without it, bf16 matmuls are emulated and slower than fp32)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True  # not Linux: no way to tell, no warning
    return "avx512_bf16" in flags or "amx_bf16" in flags
