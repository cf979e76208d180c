"""machinery/checkpoint.py: the run folder, so that a run is reproducible from it and --resume continues it exactly.

run.json (every setting by its flag's name, the commit, argv, the Python version), git.diff, packages.txt;
ckpt.pt (model, optimizer, scheduler, loss scaler, step, data position, every RNG state), written to a temp
file and renamed, so that a kill mid-save leaves the previous checkpoint whole; hf/ (whole weights, LoRA
merged, a folder eval.py loads). Works for plain modules and FSDP2 alike (torch.distributed.checkpoint's
full state dicts). The official recipe saves veRL's sharded checkpoints instead. The step's records go
there too: metrics.jsonl, TensorBoard (tb/), and a few whole rollouts a step (rollouts/step_N.jsonl).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from machinery import engines


def write_run_info(out: str, args, settings: dict) -> None:
    """Everything needed to reproduce the run: settings (config.flat(args)), commit, diff, package versions, seed.
    With --eval-only the run's own record stays, and the evaluation adds a line to evals.jsonl."""
    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True).stdout  # noqa: E731
    info = dict(args=settings, seed=args.common.seed, commit=git("rev-parse", "HEAD").strip(),
                argv=sys.argv, python=sys.version, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    if args.run.eval_only:
        with open(os.path.join(out, "evals.jsonl"), "a") as f:
            f.write(json.dumps(dict(info, diff=git("diff", "HEAD"))) + "\n")
        return
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(out, "git.diff"), "w") as f:
        f.write(git("diff", "HEAD"))
    from importlib import metadata
    with open(os.path.join(out, "packages.txt"), "w") as f:
        f.write("\n".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())) + "\n")


def note_in_run_info(out: str, **facts) -> None:
    """Facts known only after the run folder is made (the cold start's folder, with its cache key) into run.json."""
    path = os.path.join(out, "run.json")
    with open(path) as f:
        info = json.load(f)
    with open(path + ".tmp", "w") as f:
        json.dump(info | facts, f, indent=2)
    os.replace(path + ".tmp", path)


def prepare_run(args, world: int, master: bool, settings: dict) -> tuple[str, str]:
    """Checks that need the world size or the disk, then the run folder and its run.json (settings:
    config.flat(args)): (folder, checkpoint path)."""
    r = args.run
    g = args.grpo
    if g.prompts_per_step % g.mini_batch_prompts or g.mini_batch_prompts % world:
        raise SystemExit(f"prompts_per_step ({g.prompts_per_step}) must divide by mini_batch_prompts "
                         f"({g.mini_batch_prompts}), and that by the world size ({world})")
    if r.eval_only and not args.data.eval_size:
        raise SystemExit(f"--eval-only: the run {r.run_name!r} has --eval-size 0, no held-out set to evaluate")
    if args.machinery.engine.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = os.path.join(r.out_dir, r.run_name or time.strftime("run-%Y%m%d-%H%M%S"))
    if r.resume and not os.path.exists(os.path.join(out, "ckpt.pt")):
        raise SystemExit(f"--resume: no checkpoint at {os.path.join(out, 'ckpt.pt')}")
    engines.require(args.machinery.engine.engine)
    if master:
        os.makedirs(os.path.join(out, "rollouts"), exist_ok=True)
        write_run_info(out, args, settings)  # --eval-only: a line in evals.jsonl, run.json is the run's
    return out, os.path.join(out, "ckpt.pt")


def full_state(model, lora_scale: float = 0.0) -> dict:
    """Whole (unsharded) weights on every rank, LoRA adapters merged in (lora_scale = alpha / rank)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return merge_lora(state, lora_scale) if lora_scale else state


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


def save(path: str, model, optimizer, scheduler, scaler, step: int, master: bool, data_pos: int,
         background: bool = False):
    """Model, optimizer, scheduler, loss scaler, step, data position (groups drawn so far) and every RNG state.

    background=True writes from a thread and returns its Future (None on other ranks), so the write overlaps
    the next step's rollout. The state holds the live tensors, not copies: the caller waits on the Future
    (which re-raises a failed write) before the weights or the optimizer state change."""
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not master:
        return None
    state = dict(model=msd, optimizer=osd, scheduler=scheduler.state_dict(), scaler=dataclasses.asdict(scaler),
                 step=step, data_pos=data_pos,
                 rng=dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state()))

    def write():
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    if not background:
        return write()
    pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt")  # its thread is joined at exit: a write is never cut
    try:
        return pool.submit(write)
    finally:
        pool.shutdown(wait=False)


def load(path: str, model, optimizer, scheduler, scaler) -> tuple[int, int | None]:
    """Restore a checkpoint in place; returns (step, data position; None from a checkpoint that has none)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    for key, value in state.get("scaler", {}).items():
        setattr(scaler, key, value)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"]), state.get("data_pos")


def save_hf(path: str, model, tokenizer, master: bool, lora_scale: float = 0.0) -> None:
    """A Hugging Face folder eval.py can load (whole weights, written by rank 0)."""
    sd = full_state(model, lora_scale)
    if master:
        model.save_pretrained(path, state_dict=sd)
        tokenizer.save_pretrained(path)


def save_model(model, tokenizer, path: str | os.PathLike, files: dict[str, str]) -> str:
    """save_pretrained, and files (name: text), into a temp folder, then renamed into place: a reader never
    sees half a model (sft.py's, the warm start's)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, text in files.items():
        (tmp / name).write_text(text)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return str(final)


def metric_writer(out: str, args, settings: dict):
    """metrics.jsonl always, TensorBoard scalars (and the SAAR similarity histogram), wandb only when named (with the
    run's settings, config.flat(args))."""
    from torch.utils.tensorboard import SummaryWriter
    tb = SummaryWriter(os.path.join(out, "tb"))
    wb = None
    if args.run.wandb_project:
        import wandb  # imported only here, so runs without it never need it
        wb = wandb.init(project=args.run.wandb_project, name=os.path.basename(out), config=settings)

    def write(m: dict):
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(m) + "\n")
        for k, v in m.items():
            if isinstance(v, (int, float)) and k != "step":
                tb.add_scalar(k, v, m["step"])
            elif isinstance(v, list) and v:
                tb.add_histogram(k, np.asarray(v, dtype=np.float64), m["step"], bins=np.linspace(0, 1, 21))
        tb.flush()
        if wb is not None:
            wb.log(m, step=m["step"])
    return write


def dump_rollouts(out: str, step: int, seen, tokenizer) -> None:
    """A step's whole rollouts (traj, reward, correct) as rollouts/step_N.jsonl in the run folder, one a line:
    what the model wrote (`masked`: the character ranges not trained on), its reward and SAAR's events, each with
    the text it removed and the text that took its place (saar.retry_failed_call), `at` its character range."""
    with open(os.path.join(out, "rollouts", f"step_{step:06d}.jsonl"), "w") as f:
        for tr, r, _ in seen:
            f.write(json.dumps(dict(meta=tr.meta, reward=r, prompt=tokenizer.decode(tr.prompt_ids), response=tr.text,
                                    masked=tr.masked, finish_reason=tr.finish_reason, truncated=tr.truncated,
                                    turns=tr.turns, saar=tr.saar, saar_events=tr.saar_events, num_tool_calls=tr.num_tool_calls,
                                    num_tool_errors=tr.num_tool_errors, response_len=len(tr.response_ids))) + "\n")
