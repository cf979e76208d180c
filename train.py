"""train.py: GRPO with SAAR-purified multi-turn tool rollouts (the paper's training loop, Sec. 3-4).

Setup (models, engine, sandbox, data, optimizer: `setup`, once), then one GRPO step a screen: the rollout
(SAAR purifying failed calls), the rewards and their group advantages, the update (grpo.update, whose
micro-batch loop calls grpo.policy_loss), eval/log/checkpoint/report. Every setting is a flag of config.py.
The defaults are the CPU demo: SmolLM2-135M-Instruct warmed up by sft.py (a quarter of its conversations
fail a call and fix it, as the paper's cold start teaches), trained on generated problems at the model's
edge, markdown calls, SAAR on, the top 12 layers, temperature 0.6 (at 1.0 the 135M model writes mostly
broken code); 128 held-out problems evaluated greedily before and after, and the gain with its 95% CI.

    python train.py                                   # the CPU demo (docs/results.md)
    python train.py --model tiny-qwen3 --steps 2      # the smallest end-to-end run
    torchrun --nproc_per_node=4 train.py ...          # one node, FSDP2 over the policy (scripts/: the paper's)

Departures (docs/departures.md): the reward grades the final assistant turn; a run is reproducible from
its folder; where our default differs from the official code, --faithful sets its choice.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import config
import eval as heldout
import grpo
import reward
import rollout
import sft
import tools
from data import models, problems
from data.synth import load_problems
from machinery import checkpoint, evalcache, mismatch, precision, report
from machinery import policy as policy_mod
from machinery.policy import gather
from sandbox import Sandbox

Args = config.Train
SUMMED = {"loss", "dropped_groups", "masked_failed", "saar_shallow", "saar_deep", "saar_given_up", "saar_answered",
          "saar_regen_tokens"}


def main(args: Args):
    t_run = time.perf_counter()
    args = config.apply_faithful(config.args_of_run(args) if args.run.eval_only else args)
    r, d, g = args.run, args.data, args.grpo
    s = setup(args)
    start_step, data_pos = resume(s)
    writer = checkpoint.metric_writer(s.out, args, config.flat(args)) if s.master else None
    warn = mismatch.warn_once(g.mismatch_warn_kl, s.log)
    if d.eval_size and ((start_step == 0 and r.steps > 0) or r.eval_only):  # the held-out score before any update
        step0_eval(s, start_step, writer)
    saving = None  # the checkpoint being written, waited on before the weights change
    nonfinite_run = 0  # non-finite mini-batches skipped in a row, across steps
    for step in range(start_step, start_step if r.eval_only else r.steps):
        t = {}  # seconds per phase
        t_step = time.perf_counter()
        step_pos = data_pos
        # -------------------------------------------------------------- rollout
        # this rank's groups, rolled out (SAAR purifying failed calls) and graded, +1/-1 as rewards
        trajs, rewards, groups, seen, data_pos, sampling = sample_groups(s, step, data_pos, t)
        # -------------------------------------------------------------- rewards
        t0 = time.perf_counter()  # group advantages over every rank's rollouts (groups never straddle ranks)
        all_rewards = [x for part in gather(rewards, s.world) for x in part]
        all_groups = [x for part in gather(groups, s.world) for x in part]
        adv, adv_stats = grpo.compute_advantages(all_rewards, all_groups, norm_std=g.norm_adv_std,
                                                 baseline=g.baseline)
        mine = adv[s.rank * len(rewards):(s.rank + 1) * len(rewards)].tolist()
        masked = [g.mask_failed and grpo.every_call_failed(tr) for tr in trajs]  # --mask-failed: no gradient
        batch = [grpo.TrainSeq.of(tr, a, trained=not m) for tr, a, m in zip(trajs, mine, masked)]  # nor the prompt
        t["reward"] += time.perf_counter() - t0
        # -------------------------------------------------------------- update
        # an optimizer step per mini-batch on grpo.policy_loss, over the purified tokens of mask 1:
        #   ratio = exp(logp - old_logp)    (old_logp recomputed on the purified tokens, below)
        #   loss  = agg(max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)))    --agg token-mean
        #           with A < 0 capped at -A * dual_clip_c, + kl_coef * KL(ref) when --kl-coef
        t0 = time.perf_counter()
        mbs = g.mini_batch_prompts * g.samples_per_prompt // s.world
        drift = old_logprobs(s, batch, mbs)
        t["old_logp"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        saving = saving and saving.result()  # the last checkpoint holds the live tensors: on disk before the update
        s.eng.release_memory()  # colocated SGLang: its GPU memory to the update (HF: nothing to give)
        sched = s.scheduler if g.warmup_unit == "optimizer" else None
        try:  # no batch: --dynamic-sampling found no group with a signal
            stats = {} if not batch else grpo.update(
                s.policy, s.optimizer, sched, batch, g, args.machinery.update, mini_batch_size=mbs,
                max_len=s.cfg.max_response_tokens, temperature=s.cfg.temperature, scaler=s.scaler,
                autocast_dtype=s.amp)
        except grpo.NonFiniteLossError as e:  # no optimizer step took the bad gradient: keep it and stop
            path = save_nonfinite(s, step, step, step_pos)
            raise SystemExit(f"step {step + 1}: {e}\nweights are unchanged by the bad update; saved {path}. "
                             f"The last regular checkpoint is {s.ckpt_path}.")
        if g.rollout_is == "none":  # engine vs trainer, no extra pass
            drift = mismatch.measure(batch)
        nonfinite_run = count_nonfinite(s, stats, nonfinite_run, step, data_pos)
        if g.warmup_unit == "train":
            s.scheduler.step()  # veRL: once per training step, after the update
        t["update"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        push_weights(s)
        t["sync"] = time.perf_counter() - t0
        # -------------------------------------------------------------- eval / log / ckpt / report
        m = step_metrics(seen, adv_stats, stats, t, s.world, adv_n=len(all_rewards), masked_failed=sum(masked),
                         **sampling, **drift)
        m["step"] = step + 1
        evaluated = d.eval_size and ((d.eval_every and (step + 1) % d.eval_every == 0) or step + 1 == r.steps)
        if evaluated:
            m.update(evaluate(s, step + 1))
        m["t_wall"] = time.perf_counter() - t_step
        if s.master:
            warn(m)  # once, when the engine's log-probs are far from the trainer's: stale weights?
            s.log(format_line(m))
            writer(m)
            checkpoint.dump_rollouts(s.out, step + 1, seen[:r.dump_rollouts], s.tokenizer)
            if evaluated and step + 1 < r.steps:  # the run's page so far (and at the end, below)
                report.safely(s.out)
        if (step + 1) % r.save_every == 0 or step + 1 == r.steps:
            saving = checkpoint.save(s.ckpt_path, s.policy, s.optimizer, s.scheduler, s.scaler, step + 1,
                                     s.master, data_pos=data_pos, background=True)
    finish(s, start_step, saving, t_run)


# ---------------------------------------------------------------------- setup

@dataclasses.dataclass
class Setup:
    """What `setup` builds once and the step's parts read (the loop's own state is not here)."""
    args: Args
    rank: int
    world: int
    log: Callable  # print on the master, nothing elsewhere
    out: str  # the run folder
    ckpt_path: str
    cfg: config.Rollout  # args.rollout, its tool format resolved
    templates: dict | None  # --prompt-template's wording
    tokenizer: object
    model_path: str  # the warm start (or --model)
    policy: torch.nn.Module
    ref: torch.nn.Module | None  # the reference model of a KL term
    eng: object  # machinery/hf_engine.py's HFEngine or sglang_engine.py's SGLangEngine
    own_copy: bool  # the engine decodes with its own copy of the weights
    amp: torch.dtype | None  # the update's autocast dtype (None: the weights' own)
    scaler: precision.LossScaler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sandbox: Sandbox
    loop: asyncio.AbstractEventLoop
    train_set: list
    eval_set: list
    order: list[int]  # the training order: indices into train_set
    grade: Callable  # (problem, trajectory) -> right or wrong

    @property
    def master(self) -> bool:
        return self.rank == 0


def setup(args: Args) -> Setup:
    """Processes, the run folder, the models, the engine, the sandbox, the data, the optimizer."""
    g = args.grpo
    how = args.machinery.update
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    log = functools.partial(print, flush=True) if rank == 0 else (lambda *_: None)  # the master prints
    out, ckpt_path = checkpoint.prepare_run(args, world, rank == 0, config.flat(args))
    raw = read_data(args)  # a missing or malformed file stops the run here, before any model loads
    # before the process group: the machine's caches are built once, by whichever rank comes first, and
    # transformers saves a model only on rank 0 of a process group
    model_path, cfg = cold_start(args)
    if rank == 0 and not args.run.eval_only:  # runs are paired only on the same cold start (scripts/experiment.py)
        checkpoint.note_in_run_info(out, cold_start=os.path.basename(os.path.normpath(model_path)))
    device = policy_mod.init_distributed(args.machinery.engine.device)
    tokenizer = models.load_tokenizer(model_path)
    policy, ref, eng, own_copy = policy_mod.build(args, functools.partial(models.load_model, model_path),
                                                  models.resolve(model_path), tokenizer, device, world, log)
    amp = None if world > 1 or how.update_dtype == "float32" else precision.DTYPES[how.update_dtype]  # one process
    scaler = precision.loss_scaler(how)
    templates = rollout.load_prompt_template(cfg.prompt_template) if cfg.prompt_template else None
    sb = args.machinery.sandbox
    sandbox = Sandbox(slots=sb.sandbox_slots, timeout_s=sb.tool_timeout_s, memory_mb=sb.tool_memory_mb,
                      hide=(os.path.abspath(args.run.out_dir),), clock=sb.tool_clock)
    prompt_len = lambda p: len(rollout.prompt_ids(tokenizer, p.problem, p.task, cfg.tool_format,  # noqa: E731
                                                  templates=templates, meta=p.meta))
    (train_set, order), eval_set = problems.training_order(raw[0], args.data, args.common.seed, log, prompt_len,
                                                           drop_long=not args.run.eval_only), raw[1]

    def grade(problem, traj) -> bool:  # right or wrong: the final turn's answer, by reward.py (training and eval)
        return reward.grade(problem.task, traj.final_text(tokenizer), answer=problem.answer, tests=problem.tests,
                            sandbox=sandbox, math_grader=args.data.math_grader)

    optimizer, scheduler = grpo.make_optimizer(policy, lr=g.lr, weight_decay=g.weight_decay,
                                               warmup_steps=g.warmup_steps, from_zero=g.warmup_unit == "train")
    return Setup(args=args, rank=rank, world=world, log=log, out=out, ckpt_path=ckpt_path, cfg=cfg,
                 templates=templates, tokenizer=tokenizer, model_path=model_path, policy=policy, ref=ref, eng=eng,
                 own_copy=own_copy, amp=amp, scaler=scaler, optimizer=optimizer, scheduler=scheduler,
                 sandbox=sandbox, loop=asyncio.new_event_loop(), train_set=train_set, eval_set=eval_set,
                 order=order, grade=grade)


def cold_start(args: Args) -> tuple[str, config.Rollout]:
    """(the model to train: --model, or its cold start, cached; the rollout config, its tool format resolved)."""
    c = args.common
    try:  # bad settings stop the run here, before a model is trained or loaded
        cfg = rollout.settle(c.model, args.rollout, args.saar if args.saar.saar else None)
    except (OSError, ValueError) as e:
        raise SystemExit(str(e)) from None
    if args.run.warm_start and c.model in models.OFFLINE and cfg.tool_format != "none":  # cached after once
        return sft.warm_start(c.model, tool_format=cfg.tool_format, seed=c.seed, fix_fraction=args.run.warm_start_fix,
                              tool_output_chars=cfg.tool_output_chars), cfg
    return c.model, cfg


def read_data(args: Args) -> tuple[list, list]:
    """(training problems, held-out problems) as their files hold them; a missing file stops the run."""
    d = args.data
    try:  # the held-out set: from a seed never trained on
        return (load_problems(d.train_data, seed=args.common.seed, n=None),
                load_problems(d.eval_data, seed=args.common.seed + 10_007, n=d.eval_size)[:d.eval_size])
    except (OSError, problems.DataError) as e:
        raise SystemExit(f"data: {e}") from None


def resume(s: Setup) -> tuple[int, int]:
    """(first step, data position): 0, 0, or the checkpoint's with --resume."""
    if not s.args.run.resume:
        return 0, 0
    start_step, data_pos = checkpoint.load(s.ckpt_path, s.policy, s.optimizer, s.scheduler, s.scaler)
    s.eng.release_memory()  # the engine was built on the cold start's weights: it samples the next step from these,
    push_weights(s)  # pushed as after an update (which releases the engine's memory first)
    s.log(f"resumed {s.out} at step {start_step}")
    if data_pos is None:  # an older checkpoint
        data_pos = start_step * s.args.grpo.prompts_per_step
    return start_step, data_pos


def evaluate(s: Setup, step: int) -> dict:
    """The held-out evaluation (eval.held_out) of the policy now, its records in the run folder."""
    return heldout.held_out(s.loop, s.eng, s.sandbox, s.tokenizer, s.eval_set, s.args, step=step,
                            out_dir=s.out if s.master else None, rollout_cfg=s.cfg, templates=s.templates,
                            grade=s.grade, rank=s.rank, world=s.world)


def step0_eval(s: Setup, step: int, writer) -> None:
    """The held-out evaluation before any update (with --eval-only, of the run's current point). The
    step-0 score is a function of the weights, the eval settings and the code: an earlier run's is
    reused (evalcache)."""
    if s.args.data.eval_cache and not s.args.run.eval_only:
        ev = evalcache.cached(heldout.step0_key(s.args, s.model_path, s.templates), s.out if s.master else None,
                              lambda: evaluate(s, step), agree=lambda ev: gather(ev, s.world)[0])
    else:
        ev = evaluate(s, step)
    cached = f" | cached {ev['eval_cache_key']}" if ev.get("eval_cached") else ""
    s.log(f"eval step {step} | " + heldout.format_eval(ev) + cached)
    if writer is not None:
        writer(dict(ev, step=step))


# ---------------------------------------------------------------------- the step's parts

def sample_groups(s: Setup, step: int, data_pos: int, t: dict):
    """This rank's share of a step's groups, rolled out, graded and rewarded (the paper's +1/-1,
    with DAPO's soft penalty near the response budget). One round of prompts_per_step groups; with
    --dynamic-sampling (DAPO) a group whose samples are all right or all wrong has zero advantage,
    so it is dropped and further rounds refill the step. Returns (trajectories, rewards, group ids,
    every rollout as (traj, reward, correct), the new data position, the sampling counts)."""
    args = s.args
    g = args.grpo
    n = g.samples_per_prompt
    share = g.mini_batch_prompts // s.world  # each mini-batch's prompts spread over the ranks
    mine = [k * g.mini_batch_prompts + s.rank * share + i for k in range(g.prompts_per_step // g.mini_batch_prompts)
            for i in range(share)]
    saar = args.saar if args.saar.saar else None
    t["rollout"] = t["reward"] = 0.0
    trajs = []
    rewards = []
    groups = []
    seen = []  # every rollout, dropped groups' too: (trajectory, reward, correct)
    rounds = 0
    dropped = 0
    while rounds < (g.max_sample_rounds if g.dynamic_sampling else 1):
        rounds += 1
        here = [data_pos + k for k in mine]  # data position: one round = prompts_per_step groups
        data_pos += g.prompts_per_step
        problems_r = [s.train_set[s.order[k % len(s.order)]] for k in here]
        seeds = [rollout.seed_of(args.common.seed, step, k, j) for k in here for j in range(n)]
        metas = [dict(problem_id=p.id, group=k, sample=j) for k, p in zip(here, problems_r) for j in range(n)]
        trajs_r, correct_r = s.loop.run_until_complete(rollout.rollout_and_grade(
            s.eng, s.sandbox, s.tokenizer, problems_r, s.cfg, saar, grade=s.grade,
            n=n, seeds=seeds, metas=metas, templates=s.templates, progress=s.master, times=t))
        rewards_r = [reward.training_reward(ok, len(tr.response_ids), s.cfg.max_response_tokens, g)
                     for tr, ok in zip(trajs_r, correct_r)]
        seen += zip(trajs_r, rewards_r, correct_r)
        groups_r = [m["group"] for m in metas]
        signal = grpo.groups_with_signal(groups_r, correct_r) if g.dynamic_sampling else set(groups_r)
        keep = [i for i, k in enumerate(groups_r) if k in signal]
        dropped += len(set(groups_r) - signal)
        trajs += [trajs_r[i] for i in keep]
        rewards += [rewards_r[i] for i in keep]
        groups += [groups_r[i] for i in keep]
        have = min(gather(len(trajs) // n, s.world)) if g.dynamic_sampling else len(trajs) // n  # ranks agree
        if have >= len(mine):
            break
    if not g.dynamic_sampling:
        return trajs, rewards, groups, seen, data_pos, {}
    cut = min(have, len(mine)) * n  # DAPO keeps a full batch; extra groups of the last round are not trained on
    sampling = dict(sample_rounds=rounds, dropped_groups=dropped)
    return trajs[:cut], rewards[:cut], groups[:cut], seen, data_pos, sampling


def old_logprobs(s: Setup, batch: list, mbs: int) -> dict:
    """Fill batch[i].old_logp, recomputed on the final, purified tokens (as the paper's code) at the
    rollout's temperature, for every mini-batch but the first, whose come from the update's own
    forward pass before the policy moves (none at all when a step is one optimizer step); and
    ref_logp for a KL term. With --rollout-is, every mini-batch's, since the correction needs them
    before the update: then the engine/trainer gap and the correction (machinery/mismatch.py);
    else {}."""
    g = s.args.grpo
    kw = dict(temperature=s.cfg.temperature, autocast_dtype=s.amp)
    how = s.args.machinery.update
    todo = batch[mbs if g.rollout_is == "none" else 0:]
    for b, lp in zip(todo, grpo.compute_old_logprobs(s.policy, todo, how, **kw) if todo else []):
        b.old_logp = lp
    for b, lp in zip(batch, grpo.compute_old_logprobs(s.ref, batch, how, **kw) if s.ref is not None else []):
        b.ref_logp = lp
    if g.rollout_is == "none":
        return {}
    return mismatch.measure(batch) | mismatch.correct(batch, g.rollout_is, g.rollout_is_threshold,
                                                      g.rollout_is_threshold_lower)


def save_nonfinite(s: Setup, step: int, at: int, data_pos: int) -> str:
    """The weights a non-finite update did not touch, as a checkpoint of step `at`: its path."""
    path = os.path.join(s.out, f"ckpt-nonfinite-step{step + 1}.pt")
    checkpoint.save(path, s.policy, s.optimizer, s.scheduler, s.scaler, at, s.master, data_pos=data_pos)
    return path


def count_nonfinite(s: Setup, stats: dict, run: int, step: int, data_pos: int) -> int:
    """--max-nonfinite-skips: non-finite mini-batches skipped in a row, across steps; past the limit
    the run saves a checkpoint and stops."""
    if not stats.get("nonfinite_skipped"):
        return 0 if stats else run
    whole = stats["nonfinite_trailing"] == stats["n_mini_batches"]
    run = (run if whole else 0) + stats["nonfinite_trailing"]
    s.log(f"step {step + 1}: skipped {stats['nonfinite_skipped']} non-finite mini-batch(es), {run} in a row")
    limit = s.args.machinery.update.max_nonfinite_skips
    if run > limit:
        path = save_nonfinite(s, step, step + 1, data_pos)
        raise SystemExit(f"step {step + 1}: {run} non-finite mini-batches in a row, more than "
                         f"--max-nonfinite-skips {limit}; saved {path}")
    return run


def push_weights(s: Setup) -> None:
    """The updated weights into the engine (its own copy: fp32, FSDP2 full tensors, LoRA merged),
    which flushes its prefix cache, since KV from the old weights must never be reused. An engine on
    the policy's own weights needs no copy, only the flush (the HF engine also packs the new weights
    again there)."""
    g = s.args.grpo
    s.eng.resume_memory()
    if s.own_copy:
        s.eng.update_weights(checkpoint.full_state(s.policy, policy_mod.lora_scale(g)).items())
    else:
        s.eng.flush_cache()


# ---------------------------------------------------------------------- log

def step_metrics(seen, adv_stats, stats, t, world, **extra) -> dict:
    """The step's figures over every rollout (with dynamic sampling, dropped groups too) and every
    rank: losses and event counts add up over ranks, maxima are maxima, the rest are rank means."""
    trajs = [tr for tr, _, _ in seen]
    n = max(1, len(trajs))
    calls = sum(tr.num_tool_calls for tr in trajs)
    first_calls = sum(tr.num_first_calls for tr in trajs)
    events = [e for tr in trajs for e in tr.saar_events]
    ev = [e["kind"] for e in events]
    m = dict(reward=sum(r for _, r, _ in seen) / n, acc=sum(ok for _, _, ok in seen) / n, tool_calls=calls / n,
             tool_err=sum(tr.num_tool_errors for tr in trajs) / max(1, calls),
             saar_shallow=ev.count("shallow"), saar_deep=ev.count("deep"), saar_given_up=ev.count("given_up"),
             saar_answered=ev.count("answered"), resp_len=sum(len(tr.response_ids) for tr in trajs) / n,
             truncated=sum(tr.truncated for tr in trajs) / n, zero_adv_groups=adv_stats["zero_adv_groups"],
             # the policy's own error rate: first attempts only, before SAAR re-executes anything
             first_tool_err=sum(tr.num_first_errors for tr in trajs) / max(1, first_calls),
             saar_regen_tokens=sum(e.get("regen_tokens", 0) for e in events),
             saar_similarity=[round(e["similarity"], 4) for e in events
                              if e.get("similarity") is not None and e["similarity"] == e["similarity"]])
    for name in [*tools.TOOLS, "malformed"]:  # per tool: calls per trajectory, errors per call
        used = [tr.tool_use.get(name, (0, 0)) for tr in trajs]
        m[f"tool_calls_{name}"] = sum(u[0] for u in used) / n
        m[f"tool_err_{name}"] = sum(u[1] for u in used) / max(1, sum(u[0] for u in used))
    m.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
    m.update({f"t_{k}": v for k, v in t.items()})
    m.update(extra)
    if world > 1:
        parts = gather(m, world)
        m = {k: ([x for p in parts for x in p[k]] if isinstance(m[k], list) else
                 max(p[k] for p in parts) if k.endswith("_max") else
                 sum(p[k] for p in parts) if k in SUMMED else sum(p[k] for p in parts) / world) for k in m}
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
    if m.get("masked_failed"):
        s += f" | masked {m['masked_failed']}"  # --mask-failed: trajectories whose every call failed, not trained on
    if "mismatch_kl" in m:  # the engine's sampling log-probs vs the trainer's (machinery/mismatch.py)
        spliced = f" spliced {m['mismatch_kl_spliced']:.1e}" if m.get("mismatch_tokens_spliced") else ""
        s += f" | mismatch_kl {m['mismatch_kl']:.1e}" + spliced
    if any(k.startswith("eval_") and k.endswith("_acc") for k in m):
        s += " | eval " + heldout.format_eval(m)
    return s


def finish(s: Setup, start_step: int, saving, t_run: float) -> None:
    """The HF export, the last checkpoint on disk, the summary lines (the held-out gain with its
    paired 95% CI, the training reward's first and last thirds), and everything closed."""
    r = s.args.run
    if r.steps > start_step and not r.eval_only:
        checkpoint.save_hf(os.path.join(s.out, "hf"), s.policy, s.tokenizer, s.master, policy_mod.lora_scale(s.args.grpo))
    if saving is not None:
        saving.result()
    if s.master and s.args.data.eval_size:
        for line in heldout.summary(s.out, r.steps):
            s.log(line)
    if s.master:
        s.log(f"report: {report.safely(s.out)}")
    for closing in (s.sandbox.close, s.eng.shutdown, s.loop.close):
        closing()
    if s.world > 1:
        dist.barrier()  # gloo aborts a rank that tears down while its peer's last collective is in flight
        dist.destroy_process_group()
    s.log(f"done: {s.out} in {time.perf_counter() - t_run:.0f} s")


if __name__ == "__main__":
    main(config.cli(Args, "GRPO + SAAR training (CLEANER)."))
