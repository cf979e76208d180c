"""The one place an engine is picked and made: build_engine, and require, which stops a run before its model loads.

Apart from the interface (machinery/engine.py), which imports neither backend, so that only a caller that makes an
engine imports both; callers that only pass SamplingParams and read GenOutput import the interface alone.
"""
from __future__ import annotations

from machinery.hf_engine import HFEngine
from machinery.sglang_engine import SGLangEngine


def require(kind: str) -> None:
    """Stop at once, before a model loads, when --engine sglang cannot run in this Python."""
    import importlib.util
    if kind == "sglang" and importlib.util.find_spec("sglang") is None:
        raise SystemExit(f"--engine sglang: sglang is not installed in this Python: build its environment with "
                         f"`bash scripts/sglang_env.sh DIR` and run DIR/bin/python (or append --engine hf)")


def build_engine(kind: str, tokenizer, *, model=None, model_path: str | None = None, max_batch: int = 32,
                 deterministic: bool = False, dtype: str = "bfloat16", mem_fraction_static: float = 0.5, seed: int = 0,
                 server_url: str | None = None, device: str = "cuda", lockstep: bool = False, max_context: int = 0):
    """The one place an engine is made (train.py, eval.py, sft.py). "hf" decodes with `model`, an already
    loaded torch model (on one process the policy itself: no copy, no sync); "sglang" loads `model_path`
    (a local folder) into an in-process SGLang engine on `device` (cuda or cpu), or talks to the server at
    `server_url`. On a CPU, SGLang decodes at most `max_batch` sequences at once, its cache sized for that many
    of `max_context` tokens (within its memory share)."""
    if kind == "hf":
        if model is None:
            raise ValueError("build_engine('hf') needs the loaded model")
        return HFEngine(model, tokenizer, max_batch=max_batch, deterministic=deterministic, lockstep=lockstep)
    if kind == "sglang":
        return SGLangEngine(model_path=model_path, server_url=server_url, deterministic=deterministic, dtype=dtype,
                            mem_fraction_static=mem_fraction_static, seed=seed, eos_token_ids=[tokenizer.eos_token_id],
                            device=device, max_batch=max_batch, max_context=max_context)
    raise ValueError(f"engine must be hf or sglang, got {kind!r}")


def from_settings(e, tokenizer, *, model, model_path: str, max_batch: int, seed: int, device: str, max_context: int):
    """build_engine from a config.Engine section `e` (--engine, --deterministic, --lockstep, --dtype,
    --sglang-mem-fraction, --sglang-url): train.py's policy and eval.py both make theirs here. model: the HF
    engine's torch model (None for SGLang); model_path: the folder SGLang loads."""
    sglang = e.engine == "sglang"
    return build_engine(e.engine, tokenizer, model=model, model_path=model_path if sglang else None,
                        max_batch=max_batch, deterministic=e.deterministic, lockstep=e.lockstep, dtype=e.dtype,
                        mem_fraction_static=e.sglang_mem_fraction, seed=seed, server_url=e.sglang_url or None,
                        device=device, max_context=max_context)
