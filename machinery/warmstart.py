"""The cold start, trained once and reused: train.py's (and bench/rollout.py's) call into sft.py.

A warm start is sft.run on generated conversations, cached under <cache_dir>/sft/<key>. The key covers
its settings, the base model's files, and the source of the code and texts that shape it (SHAPED_BY), so
that rewording a prompt or an error text builds a new warm start instead of reusing the old one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

import config
import sft
from data import models
from data.models import cache_dir


def _is_complete(folder: Path) -> bool:
    try:
        meta = json.loads((folder / sft.MARKER).read_text())
        json.loads((folder / "config.json").read_text())
        return isinstance(meta, dict) and (folder / "model.safetensors").exists()
    except (OSError, ValueError):
        return False


# The code and texts that write a warm start's conversations (prompts, tool texts, the sandbox's real errors,
# the generator, the fixes it teaches) and that train it (the recipe's defaults in config.py, packing).
SHAPED_BY = ("sft.py", "config.py", "rollout.py", "tools.py", "sandbox.py", "machinery/zygote.py", "saar.py",
             "machinery/packing.py", "machinery/precision.py", "data/synth.py", "data/models.py")


def cache_key(model_name: str, tool_format: str, seed: int, n: int, overrides: dict) -> str:
    """sha256 of the settings, the source of SHAPED_BY, the base model's files (a local folder or an offline
    model's built folder; a hub id by name) and the torch and transformers versions."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(json.dumps(dict(tool_format=tool_format, seed=seed, n=n, overrides=overrides),
                                  sort_keys=True, default=str).encode())
    for name in SHAPED_BY:
        h.update(name.encode() + (root / name).read_bytes())
    folder = Path(models.resolve(model_name))
    if folder.is_dir():
        models.hash_files(h, folder, skip=(sft.MARKER,))  # a warm start's own build record changes with every build
    else:  # a hub id
        h.update(model_name.encode())
    h.update(" ".join(metadata.version(d) for d in ("torch", "transformers")).encode())
    return h.hexdigest()[:12]


def warm_start(model_name: str, *, tool_format: str = "markdown", seed: int = 0, n: int = 128,
               cache: str | os.PathLike | None = None, **overrides) -> str:
    """Path of a model fine-tuned by sft.py for (model, tool_format, seed, n, overrides), trained once on
    generated warm-up conversations and cached under <cache_dir>/sft/<key>, the key also covering the code and
    texts that shape it (cache_key).

    overrides are other Args fields (e.g. epochs=1); they are part of the cache key. No evaluation
    runs here. Processes that start at once (torchrun's ranks) train it once and share it (models.built_once).
    """
    unknown = set(overrides) - {f.name for f in dataclasses.fields(config.Sft)}
    if unknown:
        raise TypeError(f"warm_start: unknown Args fields {sorted(unknown)}")
    p = Path(model_name).expanduser()
    digest = cache_key(str(p.resolve()) if p.exists() else model_name, tool_format, seed, n, overrides)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", p.name or model_name)[-40:]
    final = Path(cache) if cache is not None else cache_dir() / "sft"
    final = final / f"{slug}-{tool_format}-s{seed}-n{n}-{digest}"
    if _is_complete(final):
        print(f"[sft] warm start: using cached {final}", file=sys.stderr)
        return str(final)

    def build(tmp: Path):
        print(f"[sft] warm start: no cached model for {model_name} ({tool_format}, seed {seed}, n {n}); "
              f"fine-tuning once into {final}", file=sys.stderr)
        kw = dict(eval_n=0, out="") | overrides
        sft.run(sft.Args(common=config.Common(model=model_name, seed=seed),
                         sft=config.Sft(tool_format=tool_format, n_conversations=n, save=str(tmp), **kw)))
    return str(models.built_once(final, build, _is_complete))
