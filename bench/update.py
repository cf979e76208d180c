"""Bench: the GRPO update (grpo.update) in packed micro-batches: packed attention, LoRA, shared prompts.

Same trajectories (random lengths, prompt tokens masked), same model init, same token budget per
micro-batch in every mode. Each mode runs in its own subprocess so that peak RSS (resource.getrusage;
tracemalloc does not see torch) belongs to that mode alone. Throughput counts the trajectories' tokens over
the update's wall time, after a warm-up update.

    python bench/update.py            # prints the five modes and one `bench: update ...` line

"packed" is train.py's update: packed rows, sdpa sequence by sequence (packing.packed_attention, as train.py
and sft.py do). "mask" is the same packed rows under transformers' plain sdpa, whose block-diagonal mask still
computes all (row x row) attention scores: `attn_speedup` is what packed_attention saves. On GPU with
flash-attention the packed path is varlen already. "lora" trains LoRA adapters (--lora-rank) instead of the
weights: its ratio to "packed" is what train.py's --lora-rank saves per trained token (no weight gradients, a
small optimizer state).

The modes "grouped" and "shared" train GRPO-shaped trajectories instead: groups of --group samples that
share a prompt of --group-prompt tokens, packed whole ("grouped") or behind one copy of their prompt
(packing.shared_prompts, train.py's default): `share_speedup` counts the same trajectories' tokens a second.
"""
import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


MODES = ("packed", "lora", "mask", "grouped", "shared")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_mode(args) -> dict:
    import torch
    import transformers

    import config
    import grpo
    from machinery import packing, precision
    from machinery import policy as policy_mod

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=3 * args.hidden)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
    if args.mode != "mask":
        packing.packed_attention(model)
    g = torch.Generator().manual_seed(1)

    def trajectories(n, lo, hi):
        out = []
        for _ in range(n):
            L = int(torch.randint(lo, hi + 1, (), generator=g))
            mask = [0] * args.prompt + [1] * (L - args.prompt)
            # one tool-output span inside the response, masked like the trainer masks it
            a = int(torch.randint(args.prompt + 1, L - 1, (), generator=g))
            mask[a:a + min(32, L - 1 - a)] = [0] * min(32, L - 1 - a)
            out.append(grpo.TrainSeq(input_ids=torch.randint(0, args.vocab, (L,), generator=g).tolist(),
                                       loss_mask=mask, advantage=float(torch.randn((), generator=g)),
                                       old_logp=[-8.0] * L))
        return out

    def groups(n, lo, hi):
        """n trajectories, GRPO-shaped: each group of args.group shares its prompt, then goes on its own way."""
        out = []
        for t in trajectories(n, lo, hi):
            if len(out) % args.group == 0:
                prompt = torch.randint(0, args.vocab, (args.group_prompt,), generator=g).tolist()
            resp = t.input_ids[args.prompt:]
            out.append(grpo.TrainSeq(input_ids=prompt + resp, loss_mask=[0] * len(prompt) + t.loss_mask[args.prompt:],
                                       advantage=t.advantage, old_logp=[-8.0] * (len(prompt) + len(resp))))
        return out

    make = groups if args.mode in ("grouped", "shared") else trajectories
    warm, batch = make(2, 40, 80), make(args.n, args.min_len, args.max_len)
    if args.mode == "lora":  # adapters on every layer: the frozen weights get input gradients, no weight gradients
        policy_mod.add_lora(model, args.lora_rank, 2.0 * args.lora_rank)
    opt, sched = grpo.make_optimizer(model, lr=1e-5, warmup_steps=1)
    cfg, how = config.Grpo(), config.Update(max_tokens_per_micro=args.max_tokens, share_prompts=args.mode == "shared")
    kw = dict(max_len=args.max_len, temperature=1.0, scaler=precision.LossScaler())
    grpo.update(model, opt, sched, warm, cfg, how, mini_batch_size=2, **kw)
    base = rss_mb()
    t0 = time.perf_counter()
    st = grpo.update(model, opt, sched, batch, cfg, how, mini_batch_size=args.mini_batch, **kw)
    dt = time.perf_counter() - t0
    return {"mode": args.mode, "tokens": st["tokens"], "seconds": dt, "tok_s": st["tokens"] / dt,
            "micro_batches": st["n_micro_batches"],
            "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "peak_rss_mb": rss_mb(), "rss_before_update_mb": base}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=16, help="trajectories")
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per trajectory (loss mask 0)")
    p.add_argument("--mini-batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=2048, help="token budget per micro-batch")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lora-rank", type=int, default=16, help="the lora mode: LoRA adapters of this rank")
    p.add_argument("--group", type=int, default=4, help="grouped/shared modes: samples per prompt (the demo's 4)")
    p.add_argument("--group-prompt", type=int, default=128, help="grouped/shared modes: prompt tokens (the demo's ~125)")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # internal: one subprocess
    args = p.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    res = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--mode", mode] + sys.argv[1:]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"bench/update.py: {mode} run failed:\n{out.stderr[-3000:]}")
        res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = res[mode]
        print(f"{mode:7s} {r['tokens']} tokens in {r['seconds']:.1f}s = {r['tok_s']:.0f} tok/s, "
              f"{r['micro_batches']} micro-batches, "
              f"{r['trained_params'] / 1e6:.2f}M trained params, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB (update adds {r['peak_rss_mb'] - r['rss_before_update_mb']:.0f} MB)")
    pk, lo, mk, gr, sh = (res[m] for m in MODES)
    print(f"bench: update packed_tok_s={pk['tok_s']:.0f} packed_peak_rss_mb={pk['peak_rss_mb']:.0f} "
          f"lora_tok_s={lo['tok_s']:.0f} "
          f"lora_speedup={lo['tok_s'] / pk['tok_s']:.2f} lora_param_share={lo['trained_params'] / pk['trained_params']:.3f} "
          f"mask_tok_s={mk['tok_s']:.0f} attn_speedup={pk['tok_s'] / mk['tok_s']:.2f} "
          f"grouped_tok_s={gr['tok_s']:.0f} shared_tok_s={sh['tok_s']:.0f} share_speedup={sh['tok_s'] / gr['tok_s']:.2f}")


if __name__ == "__main__":
    main()
