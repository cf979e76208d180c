"""machinery/evalcache.py: train.py's step-0 evaluation, reused across runs (a speed-up of ours; the paper has none).

A run's held-out score before its first update is a function of the weights, the evaluation's settings and the
evaluation's code, so a run that would compute the same score as an earlier one (the same cold start with other
training flags, say) takes the earlier one's. The key hashes the model folder's files, the settings of the
sections the evaluation reads (READS) but those declared out beside their field (config.not_in_eval), the prompt
templates, the source of the modules the evaluation runs, and the torch and transformers versions. SAAR's
settings and saar.py count only with test-time SAAR on (--eval-saar), so an ablation of SAAR keeps the entry.
An entry is <cache>/eval/<key>/ (metrics.json, eval_step000000.jsonl), written whole and renamed into place. A hub id is not hashed, so its runs are not cached.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

# the sections the held-out evaluation reads: the key holds each of their settings but those declared out beside
# their field (config.not_in_eval); the others (grpo, run, update) are training's alone
READS = ("Common", "Data", "Rollout", "Saar", "Engine", "Sandbox")
RECORDS = "eval_step000000.jsonl"  # the step-0 per-problem records eval.held_out writes in the run folder


def cached(args, model_path: str, templates: dict | None, out: str | None, compute: Callable[[], dict],
           agree: Callable[[dict | None], dict | None] = lambda ev: ev) -> dict:
    """The step-0 metrics of this run's evaluation: an earlier run's (with eval_cached=1 and eval_cache_key, its
    per-problem records copied into out/eval_step000000.jsonl), or compute()'s, kept for later runs. args: a
    config.Train; caching is on with args.data.eval_cache and a model that is a local folder. Under torchrun
    out is the master's alone (None elsewhere), and agree hands every rank the master's lookup, so that all
    ranks evaluate together or none does."""
    k = key(args, model_path, templates) if args.data.eval_cache else None
    ev = agree(_load(k, out) if k is not None and out is not None else None)
    if ev is not None:
        return ev
    ev = compute()
    if k is not None and out is not None:
        _store(k, out, ev)
    return ev


def key(args, model_path: str, templates: dict | None = None) -> str | None:
    """sha256 of the model folder's files (weights, config, tokenizer, chat template; not sft.py's build record),
    the settings that the evaluation reads, the prompt templates, the evaluation's code and the torch and
    transformers versions; None for a model that is not a local folder."""
    import hashlib
    import inspect
    from importlib import metadata

    import config
    import eval as heldout
    import reward
    import rollout
    import saar
    import sandbox
    import sft
    import tools
    from data import models, problems, synth
    from machinery import engine, lcb, mathverify, sandbox_pool, zygote
    folder = Path(models.resolve(model_path))  # an offline model's name: its built folder
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    # not the cold start's build record: its timings and pid change with every rebuild of the same weights
    models.hash_files(h, folder, skip=(sft.MARKER,))
    saar_on = args.saar.eval_saar != "off"  # off: the evaluation reads no SAAR setting and runs no line of saar.py
    reads = tuple(getattr(config, name) for name in READS if saar_on or name != "Saar")  # TrainSaar is a Saar
    fields = {f.name: getattr(s, f.name) for s in config.sections(args) if isinstance(s, reads)
              for f in dataclasses.fields(s) if f.metadata.get("in_eval", True)}
    fields["templates"] = templates  # the wording --prompt-template loaded, not its path
    h.update(json.dumps(fields, sort_keys=True).encode())
    with_saar = (saar,) if saar_on else ()  # an ablation of SAAR (its code or its settings) keeps the entry
    # the sandbox's program is zygote.py and every machinery/zygote_*.py it imports: an edit to any of them counts
    program = tuple(m for n, m in sorted(sys.modules.items()) if n.startswith("machinery.zygote_"))
    for mod in (engine, reward, lcb, mathverify, rollout, sandbox, sandbox_pool, zygote, *program, tools, models,
                problems, synth) + with_saar:
        h.update(inspect.getsource(mod).encode())
    h.update(inspect.getsource(heldout.held_out).encode())
    h.update(" ".join(metadata.version(d) for d in ("torch", "transformers")).encode())
    return h.hexdigest()[:20]


def _root() -> Path:
    from data import models
    return models.cache_dir() / "eval"


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
