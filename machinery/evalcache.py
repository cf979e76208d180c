"""machinery/evalcache.py: train.py's step-0 evaluation, reused across runs (a speed-up of ours; the paper has none).

A run's held-out score before its first update is a function of the weights, the evaluation's settings and the
evaluation's code, so a run that would compute the same score as an earlier one (the same cold start with other
training flags, say) takes the earlier one's. The key hashes what its caller hands in (eval.step0_key): the model
folder's files, the settings the evaluation reads, the source of the code it runs, and the torch and transformers
versions. An entry is <cache>/eval/<key>/ (metrics.json, eval_step000000.jsonl), written whole and renamed into place.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from machinery.cache import cache_dir, hash_files

RECORDS = "eval_step000000.jsonl"  # the step-0 per-problem records eval.held_out writes in the run folder


def cached(k: str | None, out: str | None, compute: Callable[[], dict],
           agree: Callable[[dict | None], dict | None] = lambda ev: ev) -> dict:
    """The step-0 metrics of this run's evaluation: an earlier run's (with eval_cached=1 and eval_cache_key, its
    per-problem records copied into out/eval_step000000.jsonl), or compute()'s, kept for later runs. k: the key
    (`key`; None: no caching). Under torchrun out is the master's alone (None elsewhere), and agree hands every
    rank the master's lookup, so that all ranks evaluate together or none does."""
    ev = agree(_load(k, out) if k is not None and out is not None else None)
    if ev is not None:
        return ev
    ev = compute()
    if k is not None and out is not None:
        _store(k, out, ev)
    return ev


def key(folder: Path, settings: dict, sources: list[str], skip: tuple[str, ...] = ()) -> str:
    """sha256 of the model folder's files (not those named in skip), the settings that the evaluation reads, the
    source of the code it runs (as the caller lists it) and the torch and transformers versions."""
    h = hashlib.sha256()
    hash_files(h, folder, skip=skip)
    h.update(json.dumps(settings, sort_keys=True).encode())
    for text in sources:
        h.update(text.encode())
    h.update(" ".join(metadata.version(d) for d in ("torch", "transformers")).encode())
    return h.hexdigest()[:20]


def _root() -> Path:
    return cache_dir() / "eval"


def _load(k: str, out: str) -> dict | None:
    """The entry's metrics, its records copied into out; None when there is none or it is unreadable."""
    folder = _root() / k
    if not (folder / "metrics.json").exists():
        return None
    t0 = time.perf_counter()
    try:
        with open(folder / "metrics.json") as f:
            ev = json.load(f)
        shutil.copyfile(folder / RECORDS, os.path.join(out, RECORDS))
    except (OSError, ValueError) as e:  # a damaged entry: evaluate again (and keep the damaged one for a look)
        print(f"eval cache {folder} is unreadable ({e}); evaluating instead", file=sys.stderr)
        return None
    return dict(ev, t_eval=time.perf_counter() - t0, eval_cached=1, eval_cache_key=k)


def _store(k: str, out: str, ev: dict) -> None:
    """Keep this run's step-0 evaluation for later runs (written whole, then renamed into place)."""
    if (_root() / k).exists():
        return
    tmp = _root() / f".{k}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.join(out, RECORDS), tmp / RECORDS)
    (tmp / "metrics.json").write_text(json.dumps(ev))
    try:
        os.replace(tmp, _root() / k)
    except OSError:  # another run stored it first
        shutil.rmtree(tmp, ignore_errors=True)
