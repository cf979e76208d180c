"""Rollout speed on the CPU backend, measured side by side in one run (rollout.py, saar.py, hf_engine.py).

Figures:
  1. the HF engine's batched tokens/s against one-request-at-a-time generation of the same requests;
  2. tool-calling rollout tokens/s against plain generation of the same token budget (the cost of
     tools and turns), and the share of wall time the engine sits idle waiting on the sandbox;
  3. SAAR on versus off on a workload with injected errors, same prompts and seeds: per rollback,
     the tokens regenerated, the generated tokens that end up in no trajectory (the replaced
     reasoning or call), and the added wall time (on minus off, over the rollbacks: noisy, since
     the continuations after a rollback differ from the raw ones);
  4. the same batched requests as in 1 with nn.Linear's own weights (HFEngine(pack=False)) against oneDNN's
     packed copies (the default on CPU, parts 1-3);
  5. tool-calling rollouts of the same prompts and seeds with lockstep batching (train.py's default: the engine
     decodes only while every trajectory waits on it) against free continuous batching, in seconds per sampled
     token (the two sample different tokens where a near-tie flips).
The model is the demo's warm SmolLM2-135M (sft.py's cold start, built once and cached) so that it
really writes code; `--model` picks another. Errors are injected by a tool wrapper that fails each
trajectory's first call with a NameError, as a model's typo would.

    python bench/rollout.py [--model smollm2-135m] [--requests 16] [--new-tokens 128] [--parts 1,2,3,4]
    python bench/rollout.py --parts 5 --requests 32     # lockstep, at the demo's batch

About 4 minutes on 2 cores with the defaults (the 5-minute bench budget): part 1 runs 6 of the 16 requests
one at a time, part 3 rolls out 16 trajectories per setting.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import config  # noqa: E402
import rollout  # noqa: E402
from data import models, synth  # noqa: E402
from machinery.engine import SamplingParams  # noqa: E402
from machinery.hf_engine import HFEngine  # noqa: E402
from sandbox import Sandbox  # noqa: E402


class Meter:
    """Wraps an engine to count generated tokens and the wall time with no request in flight."""

    def __init__(self, engine):
        self.engine, self.in_flight, self.tokens = engine, 0, 0
        self.idle, self._since = 0.0, time.perf_counter()
        self.max_len = engine.max_len  # the rollout caps each turn at the context window

    async def generate(self, ids, params):
        if self.in_flight == 0:
            self.idle += time.perf_counter() - self._since
        self.in_flight += 1
        try:
            out = await self.engine.generate(ids, params)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._since = time.perf_counter()
        self.tokens += len(out.token_ids)
        return out

    async def score(self, ids, start):
        return await self.engine.score(ids, start)

    def reset(self):
        self.in_flight, self.tokens, self.idle, self._since = 0, 0, 0.0, time.perf_counter()


class FirstCallFails:
    """The real sandbox, except that each session's first call fails like a typo would."""

    def __init__(self, sb):
        self.sb = sb

    def session(self):
        return _OneFailure(self.sb)


class _OneFailure:
    def __init__(self, sb):
        self.sb, self.done = sb, False

    async def arun(self, code, **kw):
        if not self.done:
            self.done = True
            return await self.sb.arun("print(undefined_name_from_a_typo)")
        return await self.sb.arun(code, **kw)

    def close(self):
        pass


async def gather(*aws):
    """asyncio.gather inside the running loop (outside one it would bind to another loop)."""
    return await asyncio.gather(*aws)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=384, help="response tokens per trajectory")
    ap.add_argument("--no-warm", action="store_true", help="use the base model, not the SFT warm start")
    ap.add_argument("--parts", default="1,2,3,4", help="which figures to measure (see above)")
    ap.add_argument("--saar-requests", type=int, default=16, help="trajectories per setting in part 3")
    ap.add_argument("--single-requests", type=int, default=6,
                    help="part 1: how many of the requests also run one at a time (tok/s is compared, so a subset will do)")
    a = ap.parse_args()
    parts = {int(p) for p in a.parts.split(",")}
    path = a.model
    if not a.no_warm and a.model in models.OFFLINE:
        import sft
        path = sft.warm_start(a.model, tool_format="markdown", seed=0)
    tok, model = models.load_tokenizer(path), models.load_model(path).eval()
    problems = synth.make_problems(max(a.requests, a.saar_requests), seed=123, difficulty="rl")
    all_prompts = [rollout.prompt_ids(tok, p.problem, p.task, "markdown") for p in problems]
    prompts = all_prompts[:a.requests]
    loop = asyncio.new_event_loop()
    figures = {}

    # ---- 1. batched versus one request at a time, same requests, same seeds
    eng = HFEngine(model, tok, max_batch=max(a.requests, a.saar_requests))
    loop.run_until_complete(eng.generate(prompts[0], SamplingParams(max_new_tokens=4)))  # warm-up
    if 1 in parts:
        params = [SamplingParams(max_new_tokens=a.new_tokens, seed=i) for i in range(a.requests)]
        t0 = time.perf_counter()
        outs = loop.run_until_complete(gather(*[eng.generate(p, q) for p, q in zip(prompts, params)]))
        t_batched = time.perf_counter() - t0
        n_batched = sum(len(o.token_ids) for o in outs)
        t0 = time.perf_counter()
        n_single = 0
        for p, q in list(zip(prompts, params))[:a.single_requests]:
            n_single += len(loop.run_until_complete(eng.generate(p, q)).token_ids)
        t_single = time.perf_counter() - t0
        figures["batched_x"] = (n_batched / t_batched) / (n_single / t_single)
        print(f"engine: batched {n_batched / t_batched:.1f} tok/s ({a.requests} requests), "
              f"one at a time {n_single / t_single:.1f} tok/s: {figures['batched_x']:.2f}x", flush=True)

    # ---- 4. the same batched requests, decoded with nn.Linear's own weights
    if 4 in parts:
        params = [SamplingParams(max_new_tokens=a.new_tokens, seed=i) for i in range(a.requests)]
        if 1 not in parts:  # the packed figure, measured here
            eng.flush_cache()
            t0 = time.perf_counter()
            outs = loop.run_until_complete(gather(*[eng.generate(p, q) for p, q in zip(prompts, params)]))
            t_batched, n_batched = time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)
        plain = HFEngine(model, tok, max_batch=a.requests, pack=False)
        loop.run_until_complete(plain.generate(prompts[0], SamplingParams(max_new_tokens=4)))  # warm-up
        t0 = time.perf_counter()
        outs_p = loop.run_until_complete(gather(*[plain.generate(p, q) for p, q in zip(prompts, params)]))
        t_plain, n_plain = time.perf_counter() - t0, sum(len(o.token_ids) for o in outs_p)
        plain.shutdown()
        figures["packed_x"] = (n_batched / t_batched) / (n_plain / t_plain)
        same = sum(o.token_ids == c.token_ids for o, c in zip(outs, outs_p))
        print(f"engine: packed weights {n_batched / t_batched:.1f} tok/s, nn.Linear's {n_plain / t_plain:.1f} tok/s "
              f"({a.requests} requests): {figures['packed_x']:.2f}x; {same} of {a.requests} requests sampled the "
              f"same tokens", flush=True)

    meter = Meter(eng)
    cfg = config.Rollout(tool_format="markdown", max_turns=4, max_response_tokens=a.budget, temperature=1.0)
    with Sandbox(slots=2) as sb:
        # ---- 2. tool-calling rollouts versus plain generation of the same budget
        if 2 in parts:
            eng.flush_cache()
            t0 = time.perf_counter()
            trajs = loop.run_until_complete(rollout.rollout_batch(meter, sb, tok, prompts, cfg,
                                                                  seeds=list(range(len(prompts)))))
            t_tools = time.perf_counter() - t0
            figures["engine_idle_share"] = meter.idle / t_tools
            n_tools = sum(sum(t.loss_mask) for t in trajs)  # sampled tokens only
            calls = sum(t.num_tool_calls for t in trajs)
            # plain generation: the same prompts, each asked for as many tokens as its trajectory sampled
            eng.flush_cache()
            t0 = time.perf_counter()
            plain = loop.run_until_complete(gather(*[
                eng.generate(p, SamplingParams(max_new_tokens=max(1, sum(t.loss_mask)), seed=i))
                for i, (p, t) in enumerate(zip(prompts, trajs))]))
            t_plain = time.perf_counter() - t0
            n_plain = sum(len(o.token_ids) for o in plain)
            figures["tools_vs_plain_x"] = (n_tools / t_tools) / (n_plain / t_plain)
            print(f"rollout: {n_tools / t_tools:.1f} tok/s with {calls} tool calls, plain {n_plain / t_plain:.1f} tok/s: "
                  f"{figures['tools_vs_plain_x']:.2f}x; engine idle waiting on the sandbox "
                  f"{100 * figures['engine_idle_share']:.1f}% of the wall time", flush=True)

        # ---- 5. lockstep against free continuous batching, the same rollouts
        if 5 in parts:
            runs = {}
            for lockstep in (False, True, False, True):  # interleaved, so that a drift of the machine hits both
                eng.lockstep = lockstep
                eng.flush_cache()
                t0 = time.perf_counter()
                trajs = loop.run_until_complete(rollout.rollout_batch(eng, sb, tok, prompts, cfg,
                                                                      seeds=list(range(len(prompts)))))
                dt, n = time.perf_counter() - t0, sum(sum(t.loss_mask) for t in trajs)
                calls = sum(t.num_tool_calls for t in trajs)
                runs.setdefault(lockstep, []).append((dt, n, calls))
            eng.lockstep = False
            per_tok = {k: sum(r[0] for r in v) / sum(r[1] for r in v) for k, v in runs.items()}
            figures["lockstep_cost_x"] = per_tok[True] / per_tok[False]
            print(f"lockstep: {1 / per_tok[True]:.1f} tok/s, free {1 / per_tok[False]:.1f} tok/s: lockstep takes "
                  f"{figures['lockstep_cost_x']:.2f}x the time per token (runs s/tokens/calls: "
                  f"{ {k: [(round(d, 1), n, c) for d, n, c in v] for k, v in runs.items()} })", flush=True)

        # ---- 3. SAAR on versus off, one injected failure per trajectory (its first call)
        if 3 in parts:
            res = {}
            for name, saar in (("off", None), ("on", config.Saar())):
                eng.flush_cache()
                meter.reset()
                t0 = time.perf_counter()
                tr = loop.run_until_complete(rollout.rollout_batch(
                    meter, FirstCallFails(sb), tok, all_prompts[:a.saar_requests],
                    dataclasses.replace(cfg, stateful=True), saar, seeds=list(range(a.saar_requests))))
                res[name] = (time.perf_counter() - t0, meter.tokens, tr)
            events = [e for t in res["on"][2] for e in t.saar_events]
            kinds = {k: sum(e["kind"] == k for e in events) for k in ("shallow", "deep", "answered", "given_up")}
            rollbacks = kinds["shallow"] + kinds["deep"]
            per = max(1, rollbacks)
            kept = {name: sum(sum(t.loss_mask) for t in r[2]) for name, r in res.items()}
            figures.update(
                saar_rollbacks=rollbacks,
                saar_regen_tokens=sum(e.get("regen_tokens", 0) for e in events if e["kind"] in ("shallow", "deep")) / per,
                saar_discarded_tokens=(res["on"][1] - kept["on"]) / per,
                saar_s_per_rollback=(res["on"][0] - res["off"][0]) / per)
            print(f"saar: {a.saar_requests} trajectories, first call of each fails; events {kinds}; per rollback "
                  f"{figures['saar_regen_tokens']:.1f} tokens regenerated, {figures['saar_discarded_tokens']:.1f} generated "
                  f"but in no trajectory, {figures['saar_s_per_rollback']:+.3f} s wall (on {res['on'][0]:.1f} s / "
                  f"{res['on'][1]} tok generated, off {res['off'][0]:.1f} s / {res['off'][1]} tok, "
                  f"{res['off'][1] - kept['off']} of them in no trajectory)", flush=True)
    eng.shutdown()
    loop.close()
    print("bench: rollout " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
