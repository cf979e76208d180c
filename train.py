"""train.py: GRPO with SAAR-purified multi-turn tool rollouts (the paper's training loop, Sec. 3-4).

Setup (models, engine, sandbox, data, optimizer), then one GRPO step a screen: rollout and rewards, group
advantages, the update (grpo.update, whose micro-batch loop calls grpo.policy_loss), eval/log/checkpoint.
Every setting is a flag of config.py. The defaults are the CPU demo: SmolLM2-135M-Instruct warmed up by sft.py
(a quarter of its conversations fail a call and fix it, as the paper's cold start teaches retrying), trained on
generated problems at the model's edge with the markdown tool format, SAAR on, the top 12 layers trained and
temperature 0.6 (at 1.0 the 135M model writes mostly broken code); 128 held-out problems are evaluated greedily
before the first step and after the last, and the run ends with the gain and its paired 95% CI.

    python train.py                                   # the CPU demo (docs/results.md)
    python train.py --model tiny-qwen3 --steps 2      # the smallest end-to-end run
    torchrun --nproc_per_node=4 train.py ...          # one node, FSDP2 over the policy; scripts/ has the paper's

Departures (docs/departures.md): the reward grades the final assistant turn; a run is reproducible from its
folder (machinery/checkpoint.py); where our default differs from the official code, --faithful sets its choice.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import config
from machinery import engine as engine_mod
import eval as heldout
import grpo
import reward
import rollout
import sft
from data import models, problems
from data.synth import load_problems
from machinery import checkpoint, evalcache, mismatch, packing, precision
from sandbox import Sandbox

Args = config.Train
SUMMED = {"loss", "dropped_groups", "saar_shallow", "saar_deep", "saar_given_up", "saar_answered", "saar_regen_tokens"}


def main(args: Args):
    t_run = time.perf_counter()
    args = config.apply_faithful(checkpoint.args_of_run(args) if args.run.eval_only else args)
    (r, d, g), (rank, world, device) = (args.run, args.data, args.grpo), init_distributed(args.engine.device)
    master = rank == 0
    log = (lambda *a: print(*a, flush=True)) if master else (lambda *a: None)
    out, ckpt_path = prepare_run(args, world, master)
    policy, ref, eng, own_copy, tokenizer, model_path, cfg = build(args, device, world, log)
    amp = None if world > 1 or g.update_dtype == "float32" else precision.DTYPES[g.update_dtype]  # one process
    scaler = precision.loss_scaler(g)
    templates = rollout.load_prompt_template(cfg.prompt_template) if cfg.prompt_template else None
    sandbox = Sandbox(slots=args.sandbox.sandbox_slots, timeout_s=args.sandbox.tool_timeout_s,
                      memory_mb=args.sandbox.tool_memory_mb, hide=(os.path.abspath(r.out_dir),),
                      clock=args.sandbox.tool_clock)
    train_set, eval_set, order = load_data(args, tokenizer, cfg, templates, log)

    def grade(problem, traj) -> bool:  # right or wrong: the final turn's answer, by reward.py (training and eval)
        return reward.grade(problem.task, traj.final_text(tokenizer), answer=problem.answer, tests=problem.tests,
                            sandbox=sandbox, math_grader=g.math_grader)

    optimizer, scheduler = grpo.make_optimizer(policy, lr=g.lr, weight_decay=g.weight_decay,
                                               warmup_steps=g.warmup_steps, from_zero=g.warmup_unit == "train")
    start_step, data_pos = resume(args, ckpt_path, policy, optimizer, scheduler, scaler, log)
    writer, loop = checkpoint.metric_writer(out, args) if master else None, asyncio.new_event_loop()
    warn = mismatch.warn_once(g.mismatch_warn_kl, log)
    roll = dict(loop=loop, eng=eng, sandbox=sandbox, tokenizer=tokenizer, templates=templates, grade=grade)
    evaluate = lambda step: heldout.held_out(loop, eng, sandbox, tokenizer, eval_set, args, step=step,  # noqa: E731
                                             out_dir=out if master else None, rollout_cfg=cfg, templates=templates,
                                             grade=grade, rank=rank, world=world)
    if d.eval_size and ((start_step == 0 and r.steps > 0) or r.eval_only):  # the baseline, before any update
        baseline(args, evaluate, start_step, model_path, templates, out, world, writer, log)
    saving, nonfinite_run = None, 0  # saving: the checkpoint being written, waited on before the weights change
    for step in range(start_step, start_step if r.eval_only else r.steps):
        t, t_step, step_pos = {}, time.perf_counter(), data_pos
        # -------------------------------------------------------------- rollout and rewards
        trajs, rewards, groups, seen, data_pos, sampling = sample_groups(args, cfg, train_set, order, step, data_pos,
                                                                         rank, world, master, t, **roll)
        t0 = time.perf_counter()  # group advantages over every rank's rollouts (groups never straddle ranks)
        all_r, all_g = ([x for part in gather(xs, world) for x in part] for xs in (rewards, groups))
        adv, adv_stats = grpo.compute_advantages(all_r, all_g, norm_std=g.norm_adv_std)
        batch = [grpo.TrainSeq.of(tr, a)  # this rank's share: the prompt not trained on
                 for tr, a in zip(trajs, adv[rank * len(rewards):(rank + 1) * len(rewards)].tolist())]
        t["reward"] += time.perf_counter() - t0
        # -------------------------------------------------------------- update
        t0, mbs = time.perf_counter(), g.mini_batch_prompts * g.samples_per_prompt // world
        drift = old_logprobs(policy, ref, batch, mbs, g, temperature=cfg.temperature, autocast_dtype=amp)
        t["old_logp"], t0 = time.perf_counter() - t0, time.perf_counter()
        if saving is not None:  # the last checkpoint holds the live tensors: on disk before the update changes them
            saving, _ = None, saving.result()
        eng.release_memory()  # colocated SGLang: its GPU memory to the update (HF: nothing to give)
        save = lambda path, at, pos: checkpoint.save(path, policy, optimizer, scheduler, scaler, at, master,  # noqa: E731
                                                     data_pos=pos)
        try:  # no batch: --dynamic-sampling found no group with a signal
            stats = {} if not batch else grpo.update(
                policy, optimizer, scheduler if g.warmup_unit == "optimizer" else None, batch, g, mini_batch_size=mbs,
                max_len=cfg.max_response_tokens, temperature=cfg.temperature, scaler=scaler, autocast_dtype=amp)
        except grpo.NonFiniteLossError as e:  # no optimizer step took the bad gradient: keep what is good and stop
            save(path := os.path.join(out, f"ckpt-nonfinite-step{step + 1}.pt"), step, step_pos)
            raise SystemExit(f"step {step + 1}: {e}\nweights are unchanged by the bad update; saved {path}. "
                             f"The last regular checkpoint is {ckpt_path}.")
        drift = mismatch.measure(batch) if g.rollout_is == "none" else drift  # engine vs trainer, no extra pass
        nonfinite_run = count_nonfinite(stats, nonfinite_run, step, g, log, lambda p: save(p, step + 1, data_pos), out)
        if g.warmup_unit == "train":
            scheduler.step()  # veRL: once per training step, after the update
        t["update"], t0 = time.perf_counter() - t0, time.perf_counter()
        push_weights(args, eng, policy, own_copy)
        t["sync"] = time.perf_counter() - t0
        # -------------------------------------------------------------- eval / log / ckpt
        m = dict(step_metrics(seen, adv_stats, stats, t, world, adv_n=len(all_r), **sampling, **drift), step=step + 1)
        if d.eval_size and ((d.eval_every and (step + 1) % d.eval_every == 0) or step + 1 == r.steps):
            m.update(evaluate(step + 1))
        m["t_wall"] = time.perf_counter() - t_step
        if master:
            warn(m)  # once, when the engine's log-probs are far from the trainer's: stale weights?
            log(format_line(m))
            writer(m)
            checkpoint.dump_rollouts(out, step + 1, seen[:r.dump_rollouts], tokenizer)
        if (step + 1) % r.save_every == 0 or step + 1 == r.steps:
            saving = checkpoint.save(ckpt_path, policy, optimizer, scheduler, scaler, step + 1, master,
                                     data_pos=data_pos, background=True)
    finish(args, out, start_step, policy, tokenizer, master, saving, sandbox, eng, loop, world, log, t_run)


# ---------------------------------------------------------------------- setup

def init_distributed(device: str) -> tuple[int, int, str]:
    """(rank, world, device): torchrun's process group (NCCL on GPUs, gloo on CPU), or one process."""
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, device
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return dist.get_rank(), dist.get_world_size(), device


def prepare_run(args: Args, world: int, master: bool) -> tuple[str, str]:
    """Checks that need the world size or the disk, then the run folder and its run.json: (folder, checkpoint)."""
    r, g = args.run, args.grpo
    if g.prompts_per_step % g.mini_batch_prompts or g.mini_batch_prompts % world:
        raise SystemExit(f"prompts_per_step ({g.prompts_per_step}) must divide by mini_batch_prompts "
                         f"({g.mini_batch_prompts}), and that by the world size ({world})")
    if r.eval_only and not args.data.eval_size:
        raise SystemExit(f"--eval-only: the run {r.run_name!r} has --eval-size 0, no held-out set to evaluate")
    if args.engine.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = os.path.join(r.out_dir, r.run_name or time.strftime("run-%Y%m%d-%H%M%S"))
    if r.resume and not os.path.exists(os.path.join(out, "ckpt.pt")):
        raise SystemExit(f"--resume: no checkpoint at {os.path.join(out, 'ckpt.pt')}")
    if master:
        os.makedirs(os.path.join(out, "rollouts"), exist_ok=True)
        checkpoint.write_run_info(out, args)  # --eval-only: a line in evals.jsonl, run.json is the run's
    return out, os.path.join(out, "ckpt.pt")


def build(args: Args, device: str, world: int, log):
    """The cold start (cached), the policy (FSDP2 over ranks), the engine, and the reference model for a KL term.
    Returns (policy, ref, engine, whether the engine has its own copy of the weights, tokenizer, model_path, the
    rollout config with its tool format resolved)."""
    c, g, e = args.common, args.grpo, args.engine
    fmt = args.rollout.tool_format
    if fmt == "auto":
        fmt = rollout.resolve_tool_format(models.load_tokenizer(c.model), fmt)
    cfg = dataclasses.replace(args.rollout, tool_format=fmt)
    model_path = c.model
    if args.run.warm_start and c.model in models.OFFLINE and fmt != "none":
        fix = dict(fix_fraction=args.run.warm_start_fix) if args.run.warm_start_fix else {}  # 0: the cached default
        model_path = sft.warm_start(c.model, tool_format=fmt, seed=c.seed, **fix)  # cached after once
    tokenizer = models.load_tokenizer(model_path)
    # one process: fp32 weights, the update under torch.autocast in --update-dtype; FSDP2: fp32 masters sharded,
    # compute in --update-dtype, gradients reduced in fp32
    policy = models.load_model(model_path, dtype=torch.float32).to("cpu" if g.offload and world > 1 else device)
    packing.packed_attention(policy)  # packed rows: sdpa sequence by sequence, not over the whole row
    grpo.freeze_below(policy, g.train_layers)
    if g.lora_rank:  # adapters before sharding, so FSDP2 shards them with their layer
        grpo.add_lora(policy, g.lora_rank, g.lora_alpha, g.train_layers)
    if world > 1:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        kw = dict(mp_policy=MixedPrecisionPolicy(param_dtype=precision.DTYPES[g.update_dtype],
                                                 reduce_dtype=torch.float32))
        if g.offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        for layer in policy.model.layers:
            fully_shard(layer, **kw)
        fully_shard(policy, **kw)
    dtype = precision.DTYPES[e.dtype]
    if torch.device(device).type == "cpu" and "bfloat16" in (e.dtype, g.update_dtype) and not precision.native_bf16():
        log("dtype: this CPU has no native bfloat16 (AVX512-BF16 or AMX), so bfloat16 runs slower than float32 "
            "here: pass --update-dtype float32 (and --dtype float32)")
    # The HF engine gets its own copy of the weights, refreshed after each update, in a lower --dtype, under FSDP
    # (which needs whole weights) and with LoRA (the engine takes merged weights); otherwise it reads the policy's
    # own. SGLang (colocated, one engine per rank) holds its own weights and frees its memory in the update.
    gen_model = None
    if e.engine == "hf":
        gen_model = (models.load_model(model_path, dtype=dtype).to(device).eval()
                     if world > 1 or dtype != torch.float32 or g.lora_rank else policy)
    eng = engine_mod.build_engine(e.engine, tokenizer, model=gen_model,
                                  model_path=models.resolve(model_path) if e.engine == "sglang" else None,
                                  max_batch=e.engine_batch, deterministic=e.deterministic, lockstep=e.lockstep,
                                  dtype=e.dtype, mem_fraction_static=e.sglang_mem_fraction, seed=c.seed,
                                  server_url=e.sglang_url or None, device=device)
    ref = None
    if g.kl_coef > 0:
        ref = models.load_model(model_path, dtype=torch.float32 if world == 1 else precision.DTYPES[g.update_dtype])
        ref = ref.to(device).eval()
        packing.packed_attention(ref)
    return policy, ref, eng, gen_model is not policy, tokenizer, model_path, cfg


def load_data(args: Args, tokenizer, cfg, templates, log):
    """(training problems, held-out problems, the training order: indices into the training problems)."""
    d, seed = args.data, args.common.seed
    train_set = load_problems(d.train_data, seed=seed, n=None)
    if d.max_prompt_tokens and not args.run.eval_only:  # the official recipe drops long prompts at load time
        n_all = len(train_set)
        train_set = [p for p in train_set if len(rollout.prompt_ids(tokenizer, p.problem, p.task, cfg.tool_format,
                                                                    templates=templates, meta=p.meta))
                     <= d.max_prompt_tokens]
        if len(train_set) < n_all:
            log(f"data: dropped {n_all - len(train_set)} of {n_all} training problems whose prompt is longer than "
                f"--max-prompt-tokens {d.max_prompt_tokens}")
        if not train_set:
            raise SystemExit(f"--train-data {d.train_data}: every prompt is longer than --max-prompt-tokens "
                             f"{d.max_prompt_tokens}")
    eval_set = load_problems(d.eval_data, seed=seed + 10_007, n=d.eval_size)[:d.eval_size]  # a seed never trained on
    order = np.random.default_rng(seed).permutation(len(train_set)).tolist()  # fixed data order
    if d.data_order == "stratified":  # every third of a run has the same mix of kinds
        order = problems.stratified(order, [p.meta.get("kind") or p.task for p in train_set])
    if d.train_size:  # a pool the run passes over more than once: later steps revisit earlier problems
        if d.train_size > len(order):
            log(f"data: --train-size {d.train_size} is more than the {len(order)} training problems of "
                f"{d.train_data}: training on all of them")
        order = order[:d.train_size]
    return train_set, eval_set, order


def resume(args: Args, ckpt_path: str, policy, optimizer, scheduler, scaler, log) -> tuple[int, int]:
    """(first step, data position): 0, 0, or the checkpoint's with --resume."""
    if not args.run.resume:
        return 0, 0
    start_step, data_pos = checkpoint.load(ckpt_path, policy, optimizer, scheduler, scaler)
    log(f"resumed {os.path.dirname(ckpt_path)} at step {start_step}")
    return start_step, start_step * args.grpo.prompts_per_step if data_pos is None else data_pos  # an older ckpt


def baseline(args: Args, evaluate, step: int, model_path: str, templates, out: str, world: int, writer, log) -> None:
    """The held-out evaluation before any update (with --eval-only, of the run's current point). The step-0
    score is a function of the weights, the eval settings and the code: an earlier run's is reused (evalcache)."""
    cache = args.data.eval_cache and not args.run.eval_only and world == 1
    ev = evalcache.cached(args, model_path, templates, out, lambda: evaluate(step)) if cache else evaluate(step)
    log(f"eval step {step} | " + heldout.format_eval(ev) + (f" | cached {ev['eval_cache_key']}" if ev.get("eval_cached") else ""))
    if writer is not None:
        writer(dict(ev, step=step))


# ---------------------------------------------------------------------- the step's parts

def old_logprobs(policy, ref, batch: list, mbs: int, g, **kw) -> dict:
    """Fill batch[i].old_logp, recomputed on the final, purified tokens (as the paper's code) at the rollout's
    temperature, for every mini-batch but the first, whose come from the update's own forward pass before the
    policy moves (none at all when a step is one optimizer step); and ref_logp for a KL term. With --rollout-is,
    every mini-batch's, since the correction needs them before the update: then the engine/trainer gap and the
    correction (machinery/mismatch.py), else {}."""
    first = mbs if g.rollout_is == "none" else 0
    for b, lp in zip(batch[first:], grpo.compute_old_logprobs(policy, batch[first:], g, **kw) if batch[first:] else []):
        b.old_logp = lp
    for b, lp in zip(batch, grpo.compute_old_logprobs(ref, batch, g, **kw) if ref is not None else []):
        b.ref_logp = lp
    if g.rollout_is == "none":
        return {}
    return mismatch.measure(batch) | mismatch.correct(batch, g.rollout_is, g.rollout_is_threshold,
                                                      g.rollout_is_threshold_lower)


def gather(obj, world: int) -> list:
    """Every rank's obj, in rank order (all_gather_object); [obj] on one process."""
    parts = [obj] if world == 1 else [None] * world
    if world > 1:
        dist.all_gather_object(parts, obj)
    return parts


def sample_groups(args: Args, cfg, train_set, order, step, data_pos, rank, world, master, t, *, loop, eng, sandbox,
                  tokenizer, templates, grade):
    """This rank's share of a step's groups, rolled out, graded and rewarded (the paper's +1/-1, with DAPO's soft
    penalty near the response budget). One round of prompts_per_step groups; with --dynamic-sampling (DAPO) a
    group whose samples are all right or all wrong has zero advantage, so it is dropped and further rounds refill
    the step. Returns (trajectories, rewards, group ids, every rollout as (traj, reward, correct), the new data
    position, the sampling counts for the log)."""
    g, n = args.grpo, args.grpo.samples_per_prompt
    share = g.mini_batch_prompts // world  # each mini-batch's prompts spread over the ranks: one process's steps
    mine = [k * g.mini_batch_prompts + rank * share + i for k in range(g.prompts_per_step // g.mini_batch_prompts)
            for i in range(share)]
    t["rollout"] = t["reward"] = 0.0
    trajs, rewards, groups, seen, rounds, dropped = [], [], [], [], 0, 0
    while rounds < (g.max_sample_rounds if g.dynamic_sampling else 1):
        rounds += 1
        here = [data_pos + k for k in mine]  # data position: one round = prompts_per_step groups
        data_pos += g.prompts_per_step
        seeds = [((args.common.seed * 1_000_003 + step) * 1_000_003 + k) * 1_000_003 + j for k in here for j in range(n)]
        metas = [dict(problem_id=train_set[order[k % len(order)]].id, group=k, sample=j) for k in here for j in range(n)]
        trajs_r, correct_r = loop.run_until_complete(rollout.rollout_and_grade(
            eng, sandbox, tokenizer, [train_set[order[k % len(order)]] for k in here], cfg,
            args.saar if g.saar else None, saar_p=g.rollback_p, grade=grade, n=n, seeds=seeds, metas=metas,
            templates=templates, progress=master, times=t))
        rewards_r = [(1.0 if ok else -1.0) + reward.overlong_penalty(len(tr.response_ids), cfg.max_response_tokens,
                                                              g.overlong_buffer, g.overlong_penalty)
                     for tr, ok in zip(trajs_r, correct_r)]
        seen += zip(trajs_r, rewards_r, correct_r)
        groups_r = [m["group"] for m in metas]
        signal = grpo.groups_with_signal(groups_r, correct_r) if g.dynamic_sampling else set(groups_r)
        keep = [i for i, k in enumerate(groups_r) if k in signal]
        dropped += len(set(groups_r) - signal)
        trajs, rewards, groups = trajs + [trajs_r[i] for i in keep], rewards + [rewards_r[i] for i in keep], \
            groups + [groups_r[i] for i in keep]
        have = min(gather(len(trajs) // n, world)) if g.dynamic_sampling else len(trajs) // n  # ranks agree
        if have >= len(mine):
            break
    if g.dynamic_sampling:  # DAPO keeps a full batch; extra groups of the last round are not trained on
        cut = min(have, len(mine)) * n
        trajs, rewards, groups = trajs[:cut], rewards[:cut], groups[:cut]
    sampling = dict(sample_rounds=rounds, dropped_groups=dropped) if g.dynamic_sampling else {}
    return trajs, rewards, groups, seen, data_pos, sampling


def count_nonfinite(stats: dict, run: int, step: int, g, log, save, out: str) -> int:
    """--max-nonfinite-skips: non-finite mini-batches skipped in a row, across steps; past the limit the run
    saves a checkpoint and stops."""
    if not stats.get("nonfinite_skipped"):
        return 0 if stats else run
    whole = stats["nonfinite_trailing"] == stats["n_mini_batches"]
    run = (run if whole else 0) + stats["nonfinite_trailing"]
    log(f"step {step + 1}: skipped {stats['nonfinite_skipped']} non-finite mini-batch(es), {run} in a row")
    if run > g.max_nonfinite_skips:
        path = os.path.join(out, f"ckpt-nonfinite-step{step + 1}.pt")
        save(path)
        raise SystemExit(f"step {step + 1}: {run} non-finite mini-batches in a row, more than "
                         f"--max-nonfinite-skips {g.max_nonfinite_skips}; saved {path}")
    return run


def push_weights(args: Args, eng, policy, own_copy: bool) -> None:
    """The updated weights into the engine (its own copy: fp32, FSDP2 full tensors, LoRA merged), which flushes its
    prefix cache, since KV from the old weights must never be reused. An engine on the policy's own weights needs
    no copy, only the flush (the HF engine also packs the new weights again there)."""
    g = args.grpo
    eng.resume_memory()
    if own_copy:
        eng.update_weights(checkpoint.full_state(policy, g.lora_alpha / g.lora_rank if g.lora_rank else 0.0).items())
    else:
        eng.flush_cache()


# ---------------------------------------------------------------------- log

def step_metrics(seen, adv_stats, stats, t, world, **extra) -> dict:
    """The step's figures over every rollout (with dynamic sampling, dropped groups too) and every rank: losses
    and event counts add up over ranks, maxima are maxima, the rest are rank means."""
    trajs = [tr for tr, _, _ in seen]
    n, calls = max(1, len(trajs)), sum(tr.num_tool_calls for tr in trajs)
    events = [e for tr in trajs for e in tr.saar_events]
    ev = [e["kind"] for e in events]
    m = dict(reward=sum(r for _, r, _ in seen) / n, acc=sum(ok for _, _, ok in seen) / n, tool_calls=calls / n,
             tool_err=sum(tr.num_tool_errors for tr in trajs) / max(1, calls),
             saar_shallow=ev.count("shallow"), saar_deep=ev.count("deep"), saar_given_up=ev.count("given_up"),
             saar_answered=ev.count("answered"), resp_len=sum(len(tr.response_ids) for tr in trajs) / n,
             truncated=sum(tr.truncated for tr in trajs) / n, zero_adv_groups=adv_stats["zero_adv_groups"],
             # the policy's own error rate: first attempts only, before SAAR re-executes anything
             first_tool_err=sum(tr.num_first_errors for tr in trajs) / max(1, sum(tr.num_first_calls for tr in trajs)),
             saar_regen_tokens=sum(e.get("regen_tokens", 0) for e in events),
             saar_similarity=[round(e["similarity"], 4) for e in events
                              if e.get("similarity") is not None and e["similarity"] == e["similarity"]])
    m.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
    m.update({f"t_{k}": v for k, v in t.items()})
    m.update(extra)
    if world > 1:
        parts = gather(m, world)
        m = {k: ([x for p in parts for x in p[k]] if isinstance(m[k], list) else
                 max(p[k] for p in parts) if k.endswith("_max") else
                 sum(p[k] for p in parts) / (1 if k in SUMMED else world)) for k in m}
    return m


def format_line(m: dict) -> str:
    """The step's one grep-able line."""
    s = (f"step {m['step']:4d} | reward {m['reward']:+.3f} | acc {m['acc']:.3f} | tool_calls {m['tool_calls']:.2f} "
         f"| tool_err {m['tool_err']:.2f} | saar s/d/g {m['saar_shallow']}/{m['saar_deep']}/{m['saar_given_up']} "
         f"| resp_len {m['resp_len']:.0f} | t rollout {m['t_rollout']:.1f}s reward {m['t_reward']:.1f}s "
         f"old_logp {m['t_old_logp']:.1f}s update {m['t_update']:.1f}s sync {m['t_sync']:.2f}s")
    if m.get("skipped_steps"):
        s += f" | fp16 overflow: {m['skipped_steps']} mini-batch(es) skipped, loss scale now {m['loss_scale']:g}"
    s += f" | first_err {m['first_tool_err']:.2f}"
    if "mismatch_kl" in m:  # the engine's sampling log-probs vs the trainer's (machinery/mismatch.py)
        s += f" | mismatch_kl {m['mismatch_kl']:.1e}" + (f" spliced {m['mismatch_kl_spliced']:.1e}"
                                                         if m.get("mismatch_tokens_spliced") else "")
    if any(k.startswith("eval_") and k.endswith("_acc") for k in m):
        s += " | eval " + heldout.format_eval(m)
    return s


def finish(args: Args, out, start_step, policy, tokenizer, master, saving, sandbox, eng, loop, world, log, t_run) -> None:
    """The HF export, the last checkpoint on disk, the summary lines (the held-out gain with its paired 95% CI,
    the training reward's first and last thirds), and everything closed."""
    r, g = args.run, args.grpo
    if r.steps > start_step and not r.eval_only:
        checkpoint.save_hf(os.path.join(out, "hf"), policy, tokenizer, master, g.lora_alpha / g.lora_rank if g.lora_rank else 0.0)
    if saving is not None:
        saving.result()
    if master and args.data.eval_size:
        for line in heldout.summary(out, r.steps):
            log(line)
    for closing in (sandbox.close, eng.shutdown, loop.close):
        closing()
    if world > 1:
        dist.destroy_process_group()
    log(f"done: {out} in {time.perf_counter() - t_run:.0f} s")


if __name__ == "__main__":
    main(config.cli(Args, "GRPO + SAAR training (CLEANER)."))
