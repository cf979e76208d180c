"""The cold start, trained once and reused: train.py's (and bench/rollout.py's) call into sft.py.

A warm start is sft.run on generated conversations, cached under <cache_dir>/sft/<key>. The key covers what
it trains on (the conversations' tokens), its settings, the base model's files and the library versions, not
the source of any module: an ablation that edits saar.py reuses it, a reworded prompt or error text does not.
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


def sft_args(model_name: str, tool_format: str, seed: int, n: int, overrides: dict) -> sft.Args:
    """sft.py's arguments for a warm start (no evaluation, no log folder; overrides: other config.Sft fields)."""
    unknown = set(overrides) - {f.name for f in dataclasses.fields(config.Sft)}
    if unknown:
        raise TypeError(f"warm_start: unknown Args fields {sorted(unknown)}")
    return sft.Args(common=config.Common(model=model_name, seed=seed),
                    sft=config.Sft(tool_format=tool_format, n_conversations=n, **(dict(eval_n=0, out="") | overrides)))


def cache_key(model_name: str, tool_format: str, seed: int, n: int, overrides: dict) -> str:
    """sha256 of what the cold start trains on (the tokenized conversations and their loss masks: the prompts,
    the tool's texts and the sandbox's real errors, as the rollout writes them), its settings (not where it
    saves), the base model's files (a local folder or an offline model's built folder; a hub id by name) and
    the torch and transformers versions. No source is hashed: editing saar.py or grpo.py keeps the cold start,
    rewording a prompt or an error text changes the conversations and so the key."""
    args = sft_args(model_name, tool_format, seed, n, overrides)
    seqs = sft.dataset(args, models.load_tokenizer(model_name))
    settings = {k: v for k, v in config.flat(args).items() if k not in ("model", "save", "out")}
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    h.update(json.dumps(seqs).encode())
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
    generated warm-up conversations and cached under <cache_dir>/sft/<key> (cache_key: the conversations' tokens,
    the settings, the base model's files, the library versions).

    overrides are other config.Sft fields (e.g. epochs=1); they are part of the cache key. No evaluation
    runs here. Processes that start at once (torchrun's ranks) train it once and share it (models.built_once).
    """
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
        sft.run(sft_args(model_name, tool_format, seed, n, overrides | dict(save=str(tmp))))
    return str(models.built_once(final, build, _is_complete))
