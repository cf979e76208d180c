"""train.py: GRPO with SAAR-purified multi-turn tool rollouts (the paper's training loop, Sec. 3-4).

Reads top to bottom: args, setup, model, data, optimizer, then the loop (rollout, rewards,
update, eval/log/ckpt). The defaults are the CPU demo: SmolLM2-135M-Instruct, warmed up by
sft.py on easy generated problems, trained on generated problems that need code ("medium": naive
code works, hand work does not), with the markdown tool format and SAAR on. It evaluates 128
held-out problems greedily before the first step and after the last, and ends with the gain and its
paired 95% CI. The paper's runs are in scripts/ with its values (lr 2e-6, 128 prompts x 16 samples,
mini-batch 32, 16 turns, 20480 response tokens, 4096 overlong buffer, temperature 1.0, all layers).

The demo's own choices, for 2 CPU cores and a 135M model: temperature 0.6 (at 1.0 the warm-started
model's pass rate is ~10%, at 0.6 ~40%, where GRPO groups carry signal); three problem kinds at the
model's edge (primes, digit sums, coprime counts: 29-59% greedy after the three seeds' warm starts;
shopping totals and recurrences stay at 0% and Collatz counts at 100%, so their groups carry no signal);
only the top 12 of 30 layers train (--train-layers; the frozen bottom gets no backward pass); lr 3e-5;
13 steps of 4 prompts x 4 samples, each in two optimizer steps, over a pool of 32 problems
(--train-size: steps 9-13 revisit the problems of steps 1-5, so 12 of the 16 problems in the summary's
last third of the training reward are the first third's); a cold start in which a quarter of the
conversations make a broken call, read the sandbox's real error and call again (--warm-start-fix 0.25:
the paper's cold start teaches retrying; without it the model mostly answers after an error, which
leaves SAAR little to purify). Packed rows attend sequence by sequence (grpo.packed_attention), which
halved the update's time here, and on CPU the engine decodes with a copy of the weights laid out
column-major (engine.column_major, --engine-column-major), which took a third off two steps' rollouts
side by side. A group's samples share one copy of their prompt in the packed rows (--share-prompts:
20-30% off the update, side by side), and checkpoints are written while the next step rolls out.
--update-dtype bfloat16 --no-packed was as fast, but changes the numbers (docs/results.md, the speed
probe); the three seeds' figures are in float32.

    python train.py                                   # CPU demo: 17.5-23 min; 13-14.5 with its cold start and step-0 eval cached
    python train.py --model tiny-qwen3 --steps 2      # the smallest end-to-end run
    torchrun --nproc_per_node=4 train.py ...          # one node, FSDP2 over the policy

Departures from the official veRL recipe: the reward grades the final assistant turn (the official
math reward reads the tail of the decoded response, tool output included); a run is reproducible from
its folder (args, commit, diff, package versions, seed), and a checkpoint holds the RNG states and the
data position, so --resume continues exactly. Where our default differs from the official code, a flag
gives the official choice (--warmup-unit train, --agg verl-token-mean, --math-grader strict-box,
--tool-echo, --tool-header, --repair-json, --no-tool-cap-ends, --sim-eos); --faithful sets them all
(FAITHFUL), the paper's scripts pass it, and the README's Departures table lists them.
--dynamic-sampling (DAPO) is off, as in the paper.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass


@dataclass
class Args:
    # run
    run_name: str = ""
    """name of the output folder under out_dir (default: a timestamp)"""
    out_dir: str = "out"
    """where runs are written"""
    seed: int = 0
    """seed for data order, sampling and SAAR draws"""
    steps: int = 13
    """number of GRPO steps"""
    resume: bool = False
    """continue the run in out_dir/run from its last checkpoint"""
    faithful: bool = False
    """the official code's choice wherever ours differs (FAITHFUL, below; README: Departures); it overrides them"""
    eval_only: bool = False
    """evaluate the held-out set of an existing run and stop: its warm start (step 0), or its checkpoint with
    --resume; the run's settings (run.json) are kept but for the eval flags, and the records join its
    eval_step*.jsonl, metrics.jsonl and summary (e.g. --eval-saar on after a run evaluated with it off)"""
    # model
    model: str = "smollm2-135m"
    """local folder, hub id, or offline name (smollm2-135m, tiny-qwen3, tiny-bytes)"""
    warm_start: bool = True
    """run sft.py's cold start first when the model is an offline base model (cached)"""
    warm_start_fix: float = 0.25
    """share of the cold start's conversations that fail a call and fix it (sft.py --fix-fraction; 0: none)"""
    # data
    train_data: str = "synth-medium:primes,digit_sum,coprime"
    """generated problems: 'synth-medium' (naive code works, hand work does not), 'synth' (naive code times out),
    'synth-warmup' (the cold start's easy ones), optionally ':kind,kind' (of data/synth.py's KINDS); or a named set
    (math_train, aime_train, leetcode_train), a JSONL path"""
    eval_data: str = "synth-medium:primes,digit_sum,coprime"
    """held-out problems: a 'synth*' spec as above (from a seed never trained on), a named set or a JSONL path"""
    eval_size: int = 128
    """held-out problems, evaluated before the first step and after the last (0: no evaluation)"""
    eval_every: int = 0
    """also evaluate every N steps (0: only before the first step and after the last)"""
    eval_sampled: bool = False
    """score the held-out set at the rollout temperature too, not only greedy"""
    eval_cache: bool = True
    """reuse the step-0 evaluation of an earlier run that scored the same weights (hashed) with the same eval
    settings and code (<cache>/eval; a run of the same cold start with other training flags shares it)"""
    data_order: str = "shuffle"
    """shuffle: one seeded permutation of the training set (veRL's sampler); stratified: that permutation with
    problem kinds (synth's kind, else the task) taken in turn, so every step and third of a run sees the same mix"""
    train_size: int = 32
    """train on the first N problems of that order, in passes (0, or more than the set: all of it). With the
    demo's 32, steps 9-13 revisit steps 1-5's problems: its reward's first and last thirds share 12 of 16"""
    # rollout
    tool_format: str = "markdown"
    """hermes (Qwen, the paper), markdown (```python blocks, SmolLM2) or none (no-tool baseline)"""
    prompt_template: str = ""
    """a JSON file of prompt templates by task ({problem}, {tool}) and an optional system prompt, e.g. the
    official wording (rollout.load_prompt_template; default: ours, rollout.PROMPTS)"""
    prompts_per_step: int = 4
    """prompts per GRPO step (paper: 128)"""
    samples_per_prompt: int = 4
    """rollouts per prompt, the GRPO group (paper: 16)"""
    max_turns: int = 4
    """assistant turns per trajectory (paper: 16)"""
    max_response_tokens: int = 256
    """response budget per trajectory, tool tokens included (paper: 20480)"""
    max_prompt_tokens: int = 2560
    """training problems whose templated prompt is longer are dropped at load time, and counted (official: 2560;
    0 keeps all)"""
    max_turn_tokens: int = 0
    """cap on one assistant turn (0: the remaining budget, as the paper's code)"""
    max_tool_calls: int = 30
    """tool executions per trajectory, SAAR retries included"""
    tool_cap_ends: bool = True
    """reaching --max-tool-calls ends the trajectory; --no-tool-cap-ends: only SAAR stops, and later calls still
    run (the official code)"""
    last_turn_calls: bool = True
    """a call in the last allowed turn (--max-turns) runs; --no-last-turn-calls: the trajectory ends there with
    the call unrun (the official code)"""
    temperature: float = 0.6
    """rollout temperature (paper: 1.0; the 135M demo model writes mostly broken code at 1.0)"""
    top_p: float = 1.0
    """rollout top-p"""
    tool_output_chars: int = 256
    """tool output shown to the model, cut in the middle (paper: 256)"""
    error_format: str = "full"
    """model-facing error: full (stdout + compact traceback) or last_line"""
    stateful: bool = False
    """a persistent Python session per trajectory (the paper's tool is stateless)"""
    tool_echo: bool = False
    """a stateless call also prints the repr of its final bare expression when not None (the official tool)"""
    tool_header: bool = False
    """tool output headed by a success or failure line, its streams labelled, as the official tool lays it out
    (rollout.headed_text)"""
    repair_json: bool = False
    """parse hermes calls with json_repair, as the official parser does (off: strict JSON, a broken call fails)"""
    engine: str = "hf"
    """hf (transformers, any device) or sglang (GPU: an in-process SGLang engine per rank, colocated)"""
    engine_batch: int = 32
    """most sequences the HF engine decodes at once"""
    engine_column_major: bool = True
    """on CPU, the HF engine decodes with its own copy of the weights, linear weights column-major (engine.column_major:
    MKL multiplies a decode step's few rows faster so), refreshed after each update; off: the policy's own weights"""
    sglang_mem_fraction: float = 0.5
    """GPU memory share of each SGLang engine (KV cache and weights; the paper: 0.8 with offloaded training)"""
    sglang_url: str = ""
    """use an already running SGLang server at this URL instead of an in-process engine"""
    # SAAR
    saar: bool = True
    """purify failed tool calls with SAAR"""
    rollback_p: float = 1.0
    """curriculum mixing: probability a trajectory uses SAAR (paper: 1.0 for 4B, 0.7 for 7B)"""
    gamma: float = 0.5
    """similarity threshold: >= gamma shallow (keep old reasoning), else deep"""
    max_retries: int = 3
    """regenerations per failed turn before giving up"""
    sim_on: str = "call"
    """similarity on the decoded call text (official code) or on the extracted code (paper text)"""
    sim_eos: bool = False
    """with --sim-on call, the call text runs to the end of the turn, <|im_end|> included, as the official loop
    generates it (ours stops at the end of the call)"""
    feedback_instruction: bool = False
    """add an explicit 'fix the error' line to the error feedback"""
    is_mode: str = "none"
    """importance correction for replaced tokens: none (official), token (truncated weight) or gate"""
    is_cap: float = 2.0
    """truncation of the per-token importance weight (is_mode=token)"""
    is_gate: float = 0.1
    """keep the error when the sequence-level ratio falls below this (is_mode=gate)"""
    eval_saar: str = "off"
    """test-time SAAR in the held-out eval: off (the policy's own tool use), on (the paper's evals) or both"""
    # GRPO
    math_grader: str = "math-verify"
    """the +1/-1 reward of math problems: math-verify on the last boxed answer (ours), or strict-box (the official
    reward: the last boxed answer within the last 100 characters, equal to the gold answer as a string)"""
    lr: float = 3e-5
    """AdamW learning rate (paper: 2e-6 for 4B, 1e-6 for 7B)"""
    warmup_steps: int = 2
    """linear warmup length, in --warmup-unit steps (paper: 20)"""
    warmup_unit: str = "optimizer"
    """optimizer (the scheduler steps after each optimizer step, from 1/warmup_steps) or train (veRL: once per
    GRPO step, from 0, so the first step does not move the weights and 20 warmup steps span 20 GRPO steps)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    mini_batch_prompts: int = 2
    """prompts per optimizer step; several per GRPO step (paper: 32 of 128)"""
    train_layers: int = 12
    """train only the top N decoder layers and the final norm (0: all, as the paper); the frozen bottom gets no
    backward pass"""
    lora_rank: int = 0
    """LoRA adapters of this rank on the trained layers' linear weights instead of training the weights (0: off, as
    the paper; peft): no weight gradients for the frozen weights, a tiny optimizer state"""
    lora_alpha: float = 32.0
    """LoRA scale numerator: the adapters' update is scaled by lora_alpha / lora_rank"""
    max_tokens_per_micro: int = 4096
    """token budget of one micro-batch"""
    packed: bool = True
    """pack trajectories into micro-batch rows, attended one by one (grpo.packed_attention); --no-packed pads rows"""
    share_prompts: bool = True
    """packed rows hold a group's samples behind one copy of their prompt: the same loss and gradient, up to
    float rounding, for ~30% fewer tokens in the demo (grpo.shared_prompts)"""
    clip_low: float = 0.2
    """PPO clip below 1"""
    clip_high: float = 0.28
    """PPO clip above 1 (clip-higher)"""
    dual_clip_c: float = 10.0
    """dual-clip bound for negative advantages (0: off)"""
    agg: str = "token-mean"
    """loss aggregation: token-mean (over the mini-batch), seq-mean-token-sum, seq-mean-token-mean,
    seq-mean-token-sum-norm (Dr.GRPO), verl-token-mean (veRL: a token-mean per micro-batch, weighted by its sequences)"""
    norm_adv_std: bool = True
    """divide advantages by the group std (off: Dr.GRPO)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose samples are all right or all wrong (zero advantage) and roll out
    further rounds of prompts_per_step prompts until the step has prompts_per_step groups (the paper: off)"""
    max_sample_rounds: int = 3
    """with --dynamic-sampling, the most rollout rounds a step takes; then it trains on the groups it has"""
    kl_coef: float = 0.0
    """KL penalty to the initial policy (paper: 0)"""
    kl_type: str = "low_var_kl"
    """kl (k1) or low_var_kl (k3)"""
    overlong_buffer: int = 64
    """DAPO overlong penalty ramps over the last this many tokens of the budget (paper: 4096)"""
    overlong_penalty: float = 1.0
    """penalty at the full budget (paper: 1.0)"""
    grad_clip: float = 1.0
    """gradient norm clip"""
    max_nonfinite_skips: int = 0
    """non-finite mini-batches skipped in a row before the run stops (0: the first one stops it, the weights
    untouched and saved; veRL skips them all)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass"""
    loss_scale: float = 0.0
    """initial loss scale of the backward pass (0: 1024 with --dtype float16, else 1)"""
    loss_scale_growth: int = 200
    """with float16, a dynamic scale: an overflow skips its mini-batch and halves the scale, and this many
    good steps double it (0: static, an overflow stops the run)"""
    offload: bool = False
    """FSDP2: keep parameters, gradients and optimizer state on the CPU (the paper's param/optimizer offload)"""
    # sandbox
    sandbox_slots: int = 2
    """cells executing at once"""
    tool_timeout_s: float = 4.0
    """per-call time limit (paper: 4 s)"""
    tool_memory_mb: int = 1024
    """per-call address-space limit"""
    # system
    device: str = "auto"
    """cpu, cuda, or auto"""
    dtype: str = "float32"
    """dtype of the rollout engine's weights: float32, bfloat16 or float16 (the paper's code); on one process a
    float32 HF engine decodes with the policy's own weights, another dtype gets a copy, refreshed after each update"""
    update_dtype: str = "float32"
    """compute dtype of the update's and the old log-probs' forward and backward passes (float32, bfloat16, float16);
    the weights and optimizer state stay float32: torch.autocast on one process, FSDP2's MixedPrecisionPolicy"""
    deterministic: bool = False
    """bit-exact runs: one request at a time in the engine, deterministic kernels"""
    save_every: int = 1
    """checkpoint every N steps"""
    dump_rollouts: int = 4
    """full trajectories written as JSONL per step"""
    wandb_project: str = ""
    """log to this wandb project (wandb is imported only when set)"""


# --faithful: the official code's (Open-CLEANER, veRL) choices where our defaults differ, in one place
FAITHFUL = dict(warmup_unit="train", agg="verl-token-mean", math_grader="strict-box", tool_echo=True,
                tool_header=True, repair_json=True, tool_cap_ends=False, last_turn_calls=False, sim_eos=True,
                max_prompt_tokens=2560)


SUMMED = {"loss", "dropped_groups", "saar_shallow", "saar_deep", "saar_given_up", "saar_answered", "saar_regen_tokens"}  # per-rank sums


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 until max_len - buffer, then a linear ramp to -factor."""
    if buffer <= 0:
        return 0.0
    return min(0.0, -(length - (max_len - buffer)) / buffer * factor)


def load_problems(spec: str, *, seed: int, n: int | None):
    from data import problems, synth
    if spec.split(":")[0] in ("synth", "synth-medium", "synth-warmup"):  # synth[-level][:kind,kind,...]
        level, _, kinds = spec.partition(":")
        return synth.make_problems(n or 4096, seed, difficulty={"synth": "rl"}.get(level, level[len("synth-"):]),
                                   kinds=tuple(kinds.split(",")) if kinds else None)
    if spec in problems.FILES:
        return problems.load_named(spec, limit=n, on_error="skip")
    return problems.load_jsonl(spec, limit=n, on_error="skip")


def main(args: Args):
    run_clock = _cpu_clock()  # the run's wall time and CPU steal, printed on its last line
    import asyncio
    import subprocess

    import numpy as np
    import torch
    import torch.distributed as dist

    import engine as engine_mod
    import grpo
    import reward
    import rollout
    import saar
    from data import models
    from sandbox import Sandbox

    # ------------------------------------------------------------------ setup
    if args.eval_only:
        args = _args_of_run(args)
    if args.faithful:
        args = dataclasses.replace(args, **FAITHFUL)
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if ddp:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    else:
        rank, world = 0, 1
    master = rank == 0
    if args.prompts_per_step % args.mini_batch_prompts or args.mini_batch_prompts % world:
        raise SystemExit(f"prompts_per_step ({args.prompts_per_step}) must divide by mini_batch_prompts "
                         f"({args.mini_batch_prompts}), and that by the world size ({world})")
    if args.eval_saar not in ("off", "on", "both"):
        raise SystemExit(f"--eval-saar must be off, on or both, got {args.eval_saar!r}")
    templates = rollout.load_prompt_template(args.prompt_template) if args.prompt_template else None
    if args.math_grader not in reward.MATH_GRADERS:
        raise SystemExit(f"--math-grader must be one of {', '.join(reward.MATH_GRADERS)}, got {args.math_grader!r}")
    if args.lora_rank < 0:
        raise SystemExit(f"--lora-rank must be >= 0 (0: no adapters), got {args.lora_rank}")
    if args.warmup_unit not in ("optimizer", "train"):
        raise SystemExit(f"--warmup-unit must be optimizer or train, got {args.warmup_unit!r}")
    if args.data_order not in ("shuffle", "stratified"):
        raise SystemExit(f"--data-order must be shuffle or stratified, got {args.data_order!r}")
    if args.train_size < 0:
        raise SystemExit(f"--train-size must be >= 0 (0: the whole training set), got {args.train_size}")
    if args.eval_only and not args.eval_size:
        raise SystemExit(f"--eval-only: the run {args.run_name!r} has --eval-size 0, no held-out set to evaluate")
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    run_name = args.run_name or time.strftime("run-%Y%m%d-%H%M%S")
    out = os.path.join(args.out_dir, run_name)
    ckpt_path = os.path.join(out, "ckpt.pt")
    if args.resume and not os.path.exists(ckpt_path):
        raise SystemExit(f"--resume: no checkpoint at {ckpt_path}")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    for flag in ("dtype", "update_dtype"):
        if getattr(args, flag) not in dtypes:
            raise SystemExit(f"--{flag.replace('_', '-')} must be one of {', '.join(dtypes)}, got {getattr(args, flag)!r}")
    dtype, update_dtype = dtypes[args.dtype], dtypes[args.update_dtype]
    fp16 = update_dtype == torch.float16  # the backward's dtype: what a loss scale protects
    scaler = grpo.LossScaler(scale=args.loss_scale or (1024.0 if fp16 else 1.0),
                             growth_interval=args.loss_scale_growth if fp16 else 0)
    if master:
        os.makedirs(os.path.join(out, "rollouts"), exist_ok=True)
        _write_run_info(out, args, subprocess)  # --eval-only: a line in evals.jsonl, run.json is the run's
    log = (lambda *a: print(*a, flush=True)) if master else (lambda *a: None)

    # ------------------------------------------------------------------ model
    model_path = args.model
    if args.warm_start and args.model in models.OFFLINE and args.tool_format != "none":
        import sft
        fix = dict(fix_fraction=args.warm_start_fix) if args.warm_start_fix else {}  # 0 keeps the cached default
        model_path = sft.warm_start(args.model, tool_format=args.tool_format, seed=args.seed, **fix)  # cached after once
    tokenizer = models.load_tokenizer(model_path)
    if ddp:
        # FSDP2: fp32 master weights and optimizer state, compute in --update-dtype, gradients reduced in fp32
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        policy = models.load_model(model_path, dtype=torch.float32).to("cpu" if args.offload else device)
        grpo.packed_attention(policy)  # packed rows: sdpa sequence by sequence, not over the whole row
        grpo.freeze_below(policy, args.train_layers)
        if args.lora_rank:  # adapters before sharding, so FSDP2 shards them with their layer
            grpo.add_lora(policy, args.lora_rank, args.lora_alpha, args.train_layers)
        kw = dict(mp_policy=MixedPrecisionPolicy(param_dtype=update_dtype, reduce_dtype=torch.float32))
        if args.offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        for layer in policy.model.layers:
            fully_shard(layer, **kw)
        fully_shard(policy, **kw)
    else:  # one process: fp32 weights; the update's forward passes run under torch.autocast in --update-dtype (amp)
        policy = models.load_model(model_path, dtype=torch.float32).to(device)
        grpo.packed_attention(policy)  # packed rows: sdpa sequence by sequence, not over the whole row
        grpo.freeze_below(policy, args.train_layers)
        if args.lora_rank:
            grpo.add_lora(policy, args.lora_rank, args.lora_alpha, args.train_layers)
    amp = None if ddp or update_dtype == torch.float32 else update_dtype  # the one-process update's autocast
    if torch.device(device).type == "cpu" and torch.bfloat16 in (dtype, update_dtype) and not _native_bf16():
        log("dtype: this CPU has no native bfloat16 (AVX512-BF16 or AMX), so bfloat16 runs slower than float32 "
            "here: pass --update-dtype float32 (and --dtype float32)")
    # Which engine, in one visible place. The HF engine gets its own copy of the weights, refreshed after each
    # update, in a lower --dtype (decoding casts no weights), under FSDP (which needs whole weights), and on CPU
    # with --engine-column-major (its linear weights column-major: faster decode steps); otherwise (float32 on
    # a GPU, one process) it reads the policy's own weights, no copy, no sync. SGLang (colocated, one engine
    # per rank) holds its own weights and frees its memory during the update.
    if args.engine not in ("hf", "sglang"):
        raise SystemExit(f"--engine must be hf or sglang, got {args.engine!r}")
    gen_model = None
    if args.engine == "hf":
        column_major = args.engine_column_major and torch.device(device).type == "cpu"
        gen_model = (models.load_model(model_path, dtype=dtype).to(device).eval()
                     if ddp or dtype != torch.float32 or column_major else policy)
        if column_major:
            engine_mod.column_major(gen_model)
    eng = engine_mod.build_engine(args.engine, tokenizer, model=gen_model,
                                  model_path=models.resolve(model_path) if args.engine == "sglang" else None,
                                  max_batch=args.engine_batch, deterministic=args.deterministic, dtype=args.dtype,
                                  mem_fraction_static=args.sglang_mem_fraction, seed=args.seed,
                                  server_url=args.sglang_url or None)
    lora_scale = args.lora_alpha / args.lora_rank if args.lora_rank else 0.0  # merged into engine copies and hf/
    ref = None
    if args.kl_coef > 0:
        ref = models.load_model(model_path, dtype=torch.float32 if not ddp else update_dtype).to(device).eval()
        grpo.packed_attention(ref)
    sandbox = Sandbox(slots=args.sandbox_slots, timeout_s=args.tool_timeout_s, memory_mb=args.tool_memory_mb,
                      hide=(os.path.abspath(args.out_dir),))  # and the checkout, data, caches: see sandbox._hidden

    # ------------------------------------------------------------------ data
    train_set = load_problems(args.train_data, seed=args.seed, n=None)
    if args.max_prompt_tokens and not args.eval_only:  # the official recipe drops long prompts at load time
        n_all = len(train_set)
        train_set = [p for p in train_set if len(rollout.prompt_ids(tokenizer, p.problem, p.task, args.tool_format,
                                                                    templates=templates, meta=p.meta))
                     <= args.max_prompt_tokens]
        if len(train_set) < n_all:
            log(f"data: dropped {n_all - len(train_set)} of {n_all} training problems whose prompt is longer than "
                f"--max-prompt-tokens {args.max_prompt_tokens}")
        if not train_set:
            raise SystemExit(f"--train-data {args.train_data}: every prompt is longer than --max-prompt-tokens "
                             f"{args.max_prompt_tokens}")
    eval_seed = args.seed + 10_007  # synth problems from another seed never repeat training ones
    eval_set = load_problems(args.eval_data, seed=eval_seed, n=args.eval_size)[:args.eval_size]
    order = np.random.default_rng(args.seed).permutation(len(train_set)).tolist()  # fixed data order
    if args.data_order == "stratified":  # every third of a run has the same mix of kinds (a step of 4: 2 of one)
        order = stratified(order, [p.meta.get("kind") or p.task for p in train_set])
    if args.train_size:  # a pool the run passes over more than once: later steps revisit earlier problems
        if args.train_size > len(order):  # a smaller set (your JSONL) is trained on whole, as with 0
            log(f"data: --train-size {args.train_size} is more than the {len(order)} training problems of "
                f"{args.train_data}: training on all of them")
        order = order[:args.train_size]

    def grade(problem, traj) -> bool:  # right or wrong: the final turn's answer, by reward.py (training and eval)
        return reward.grade(problem.task, traj.final_text(tokenizer), answer=problem.answer, tests=problem.tests,
                            sandbox=sandbox, math_grader=args.math_grader)

    # ------------------------------------------------------------------ optimizer
    optimizer, scheduler = grpo.make_optimizer(policy, lr=args.lr, weight_decay=args.weight_decay,
                                               warmup_steps=args.warmup_steps, from_zero=args.warmup_unit == "train")
    nonfinite_run = 0  # non-finite mini-batches skipped in a row (--max-nonfinite-skips)
    saving = None  # the checkpoint being written in the background: a Future, waited on before the weights change
    start_step = data_pos = 0  # data_pos: groups drawn so far (prompts_per_step a step, more with dynamic sampling)
    if args.resume:
        start_step, data_pos = _load_checkpoint(ckpt_path, policy, optimizer, scheduler, scaler)
        data_pos = start_step * args.prompts_per_step if data_pos is None else data_pos  # an older checkpoint
        log(f"resumed {out} at step {start_step}")
    # the rollout's settings, built once: SAAR's own (test-time SAAR uses them too), then the rollout's
    saar_cfg = saar.SaarConfig(gamma=args.gamma, max_retries=args.max_retries, sim_on=args.sim_on,
                               sim_eos=args.sim_eos, feedback_instruction=args.feedback_instruction, is_mode=args.is_mode,
                               is_cap=args.is_cap, is_gate=args.is_gate)
    roll_cfg = rollout.RolloutConfig(
        tool_format=args.tool_format, max_turns=args.max_turns, max_response_tokens=args.max_response_tokens,
        max_turn_tokens=args.max_turn_tokens or None, max_tool_calls=args.max_tool_calls, cap_ends=args.tool_cap_ends,
        last_turn_calls=args.last_turn_calls,
        tool_output_chars=args.tool_output_chars, error_format=args.error_format, stateful=args.stateful,
        echo=args.tool_echo, tool_header=args.tool_header, repair_json=args.repair_json,
        temperature=args.temperature, top_p=args.top_p,
        saar_cfg=saar_cfg if args.saar else None, saar_p=args.rollback_p, eos_ids=(tokenizer.eos_token_id,))
    writer = _metric_writers(out, args) if master else None
    # each mini-batch's prompts are spread over the ranks, so N ranks take the same optimizer steps on the
    # same trajectories as one process would
    n_mini, share = args.prompts_per_step // args.mini_batch_prompts, args.mini_batch_prompts // world
    mine = [k * args.mini_batch_prompts + rank * share + i for k in range(n_mini) for i in range(share)]

    # ------------------------------------------------------------------ the loop
    loop = asyncio.new_event_loop()
    eval_kw = dict(out_dir=out if master else None, saar_cfg=saar_cfg, roll_cfg=roll_cfg, templates=templates,
                   grade=grade, rank=rank, world=world)
    # the held-out baseline, before any update; with --eval-only, the one evaluation of the run's current point
    if args.eval_size and ((start_step == 0 and args.steps > 0) or args.eval_only):
        # the step-0 score is a function of the weights, the eval settings and the code: an earlier run's counts
        key = _eval_cache_key(args, model_path, templates) if args.eval_cache and not args.eval_only and world == 1 else None
        ev = _cached_eval(key, out)
        if ev is None:
            ev = _evaluate(loop, eng, sandbox, tokenizer, eval_set, args, step=start_step, **eval_kw)
            _store_eval(key, out, ev)
        if master:
            log(f"eval step {start_step} | " + _format_eval(ev) + (f" | cached {key}" if ev.get("eval_cached") else ""))
            writer(dict(ev, step=start_step))
    for step in range(start_step, start_step if args.eval_only else args.steps):
        t, step_clock = {}, _cpu_clock()
        # ---------------------------------------------------------- rollout and rewards
        # One round of prompts_per_step groups. With --dynamic-sampling (DAPO), a group whose samples are all
        # right or all wrong has zero advantage, so it is dropped and further rounds refill the step
        t["rollout"] = t["reward"] = 0.0
        trajs, rewards, correct, metas, seen = [], [], [], [], []  # the trained groups; seen: every rollout
        rounds, dropped, step_pos = 0, 0, data_pos
        while rounds < (args.max_sample_rounds if args.dynamic_sampling else 1):
            rounds += 1
            groups_here = [data_pos + g for g in mine]  # data position: one round = prompts_per_step groups
            data_pos += args.prompts_per_step
            probs_r = [train_set[order[g % len(order)]] for g in groups_here]
            n = args.samples_per_prompt  # the group: n samples of each problem, seeded per trajectory
            seeds = [((args.seed * 1_000_003 + step) * 1_000_003 + g) * 1_000_003 + j
                     for g in groups_here for j in range(n)]
            metas_r = [dict(problem_id=pr.id, group=g, sample=j)
                       for g, pr in zip(groups_here, probs_r) for j in range(n)]
            trajs_r, correct_r = loop.run_until_complete(rollout.rollout_and_grade(
                eng, sandbox, tokenizer, probs_r, roll_cfg, grade=grade, n=n, seeds=seeds, metas=metas_r,
                templates=templates, progress=master, times=t))
            # the paper's outcome reward, +1/-1, with DAPO's soft penalty near the response budget
            rewards_r = [(1.0 if ok else -1.0) + overlong_penalty(len(tr.response_ids), args.max_response_tokens,
                                                                  args.overlong_buffer, args.overlong_penalty)
                         for tr, ok in zip(trajs_r, correct_r)]
            seen += zip(trajs_r, rewards_r, correct_r)
            groups_r = [m["group"] for m in metas_r]
            signal = grpo.groups_with_signal(groups_r, correct_r) if args.dynamic_sampling else set(groups_r)
            keep = [i for i, g in enumerate(groups_r) if g in signal]
            dropped += len(set(groups_r) - signal)
            trajs += [trajs_r[i] for i in keep]
            metas += [metas_r[i] for i in keep]
            rewards += [rewards_r[i] for i in keep]
            correct += [correct_r[i] for i in keep]
            have = len(trajs) // args.samples_per_prompt
            if ddp and args.dynamic_sampling:  # every rank takes the same optimizer steps: all go by the fewest groups
                counts = [None] * world
                dist.all_gather_object(counts, have)
                have = min(counts)
            if have >= len(mine):
                break
        if args.dynamic_sampling:  # DAPO keeps a full batch; extra groups of the last round are not trained on
            cut = min(have, len(mine)) * args.samples_per_prompt
            trajs, metas, rewards, correct = trajs[:cut], metas[:cut], rewards[:cut], correct[:cut]
        # group advantages over every rank's rollouts (groups never straddle ranks, but stats do)
        t0 = time.perf_counter()
        groups = [m["group"] for m in metas]
        if ddp:
            gathered = [None] * world
            dist.all_gather_object(gathered, (rewards, groups))
            all_r = [r for g in gathered for r in g[0]]
            all_g = [x for g in gathered for x in g[1]]
        else:
            all_r, all_g = rewards, groups
        adv_all, adv_stats = grpo.compute_advantages(all_r, all_g, norm_std=args.norm_adv_std)
        off = rank * len(rewards)
        adv = adv_all[off:off + len(rewards)]
        batch = []
        for tr, a in zip(trajs, adv.tolist()):
            isw = None if tr.is_weight is None else [1.0] * len(tr.prompt_ids) + tr.is_weight
            batch.append(grpo.TrainSeq(input_ids=tr.prompt_ids + tr.response_ids,
                                         loss_mask=[0] * len(tr.prompt_ids) + tr.loss_mask, advantage=a,
                                         is_weight=isw))
        t["reward"] += time.perf_counter() - t0

        # ---------------------------------------------------------- update
        t0 = time.perf_counter()
        # the paper's code recomputes old log-probs on the final (purified) tokens; every log-prob of the
        # update is taken under the distribution the rollout sampled from, softmax(logits / temperature).
        # The first mini-batch's come from the update's own forward pass (the policy has not moved yet there),
        # so only the later mini-batches need this pass: none when a step is one optimizer step
        logp_kw = dict(max_tokens_per_micro=args.max_tokens_per_micro, temperature=args.temperature,
                       autocast_dtype=amp, packed=args.packed, share_prompts=args.share_prompts)
        mbs = args.mini_batch_prompts * args.samples_per_prompt // world
        if len(batch) > mbs:
            for b, lp in zip(batch[mbs:], grpo.compute_old_logprobs(policy, batch[mbs:], **logp_kw)):
                b.old_logp = lp
        if ref is not None:
            for b, lp in zip(batch, grpo.compute_old_logprobs(ref, batch, **logp_kw)):
                b.ref_logp = lp
        t["old_logp"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if saving is not None:  # the last checkpoint holds the live tensors: on disk before the update changes them
            saving.result()
            saving = None
        if args.engine == "sglang":
            eng.release_memory()  # colocated: give the engine's GPU memory to the update
        try:
            # (no batch: --dynamic-sampling found no group with a signal in max_sample_rounds rounds)
            per_opt_step = scheduler if args.warmup_unit == "optimizer" else None
            stats = {} if not batch else grpo.update(policy, optimizer, per_opt_step, batch, mini_batch_size=mbs,
                                max_tokens_per_micro=args.max_tokens_per_micro, grad_clip=args.grad_clip,
                                agg=args.agg, max_len=args.max_response_tokens, clip_low=args.clip_low,
                                clip_high=args.clip_high, dual_clip_c=args.dual_clip_c or None,
                                kl_coef=args.kl_coef, kl_type=args.kl_type, temperature=args.temperature,
                                gradient_checkpointing=args.gradient_checkpointing, loss_scale=scaler,
                                packed=args.packed, share_prompts=args.share_prompts,
                                skip_nonfinite=args.max_nonfinite_skips > 0,
                                autocast_dtype=amp)
        except grpo.NonFiniteLossError as e:
            # no optimizer step touched the weights with the bad gradient; keep what is good and stop
            path = os.path.join(out, f"ckpt-nonfinite-step{step + 1}.pt")
            _save_checkpoint(path, policy, optimizer, scheduler, scaler, step, master, data_pos=step_pos)
            raise SystemExit(f"step {step + 1}: {e}\nweights are unchanged by the bad update; saved {path}. "
                             f"The last regular checkpoint is {ckpt_path}.")
        if stats.get("nonfinite_skipped"):  # --max-nonfinite-skips: skipped, counted in a row across steps
            whole = stats["nonfinite_trailing"] == stats["n_mini_batches"]
            nonfinite_run = (nonfinite_run if whole else 0) + stats["nonfinite_trailing"]
            log(f"step {step + 1}: skipped {stats['nonfinite_skipped']} non-finite mini-batch(es), {nonfinite_run} in a row")
            if nonfinite_run > args.max_nonfinite_skips:
                path = os.path.join(out, f"ckpt-nonfinite-step{step + 1}.pt")
                _save_checkpoint(path, policy, optimizer, scheduler, scaler, step + 1, master, data_pos=data_pos)
                raise SystemExit(f"step {step + 1}: {nonfinite_run} non-finite mini-batches in a row, more than "
                                 f"--max-nonfinite-skips {args.max_nonfinite_skips}; saved {path}")
        elif stats:
            nonfinite_run = 0
        if args.warmup_unit == "train":
            scheduler.step()  # veRL: once per training step, after the update
        t["update"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if args.engine == "sglang":
            eng.resume_memory()
        if gen_model is not policy:  # the fp32 (FSDP2: full) tensors into the engine's copy (it flushes its prefix cache)
            eng.update_weights(_full_state(policy, lora_scale).items())
        eng.flush_cache()  # stale KV from the old weights must never be reused
        t["sync"] = time.perf_counter() - t0

        # ---------------------------------------------------------- eval / log / ckpt
        m = _step_metrics(*map(list, zip(*seen)), adv_stats, stats, t)  # the figures of every rollout of the step
        m["adv_n"] = len(all_r)  # how many rollouts, from every rank, entered the group advantages (and trained)
        if args.dynamic_sampling:
            m.update(sample_rounds=rounds, dropped_groups=dropped)
        if ddp:  # log the whole batch: losses and event counts add up over ranks, the rest are rank means
            parts = [None] * world
            dist.all_gather_object(parts, m)
            m = {k: ([x for p in parts for x in p[k]] if isinstance(m[k], list) else
                     sum(p[k] for p in parts) / (1 if k in SUMMED else world)) for k in m}
        m["step"] = step + 1
        if args.eval_size and ((args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.steps):
            m.update(_evaluate(loop, eng, sandbox, tokenizer, eval_set, args, step=step + 1, **eval_kw))
        m.update(_since(step_clock))
        if master:
            log(_format_line(m))
            writer(m)
            _dump_rollouts(os.path.join(out, "rollouts", f"step_{step + 1:06d}.jsonl"), seen[:args.dump_rollouts],
                           tokenizer)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            saving = _save_checkpoint(ckpt_path, policy, optimizer, scheduler, scaler, step + 1, master,
                                      data_pos=data_pos, background=True)
    if args.steps > start_step and not args.eval_only:
        _save_hf(os.path.join(out, "hf"), policy, tokenizer, master, lora_scale)
    if saving is not None:
        saving.result()
    if master and args.eval_size:
        for line in _summary(out, args.steps):  # the held-out gain, start vs end, with its paired 95% CI
            log(line)
    sandbox.close()
    eng.shutdown()
    loop.close()
    if ddp:
        dist.destroy_process_group()
    wall = _since(run_clock)
    log(f"done: {out} in {wall['t_wall']:.0f} s" + (f" (CPU steal {wall['cpu_steal']:.0%})" if "cpu_steal" in wall else ""))


# ---------------------------------------------------------------------- helpers of the loop

def _evaluate(loop, eng, sandbox, tokenizer, problems, args, *, step, out_dir, saar_cfg, roll_cfg, templates, grade,
              rank, world) -> dict:
    """Held-out accuracy: greedy, and at the rollout temperature with --eval-sampled; test-time SAAR off, on or
    both (--eval-saar). Returns the metrics (with t_eval); every rank's per-problem records go to
    out/eval_step<step>.jsonl when out_dir is given (the master), which _summary reads."""
    import rollout
    import torch.distributed as dist
    t0 = time.perf_counter()
    mine = problems[rank::world]
    results, records = {}, []
    temps = [("greedy", 0.0)] + ([("sampled", args.temperature)] if args.eval_sampled else [])
    # test-time SAAR off is eval_greedy, on is eval_greedy_saar, whatever the flag, so runs and their later
    # --eval-only calls line up
    modes = {"off": [("", None)], "on": [("_saar", saar_cfg)], "both": [("", None), ("_saar", saar_cfg)]}[args.eval_saar]
    for (name, temp), (suffix, mode_cfg) in ((t, m) for t in temps for m in modes):
        cfg = dataclasses.replace(roll_cfg, temperature=temp, saar_cfg=mode_cfg, saar_p=1.0)
        trajs, oks = loop.run_until_complete(rollout.rollout_and_grade(
            eng, sandbox, tokenizer, mine, cfg, grade=grade, seeds=list(range(len(mine))), templates=templates,
            progress=out_dir is not None))
        rows = [dict(id=p.id, ok=bool(ok), calls=tr.num_first_calls, errors=tr.num_first_errors)
                for p, tr, ok in zip(mine, trajs, oks)]
        if world > 1:
            parts = [None] * world
            dist.all_gather_object(parts, rows)
            rows = [r for part in parts for r in part]
        key = f"eval_{name}{suffix}"
        calls = sum(r["calls"] for r in rows)
        results[f"{key}_acc"] = sum(r["ok"] for r in rows) / max(1, len(rows))
        results[f"{key}_tool_err"] = sum(r["errors"] for r in rows) / max(1, calls)  # first attempts, SAAR's excluded
        results[f"{key}_tool_calls"] = calls / max(1, len(rows))
        records += [dict(r, eval=key) for r in rows]
    if out_dir is not None:  # an earlier evaluation of this step keeps its other kinds (--eval-only adds some)
        path = os.path.join(out_dir, f"eval_step{step:06d}.jsonl")
        if os.path.exists(path):
            kinds = {r["eval"] for r in records}
            with open(path) as f:
                records = [r for r in map(json.loads, f) if r["eval"] not in kinds] + records
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        os.replace(path + ".tmp", path)
    results["t_eval"] = time.perf_counter() - t0
    return results


# fields that cannot change the step-0 evaluation: runs that differ only in these share its cache entry
NOT_IN_EVAL = {"run_name", "out_dir", "steps", "resume", "faithful", "eval_only", "eval_every", "eval_cache",
               "update_dtype", "train_data", "data_order", "train_size", "prompts_per_step", "samples_per_prompt",
               "max_prompt_tokens", "saar", "rollback_p", "lr", "warmup_steps", "warmup_unit", "weight_decay",
               "mini_batch_prompts", "train_layers", "max_tokens_per_micro", "packed", "share_prompts", "clip_low",
               "clip_high", "dual_clip_c", "agg", "norm_adv_std", "dynamic_sampling", "max_sample_rounds", "kl_coef", "kl_type",
               "overlong_buffer", "overlong_penalty", "grad_clip", "max_nonfinite_skips", "gradient_checkpointing",
               "loss_scale", "loss_scale_growth", "offload", "save_every", "dump_rollouts", "wandb_project"}


def _eval_cache_root():
    from data import models
    return models.cache_dir() / "eval"


def _eval_cache_key(args: Args, model_path: str, templates: dict | None = None) -> str | None:
    """sha256 of the model folder's files (weights, config, tokenizer, chat template; not sft.py's build record),
    the eval-relevant args and prompt templates, the evaluation's code and the torch/transformers versions;
    None for a model that is not a local folder (a hub id is not hashed)."""
    import hashlib
    import inspect
    from importlib import metadata
    from pathlib import Path

    import engine
    import reward
    import rollout
    import saar
    import sandbox
    import sft
    from data import models, problems, synth
    folder = Path(models.resolve(model_path))  # an offline model's name: its built folder
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name != sft.MARKER:  # the cold start's build record: its timings and pid change with
            # every rebuild of the same weights, which are hashed
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    fields = {k: v for k, v in dataclasses.asdict(args).items() if k not in NOT_IN_EVAL}
    fields["templates"] = templates  # the wording --prompt-template loaded, not its path
    h.update(json.dumps(fields, sort_keys=True).encode())
    for mod in (engine, reward, rollout, saar, sandbox, models, problems, synth):
        h.update(inspect.getsource(mod).encode())
    for fn in (_evaluate, load_problems):
        h.update(inspect.getsource(fn).encode())
    h.update(" ".join(metadata.version(d) for d in ("torch", "transformers")).encode())
    return h.hexdigest()[:20]


def _cached_eval(key: str | None, out: str) -> dict | None:
    """An earlier run's step-0 metrics, with its per-problem records copied into out/eval_step000000.jsonl."""
    import shutil
    if key is None or not (_eval_cache_root() / key / "metrics.json").exists():
        return None
    folder = _eval_cache_root() / key
    t0 = time.perf_counter()
    try:
        with open(folder / "metrics.json") as f:
            ev = json.load(f)
        shutil.copyfile(folder / "eval_step000000.jsonl", os.path.join(out, "eval_step000000.jsonl"))
    except (OSError, ValueError) as e:  # a damaged entry: evaluate again (and keep the damaged one for a look)
        print(f"eval cache {folder} is unreadable ({e}); evaluating instead", file=sys.stderr)
        return None
    return dict(ev, t_eval=time.perf_counter() - t0, eval_cached=1)


def _store_eval(key: str | None, out: str, ev: dict) -> None:
    """Keep this run's step-0 evaluation for later runs (written whole, then renamed into place)."""
    import shutil
    if key is None or (_eval_cache_root() / key).exists():
        return
    tmp = _eval_cache_root() / f".{key}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.join(out, "eval_step000000.jsonl"), tmp / "eval_step000000.jsonl")
    (tmp / "metrics.json").write_text(json.dumps(ev))
    try:
        os.replace(tmp, _eval_cache_root() / key)
    except OSError:  # another run stored it first
        shutil.rmtree(tmp, ignore_errors=True)


def stratified(order: list[int], strata: list) -> list[int]:
    """The permutation `order`, reordered so that its strata come in turn (in the order each first appears),
    each keeping its own order; when one runs out the others go on. order: indices into strata."""
    queues: dict = {}
    for i in order:
        queues.setdefault(strata[i], []).append(i)
    out, depth = [], 0
    while len(out) < len(order):
        out += [q[depth] for q in queues.values() if depth < len(q)]
        depth += 1
    return out


def _format_eval(m: dict) -> str:
    keys = sorted(k[:-4] for k in m if k.startswith("eval_") and k.endswith("_acc"))
    return " | ".join(f"{k[5:]} acc {m[k + '_acc']:.3f} tool_err {m[k + '_tool_err']:.2f}" for k in keys)


def paired_ci(before: list[bool], after: list[bool], z: float = 1.96) -> tuple[float, float, float]:
    """Mean of after - before over the same problems, and its normal-approximation 95% CI (paired)."""
    d = [float(a) - float(b) for a, b in zip(after, before)]
    n = len(d)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(d) / n
    sd = (sum((x - mean) ** 2 for x in d) / max(1, n - 1)) ** 0.5
    half = z * sd / n ** 0.5
    return mean, mean - half, mean + half


def _summary(out: str, last_step: int) -> list[str]:
    """One line per evaluation kind: held-out accuracy before the first step and after the last, the gain with
    its paired 95% CI, and first-attempt tool errors per call. Also written to summary.json."""
    paths = [os.path.join(out, f"eval_step{s:06d}.jsonl") for s in (0, last_step)]
    if last_step == 0 or not all(os.path.exists(p) for p in paths):
        return []
    start, end = ([json.loads(x) for x in open(p)] for p in paths)
    lines, summary = [], {}
    for key in dict.fromkeys(r["eval"] for r in start):
        a = {r["id"]: r for r in start if r["eval"] == key}
        b = {r["id"]: r for r in end if r["eval"] == key}
        ids = [i for i in a if i in b]
        if not ids:  # a kind evaluated at one end only (--eval-only may add it later)
            continue
        acc0, acc1 = (sum(d[i]["ok"] for i in ids) / max(1, len(ids)) for d in (a, b))
        err0, err1 = (sum(d[i]["errors"] for i in ids) / max(1, sum(d[i]["calls"] for i in ids)) for d in (a, b))
        gain, lo, hi = paired_ci([a[i]["ok"] for i in ids], [b[i]["ok"] for i in ids])
        how = key[len("eval_"):].replace("_saar", ", test-time SAAR")
        lines.append(f"held-out accuracy {acc0:.2f} -> {acc1:.2f} ({100 * gain:+.0f} pts, 95% CI {100 * lo:+.0f}.."
                     f"{100 * hi:+.0f}, {len(ids)} problems, {how}); tool errors per call {err0:.2f} -> {err1:.2f}")
        summary[key] = dict(acc_start=acc0, acc_end=acc1, gain=gain, ci_low=lo, ci_high=hi, n=len(ids),
                            tool_err_start=err0, tool_err_end=err1, step=last_step)
    steps = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step", 0) > 0 and "reward" in r:
                steps[r["step"]] = r["reward"]  # a step repeated by --resume keeps its last line
    rewards = [steps[k] for k in sorted(steps)]
    if len(rewards) >= 3:
        k = len(rewards) // 3
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        lines.append(f"training reward, mean of the first {k} steps {first:+.3f} -> of the last {k} {last:+.3f}")
        summary["train_reward"] = dict(first_third=first, last_third=last, steps=len(rewards))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(dict(summary, lines=lines), f, indent=1)
    return lines


def _cpu_clock() -> tuple[float, int, int]:
    """(wall clock, steal jiffies, all jiffies) of the whole machine, from /proc/stat's cpu line (Linux)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        ticks = []
    if len(ticks) < 8:  # no /proc/stat, or a kernel without the steal column: _since reports no steal
        return (time.perf_counter(), 0, 0)
    return (time.perf_counter(), ticks[7], sum(ticks))


def _since(clock) -> dict:
    """t_wall since the clock, and cpu_steal: the share of the machine's CPU time the hypervisor gave to other
    guests meanwhile. On a shared VM this, not the code, often explains a slow step; absent where unreadable."""
    now = _cpu_clock()
    out = dict(t_wall=now[0] - clock[0])
    if now[2] > clock[2]:
        out["cpu_steal"] = (now[1] - clock[1]) / (now[2] - clock[2])
    return out


def _step_metrics(trajs, rewards, correct, adv_stats, stats, t) -> dict:
    n = max(1, len(trajs))
    calls = sum(tr.num_tool_calls for tr in trajs)
    events = [e for tr in trajs for e in tr.saar_events]
    ev = [e["kind"] for e in events]
    m = dict(reward=sum(rewards) / n, acc=sum(correct) / n, tool_calls=calls / n,
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
    return m


def _format_line(m: dict) -> str:
    s = (f"step {m['step']:4d} | reward {m['reward']:+.3f} | acc {m['acc']:.3f} | tool_calls {m['tool_calls']:.2f} "
         f"| tool_err {m['tool_err']:.2f} | saar s/d/g {m['saar_shallow']}/{m['saar_deep']}/{m['saar_given_up']} "
         f"| resp_len {m['resp_len']:.0f} | t rollout {m['t_rollout']:.1f}s reward {m['t_reward']:.1f}s "
         f"old_logp {m['t_old_logp']:.1f}s update {m['t_update']:.1f}s sync {m['t_sync']:.2f}s")
    if "cpu_steal" in m:
        s += f" steal {m['cpu_steal']:.0%}"
    if m.get("skipped_steps"):
        s += f" | fp16 overflow: {m['skipped_steps']} mini-batch(es) skipped, loss scale now {m['loss_scale']:g}"
    s += f" | first_err {m['first_tool_err']:.2f}"
    if any(k.startswith("eval_") and k.endswith("_acc") for k in m):
        s += " | eval " + _format_eval(m)
    return s


def _metric_writers(out: str, args: Args):
    """metrics.jsonl always, TensorBoard scalars, wandb only when a project is named."""
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter
    tb = SummaryWriter(os.path.join(out, "tb"))
    wb = None
    if args.wandb_project:
        import wandb  # imported only here, so runs without it never need it
        wb = wandb.init(project=args.wandb_project, name=os.path.basename(out), config=dataclasses.asdict(args))

    def write(m: dict):
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(m) + "\n")
        for k, v in m.items():
            if isinstance(v, (int, float)) and k != "step":
                tb.add_scalar(k, v, m["step"])
            elif isinstance(v, list) and v:  # the SAAR similarity histogram
                tb.add_histogram(k, np.asarray(v, dtype=np.float64), m["step"], bins=np.linspace(0, 1, 21))
        tb.flush()
        if wb is not None:
            wb.log(m, step=m["step"])
    return write


def _dump_rollouts(path: str, seen, tokenizer):
    with open(path, "w") as f:
        for tr, r, _ in seen:
            f.write(json.dumps(dict(meta=tr.meta, reward=r, prompt=tokenizer.decode(tr.prompt_ids), response=tr.text,
                                    finish_reason=tr.finish_reason, truncated=tr.truncated, turns=tr.turns,
                                    saar=tr.saar, saar_events=tr.saar_events, num_tool_calls=tr.num_tool_calls,
                                    num_tool_errors=tr.num_tool_errors, response_len=len(tr.response_ids))) + "\n")


def _write_run_info(out: str, args: Args, subprocess):
    """Everything needed to reproduce the run: args, commit, diff, package versions, seed."""
    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True).stdout
    info = dict(args=dataclasses.asdict(args), seed=args.seed, commit=git("rev-parse", "HEAD").strip(),
                argv=sys.argv, python=sys.version, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    if args.eval_only:  # the run's own record stays; each later evaluation adds a line
        with open(os.path.join(out, "evals.jsonl"), "a") as f:
            f.write(json.dumps(dict(info, diff=git("diff", "HEAD"))) + "\n")
        return
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(out, "git.diff"), "w") as f:
        f.write(git("diff", "HEAD"))
    from importlib import metadata
    with open(os.path.join(out, "packages.txt"), "w") as f:
        f.write("\n".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())) + "\n")


def _args_of_run(args: Args) -> Args:
    """--eval-only: the run's own settings (its run.json), with this call's run, eval and device flags."""
    path = os.path.join(args.out_dir, args.run_name, "run.json")
    if not args.run_name or not os.path.exists(path):
        raise SystemExit(f"--eval-only: no run at {path}; name an existing run with --run-name (and --out-dir)")
    with open(path) as f:
        saved = json.load(f)["args"]
    names = {f.name for f in dataclasses.fields(Args)}  # a run from an older commit may lack newer fields
    mine = ("run_name", "out_dir", "resume", "eval_only", "eval_saar", "eval_sampled", "device", "wandb_project")
    return dataclasses.replace(Args(**{k: v for k, v in saved.items() if k in names}),
                               **{k: getattr(args, k) for k in mine})


def _native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (without it, bf16 matmuls are emulated and slower than fp32)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True  # not Linux: no way to tell, no warning
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _full_state(model, lora_scale: float = 0.0) -> dict:
    """Whole (unsharded) weights on every rank, LoRA adapters merged in (lora_scale = alpha / rank); works for
    plain modules and FSDP2 alike."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    import grpo
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return grpo.merge_lora(state, lora_scale) if lora_scale else state


def _save_checkpoint(path: str, model, optimizer, scheduler, scaler, step: int, master: bool, data_pos: int,
                     background: bool = False):
    """Model, optimizer, scheduler, loss scaler, step, data position (groups drawn so far) and every RNG state;
    temp file then rename, so a kill mid-save leaves the previous checkpoint whole.

    background=True writes from a thread and returns its Future (None on other ranks): the write (1-4 s for
    SmolLM2-135M, mostly waiting on the disk) overlaps the next step's rollout. The state holds the live
    tensors, not copies, so the caller waits on the Future (which re-raises a failed write) before the
    weights or the optimizer state change."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(model, optimizer, options=opts)
    if not master:
        return
    state = dict(model=msd, optimizer=osd, scheduler=scheduler.state_dict(), scaler=dataclasses.asdict(scaler), step=step,
                 data_pos=data_pos, rng=dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state()))

    def write():
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    if not background:
        return write()
    pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt")  # its thread is joined at exit: a write is never cut
    try:
        return pool.submit(write)
    finally:
        pool.shutdown(wait=False)


def _load_checkpoint(path: str, model, optimizer, scheduler, scaler) -> tuple[int, int | None]:
    import random

    import numpy as np
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    state = torch.load(path, map_location="cpu", weights_only=False)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    for key, value in state.get("scaler", {}).items():
        setattr(scaler, key, value)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"]), state.get("data_pos")


def _save_hf(path: str, model, tokenizer, master: bool, lora_scale: float = 0.0):
    """A Hugging Face folder eval.py can load (whole weights, written by rank 0)."""
    sd = _full_state(model, lora_scale)
    if master:
        model.save_pretrained(path, state_dict=sd)
        tokenizer.save_pretrained(path)


if __name__ == "__main__":
    import tyro  # --flag-name VALUE from the dataclass, its field docstrings as the help
    main(tyro.cli(Args, description="GRPO + SAAR training (CLEANER)."))
