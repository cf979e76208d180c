"""config.py: every setting of train.py, eval.py and sft.py, declared once.

Each section is a small dataclass; an entry script's arguments are a few of them (`Train`, `Eval`). tyro
builds the command line from them with flat flag names (`--max-turns`, not `--rollout.max-turns`), the
field docstrings as the help, one group per section, and rejects a value outside a `Literal` with its own
error. The algorithm's sections come first (`Rollout`, `Saar`, `Grpo`); train.py's machinery (engine, sandbox,
how the update runs) sits under one heading, `Machinery`. The algorithm modules take their section whole:
rollout.py a `Rollout` and a `Saar`, saar.py a `Saar`, grpo.py a `Grpo` (and the update's `Update`). Each mode
list is a `Literal` declared here once; a module that checks a mode reads it back with typing.get_args. The
defaults are the CPU demo's; eval.py starts from the paper's evaluation settings (`Eval`), and the paper's
training runs pass theirs in scripts/.

`--faithful` applies FAITHFUL, the official code's choice wherever ours differs, to whichever sections an
entry script has (docs/departures.md lists each one).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro

# the mode lists, each declared once (grpo.py, reward.py and the sections below read them)
AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "verl-token-mean"]
KlType = Literal["kl", "low_var_kl"]  # veRL's names for Schulman's k1 and k3 estimators
MathGrader = Literal["math-verify", "strict-box"]
LcbGrader = Literal["strict", "official"]
DType = Literal["float32", "bfloat16", "float16"]
CallFormat = Literal["markdown", "hermes"]  # how a call is written (--tool-format adds none and auto)


def not_in_eval(default):
    """A field that the held-out evaluation never reads. eval.step0_key keys the step-0 evaluation on every other
    setting of the sections the evaluation reads (eval.READS): runs that differ only in it share one."""
    return field(default=default, metadata={"in_eval": False})


@dataclass
class Common:
    """What every entry script needs."""
    model: str = "smollm2-135m"
    """local folder, hub id, or offline name (smollm2-135m, tiny-qwen3, tiny-bytes)"""
    seed: int = 0
    """seed for data order, sampling and SAAR draws"""
    faithful: bool = not_in_eval(False)
    """the official code's choice wherever ours differs (config.FAITHFUL; docs/departures.md); it overrides them"""


@dataclass
class Run:
    """The run folder: name, length, checkpoints, logs."""
    run_name: str = ""
    """name of the output folder under out_dir (default: a timestamp)"""
    out_dir: str = "out"
    """where runs are written"""
    steps: int = 13
    """number of GRPO steps"""
    resume: bool = False
    """continue the run in out_dir/run from its last checkpoint"""
    eval_only: bool = False
    """evaluate the held-out set of an existing run and stop: its warm start (step 0), or its checkpoint with
    --resume; the run's settings (run.json) are kept but for the eval flags, and the records join its
    eval_step*.jsonl, metrics.jsonl and summary (e.g. --eval-saar on after a run evaluated with it off)"""
    warm_start: bool = True
    """run sft.py's cold start first when the model is an offline base model (cached)"""
    warm_start_fix: float = 0.25
    """share of the cold start's conversations that fail a call and fix it (sft.py --fix-fraction; 0: none)"""
    save_every: int = 1
    """checkpoint every N steps"""
    dump_rollouts: int = 4
    """full trajectories written as JSONL per step"""
    wandb_project: str = ""
    """log to this wandb project (wandb is imported only when set)"""


@dataclass
class Data:
    """Training and held-out problems, and how their answers are graded."""
    train_data: str = not_in_eval("synth-medium:primes,digit_sum,coprime")
    """generated problems: 'synth-medium' (naive code works, hand work does not), 'synth' (naive code times out),
    'synth-warmup' (the cold start's easy ones), optionally ':kind,kind' (of data/synth.py's KINDS); or a named set
    (math_train, aime_train, leetcode_train), a JSONL path"""
    eval_data: str = "synth-medium:primes,digit_sum,coprime"
    """held-out problems: a 'synth*' spec as above (from a seed never trained on), a named set or a JSONL path"""
    eval_size: int = 128
    """held-out problems, evaluated before the first step and after the last (0: no evaluation)"""
    eval_every: int = not_in_eval(0)
    """also evaluate every N steps (0: only before the first step and after the last)"""
    eval_sampled: bool = False
    """score the held-out set at the rollout temperature too, not only greedy"""
    eval_cache: bool = not_in_eval(True)
    """reuse the step-0 evaluation of an earlier run that scored the same weights (hashed) with the same eval
    settings and code (<cache>/eval; a run of the same cold start with other training flags shares it)"""
    data_order: Literal["shuffle", "stratified"] = not_in_eval("shuffle")
    """shuffle: one seeded permutation of the training set (veRL's sampler); stratified: that permutation with
    problem kinds (synth's kind, else the task) taken in turn, so every step and third of a run sees the same mix"""
    train_size: int = not_in_eval(32)
    """train on the first N problems of that order, in passes (0, or more than the set: all of it); the demo's 32
    makes its last steps revisit its first steps' problems"""
    max_prompt_tokens: int = not_in_eval(2560)
    """training problems whose templated prompt is longer are dropped at load time, and counted (official: 2560;
    0 keeps all)"""
    math_grader: MathGrader = "math-verify"
    """how a math answer is graded, for the +1/-1 reward and the held-out accuracy: math-verify on the last boxed
    answer (ours), or strict-box (the official reward: the last boxed answer within the last 100 characters, equal
    to the gold answer as a string)"""

    def __post_init__(self):
        if self.train_size < 0:
            raise ValueError(f"--train-size must be >= 0 (0: the whole training set), got {self.train_size}")


@dataclass
class Rollout:
    """The multi-turn rollout and the tool the model calls (rollout.py)."""
    tool_format: Literal["hermes", "markdown", "none", "auto"] = "markdown"
    """hermes (Qwen, the paper), markdown (```python blocks, SmolLM2), none (no-tool baseline), or auto (hermes
    when the tokenizer has a <tool_call> token, else markdown)"""
    tools: str = "python"
    """the tools offered, a comma list of tools.AVAILABLE's names (the paper: python); the prompt is made from
    their descriptions"""
    prompt_template: str = ""
    """a JSON file of prompt templates by task ({problem}, {tool}) and an optional system prompt, e.g. the
    official wording (data/prompts.py: load_prompt_template; default: ours, PROMPTS)"""
    max_turns: int = 4
    """assistant turns per trajectory (paper: 16)"""
    max_response_tokens: Annotated[int, tyro.conf.arg(aliases=("--max-new-tokens",))] = 256
    """response budget per trajectory, tool tokens included (paper: 20480; eval.py's 0: 20480 on a GPU, 1024 on
    the CPU)"""
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
    """sampling temperature (paper: 1.0; the 135M demo model writes mostly broken code at 1.0)"""
    top_p: float = 1.0
    """nucleus sampling threshold"""
    tool_output_chars: int = 256
    """tool output shown to the model, cut in the middle (paper: 256)"""
    error_format: Literal["full", "last_line"] = "full"
    """model-facing error: full (stdout + compact traceback) or last_line"""
    stateful: bool = False
    """a persistent Python session per trajectory (the paper's tool is stateless)"""
    tool_echo: bool = False
    """a stateless call also prints the repr of its final bare expression when not None (the official tool)"""
    tool_header: bool = False
    """tool output headed by a success or failure line, its streams labelled, as the official tool lays it out"""
    repair_json: bool = False
    """parse hermes calls with json_repair, as the official parser does (off: strict JSON, a broken call fails)"""


@dataclass
class Saar:
    """SAAR's parameters (saar.py), for training and test-time SAAR alike; TrainSaar and EvalSaar add where each
    script uses it."""
    gamma: float = 0.5
    """similarity threshold: >= gamma shallow (keep the old reasoning, swap in the new call), else deep"""
    max_retries: int = 3
    """regenerations per failed turn before giving up"""
    sim_on: Literal["call", "code"] = "call"
    """similarity on the decoded call text (official code) or on the extracted code (paper text; a malformed call,
    with no code to compare, is replaced deep)"""
    sim_eos: bool = False
    """with --sim-on call, the call text runs to the end of the turn, <|im_end|> included, as the official loop
    generates it (ours stops at the end of the call)"""
    feedback_instruction: bool = False
    """add an explicit 'fix the error' line to the error feedback"""
    is_mode: Literal["none", "gate"] = "none"
    """gate: refuse a replacement unlikely on the purified context (a scoring pass); the per-token correction of
    spliced tokens is --rollout-is token"""
    is_gate: float = 0.1
    """keep the error when the sequence-level ratio falls below this (is_mode=gate)"""
    rollback_p: float = not_in_eval(1.0)
    """curriculum mixing: the probability that a trajectory uses SAAR (paper: 1.0 for 4B, 0.7 for 7B; train.py's
    held-out evaluation uses 1.0)"""


@dataclass
class TrainSaar(Saar):
    """SAAR (saar.py): its parameters, and where train.py uses it."""
    saar: bool = not_in_eval(True)
    """purify failed tool calls with SAAR in the training rollouts"""
    eval_saar: Literal["off", "on", "both"] = "off"
    """test-time SAAR in the held-out eval: off (the policy's own tool use), on (the paper's evals) or both"""


@dataclass
class EvalSaar(Saar):
    """SAAR (saar.py): its parameters, and where eval.py uses it."""
    saar: Literal["paper", "on", "off", "both"] = "paper"
    """test-time SAAR: paper (on for AIME/GPQA, off for LCB, as the official eval scripts), on, off, both"""


@dataclass
class Grpo:
    """The GRPO step: batch, reward, loss and optimizer (grpo.py)."""
    prompts_per_step: int = 4
    """prompts per GRPO step (paper: 128)"""
    samples_per_prompt: int = 4
    """rollouts per prompt, the GRPO group (paper: 16)"""
    mini_batch_prompts: int = 2
    """prompts per optimizer step; several per GRPO step (paper: 32 of 128)"""
    overlong_buffer: int = 64
    """DAPO overlong penalty ramps over the last this many tokens of the budget (paper: 4096)"""
    overlong_penalty: float = 1.0
    """penalty at the full budget (paper: 1.0)"""
    norm_adv_std: bool = True
    """divide advantages by the group std (off: Dr.GRPO's advantages; its loss is --agg seq-mean-token-sum-norm)"""
    baseline: Literal["group-mean", "leave-one-out"] = "group-mean"
    """what a reward's advantage is measured from: its group's mean (GRPO, the paper), or the mean of the group's
    other samples (RLOO)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose samples are all right or all wrong (zero advantage) and roll out
    further rounds of prompts_per_step prompts until the step has prompts_per_step groups (the paper: off)"""
    mask_failed: bool = False
    """the peers' fix instead of SAAR: a trajectory that called a tool and saw every call fail adds nothing to the
    loss (its loss mask zeroed after the advantages, so it stays in its group's reward statistics), as verifiers'
    mask_all_failed_tool_calls (PR #1416, after SimpleTIR's void turns); one that made no call is trained on"""
    max_sample_rounds: int = 3
    """with --dynamic-sampling, the most rollout rounds a step takes; then it trains on the groups it has"""
    clip_low: float = 0.2
    """PPO clip below 1"""
    clip_high: float = 0.28
    """PPO clip above 1 (clip-higher)"""
    dual_clip_c: float = 10.0
    """dual-clip bound for negative advantages (0: off)"""
    agg: AggMode = "token-mean"
    """loss aggregation: token-mean (over the mini-batch), seq-mean-token-sum, seq-mean-token-mean,
    seq-mean-token-sum-norm (Dr.GRPO), verl-token-mean (veRL: a token-mean per micro-batch, weighted by its sequences)"""
    rollout_is: Literal["none", "token", "seq"] = "none"
    """veRL's rollout correction of the engine/trainer gap (machinery/mismatch.py; the paper: none): token weights
    each token's loss by min(pi_old/pi_rollout, --rollout-is-threshold), SAAR's spliced tokens included; seq drops a
    sequence whose ratio leaves [--rollout-is-threshold-lower, --rollout-is-threshold]. pi_rollout: the engine's
    sampling log-probs; pi_old: the trainer's on the purified tokens, then for the whole batch (one forward pass
    more over the first mini-batch)"""
    rollout_is_threshold: float = 2.0
    """the token weight's cap, the sequence ratio's upper bound (veRL's rollout_is_threshold)"""
    rollout_is_threshold_lower: float = 0.0
    """the sequence ratio's lower bound (0: 1 / --rollout-is-threshold, as veRL)"""
    mismatch_warn_kl: float = 1e-3
    """warn once when the engine/trainer mismatch KL of ordinary sampled tokens passes this: stale engine weights,
    or an engine precision far from the trainer's"""
    kl_coef: float = 0.0
    """KL penalty to the initial policy (paper: 0)"""
    kl_type: KlType = "low_var_kl"
    """kl (k1) or low_var_kl (k3)"""
    lr: float = 3e-5
    """AdamW learning rate (paper: 2e-6 for 4B, 1e-6 for 7B)"""
    warmup_steps: int = 2
    """linear warmup length, in --warmup-unit steps (paper: 20)"""
    warmup_unit: Literal["optimizer", "train"] = "optimizer"
    """optimizer (the scheduler steps after each optimizer step, from 1/warmup_steps) or train (veRL: once per
    GRPO step, from 0, so the first step does not move the weights and 20 warmup steps span 20 GRPO steps)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """gradient norm clip"""
    train_layers: int = 12
    """train only the top N decoder layers and the final norm (0: all, as the paper); the frozen bottom gets no
    backward pass"""
    lora_rank: int = 0
    """LoRA adapters of this rank on the trained layers' linear weights instead of the weights (0: off, as the
    paper; peft): no weight gradients for the frozen weights, a tiny optimizer state"""
    lora_alpha: float = 32.0
    """LoRA scale numerator: the adapters' update is scaled by lora_alpha / lora_rank"""

    def __post_init__(self):
        if self.lora_rank < 0:
            raise ValueError(f"--lora-rank must be >= 0 (0: no adapters), got {self.lora_rank}")
        if not 0.0 <= self.rollout_is_threshold_lower < 1.0 < self.rollout_is_threshold:
            raise ValueError(f"--rollout-is-threshold must be > 1 and --rollout-is-threshold-lower in [0, 1), got "
                             f"{self.rollout_is_threshold} and {self.rollout_is_threshold_lower}")


# ---------------------------------------------------------------------- the machinery: how a run goes, not what it does

@dataclass
class Update:
    """How the update runs (machinery/packing.py, machinery/precision.py): micro-batches, precision, memory, and
    what a non-finite loss does; the loss and its gradient are the grpo section's, up to float rounding."""
    max_tokens_per_micro: int = 4096
    """token budget of one micro-batch"""
    share_prompts: bool = True
    """packed rows hold a group's samples behind one copy of their prompt: the same loss and gradient, up to
    float rounding, for fewer tokens (machinery/packing.py)"""
    update_dtype: DType = "float32"
    """compute dtype of the update's and the old log-probs' forward and backward passes; the weights and optimizer
    state stay float32: torch.autocast on one process, FSDP2's MixedPrecisionPolicy"""
    loss_scale: float = 0.0
    """initial loss scale of the backward pass (0: 1024 with --update-dtype float16, else 1)"""
    loss_scale_growth: int = 200
    """with float16, a dynamic scale: an overflow skips its mini-batch and halves the scale, and this many
    good steps double it (0: static, an overflow stops the run)"""
    max_nonfinite_skips: int = 0
    """non-finite mini-batches skipped in a row before the run stops (0: the first one stops it, the weights
    untouched and saved; veRL skips them all)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass"""
    offload: bool = False
    """FSDP2: keep parameters, gradients and optimizer state on the CPU (the paper's param/optimizer offload)"""


@dataclass
class Engine:
    """The generation engine and the device (machinery/engines.py builds it)."""
    engine: Literal["hf", "sglang"] = "hf"
    """hf (transformers, any device) or sglang (an in-process SGLang engine per rank, colocated, on the rank's GPU
    or CPU; its environment: scripts/sglang_env.sh)"""
    engine_batch: int = 32
    """most sequences the HF engine (and SGLang's CPU engine) decodes at once"""
    sglang_mem_fraction: float = 0.5
    """memory share of each SGLang engine (KV cache and weights; the paper: 0.8 of a GPU with offloaded training); on
    a CPU, of the machine, split between its ranks, as a KV cache of that many bytes at most: no larger than the
    sequences a rank decodes at once (its share of a step's rollouts, at most --engine-batch) at the longest
    context (--max-prompt-tokens plus the response budget)"""
    sglang_url: str = ""
    """use an already running SGLang server at this URL instead of an in-process engine"""
    device: str = "auto"
    """cpu, cuda, or auto"""
    dtype: DType = "float32"
    """dtype of the engine's weights (the paper's code: float16); a float32 HF engine on one process may decode
    with the policy's own weights, another dtype gets a copy, refreshed after each update"""
    deterministic: bool = False
    """bit-exact runs: one request at a time in the engine, deterministic kernels"""
    lockstep: bool = True
    """the HF engine decodes only while every live trajectory waits on it, so that a batch's make-up, and so a
    matmul's last bits, follow the tokens and not the clock (a sandbox call pauses decoding)"""


@dataclass
class Sandbox:
    """Where the model's code runs (sandbox.py)."""
    sandbox_slots: int = 2
    """cells executing at once"""
    tool_timeout_s: float = 4.0
    """per-call time limit (paper: 4 s)"""
    tool_clock: Literal["cpu", "wall"] = "cpu"
    """what the limit counts: cpu (the call's CPU time, the wall clock at 3x for code that sleeps), so that a loaded
    machine gives the verdicts of a quiet one; wall (the official code)"""
    tool_memory_mb: int = 1024
    """per-call address-space limit"""


@dataclass
class Machinery:
    """train.py's machinery, under one heading of its --help: the engine, the sandbox and how the update runs."""
    engine: Engine = field(default_factory=Engine)
    sandbox: Sandbox = field(default_factory=Sandbox)
    update: Update = field(default_factory=Update)


# ---------------------------------------------------------------------- eval.py's and sft.py's own

@dataclass
class Bench:
    """eval.py's benchmarks, their data and their grading."""
    benchmarks: str = "aime24,aime25,gpqa,lcb"
    """comma-separated benchmarks: aime24, aime25, gpqa, lcb"""
    limit: int = 0
    """evaluate only the first N problems of each benchmark (0: all)"""
    score: str = ""
    """re-grade this saved JSONL of responses and print its tables (no model is loaded)"""
    out: str = ""
    """write graded responses here as JSONL (default out/eval/<model>.jsonl; with --score: none)"""
    n: int = 16
    """samples per problem for aime24/aime25/gpqa (paper: 16; 32 for the 7B)"""
    lcb_n: int = 10
    """samples per problem for lcb"""
    data_dir: str = ""
    """folder with aime24.jsonl / aime25.jsonl (default: $CLEANER_DATA or ../shared/data)"""
    gpqa_path: str = ""
    """GPQA-Diamond file you provide: gpqa_diamond.csv, its hub parquet, or GPQA's dataset.zip"""
    gpqa_zip_password: str = "deserted-untie-orchid"
    """password of GPQA's dataset.zip, as published in the GPQA README"""
    gpqa_seed: int = 0
    """seed of the per-question choice shuffle"""
    lcb_dir: str = ""
    """folder with LiveCodeBench release files test*.jsonl (code_generation_lite)"""
    lcb_start: str = "2025-02"
    """first contest month (YYYY-MM) kept from LiveCodeBench"""
    lcb_end: str = "2025-05"
    """last contest month (YYYY-MM) kept from LiveCodeBench"""
    code_timeout_s: float = 6.0
    """per-test time limit for code (LiveCodeBench's default)"""
    grade_workers: int = 4
    """responses graded in parallel (code runs in the sandbox)"""
    lcb_grader: LcbGrader = "strict"
    """LiveCodeBench grading: strict (ours: each test in a fresh process) or official (LiveCodeBench's harness:
    its code extraction, exits, stdin and comparisons; machinery/lcb.py)"""


@dataclass
class Sft:
    """sft.py's cold start: its data, its own optimisation recipe (not GRPO's) and its check (sft.py)."""
    data: str = "synth"
    """'synth' for generated warm-up conversations, else a JSONL of OpenAI-format chat conversations"""
    n_conversations: int = 128
    """conversations to train on (synth: how many to generate; a file: its first N rows, 0 = all)"""
    fix_fraction: float = 0.0
    """synth: share of conversations whose first call is broken (its real error from the sandbox follows) and a
    second call fixes it, so the model learns to call again after an error, which SAAR purifies"""
    tool_format: CallFormat = "markdown"
    """how calls are written, as in the rollout: markdown (```python blocks) or hermes (<tool_call> JSON)"""
    tool_output_chars: int = 256
    """tool outputs are cut to this many characters (middle cut), as the rollout does"""
    max_len: int = 2048
    """conversations longer than this many tokens are dropped (and counted)"""
    epochs: int = 1
    """passes over the conversations"""
    lr: float = 2e-4
    """peak learning rate (AdamW), reached after the warmup, then decayed linearly to 0"""
    batch_size: int = 8
    """conversations per optimizer step"""
    micro_tokens: int = 2048
    """tokens per packed forward/backward (a memory knob: it does not change the gradient)"""
    warmup_steps: int = 2
    """optimizer steps of linear LR warmup"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """max gradient norm (0 = off)"""
    train_layers: int = 12
    """train only the top N decoder layers and the final norm (0 = all); the rest gets no backward pass"""
    eval_n: int = 32
    """held-out warm-up problems sampled (T=1) after training, and before it for the base model; 0 = skip"""
    eval_base: bool = True
    """also evaluate the base model before training"""
    out: str = "runs/sft"
    """folder for the step log (log.jsonl) and summary.json; '' = no files"""
    save: str = ""
    """where the fine-tuned model (HF folder) goes; '' = <out>/model"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""


# ---------------------------------------------------------------------- the entry scripts' arguments

@dataclass
class Train:
    """train.py's arguments: the algorithm's sections first (their order in --help), then the model and seed, the
    data and the run's, then the machinery's."""
    rollout: Rollout = field(default_factory=Rollout)
    saar: TrainSaar = field(default_factory=TrainSaar)
    grpo: Grpo = field(default_factory=Grpo)
    common: Common = field(default_factory=Common)
    data: Data = field(default_factory=Data)
    run: Run = field(default_factory=Run)
    machinery: Machinery = field(default_factory=Machinery)


@dataclass
class Eval:
    """eval.py's arguments; the rollout starts from the paper's evaluation (temperature 1.0, top-p 0.6, 16 turns,
    the budget by device, the tool format by tokenizer) and its SGLang memory share (0.8)."""
    common: Common = field(default_factory=Common)
    bench: Bench = field(default_factory=Bench)
    rollout: Rollout = field(default_factory=lambda: Rollout(tool_format="auto", max_turns=16, max_response_tokens=0,
                                                             temperature=1.0, top_p=0.6))
    saar: EvalSaar = field(default_factory=EvalSaar)
    engine: Engine = field(default_factory=lambda: Engine(sglang_mem_fraction=0.8))
    sandbox: Sandbox = field(default_factory=Sandbox)


@dataclass
class SftArgs:
    """sft.py's arguments: the model and seed, and the cold start's own settings (the tool format, the learning rate
    and the trained layers of the cold start, which train.py passes or leaves at these defaults)."""
    common: Common = field(default_factory=Common)
    sft: Sft = field(default_factory=Sft)


# --faithful: the official code's (Open-CLEANER, veRL) choices where our defaults differ, in one place
FAITHFUL = dict(warmup_unit="train", agg="verl-token-mean", math_grader="strict-box", tool_echo=True,
                tool_header=True, repair_json=True, tool_cap_ends=False, last_turn_calls=False, sim_eos=True,
                max_prompt_tokens=2560, lcb_grader="official", rollout_is="none", tool_clock="wall")


def sections(args) -> list:
    """The section dataclasses of an entry script's arguments, in order (Machinery's in its place)."""
    parts = [getattr(args, f.name) for f in dataclasses.fields(args)]
    return [s for part in parts for s in (sections(part) if isinstance(part, Machinery) else [part])]


def flat(args) -> dict:
    """Every setting by its flag's name (run.json, the eval cache key)."""
    return {f.name: getattr(s, f.name) for s in sections(args) for f in dataclasses.fields(s)}


def replace(args, **values):
    """A copy of args with settings replaced by name, whichever section holds them; an unknown name raises."""
    unknown = set(values) - set(flat(args))
    if unknown:
        raise TypeError(f"unknown settings {sorted(unknown)}")
    return _replace(args, values)


def _replace(obj, values: dict):
    """obj with the settings of values that it holds replaced, in its sections too."""
    new = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            new[f.name] = _replace(v, values)
        elif f.name in values:
            new[f.name] = values[f.name]
    return dataclasses.replace(obj, **new)


def unflat(cls, values: dict):
    """An entry script's arguments from a flat dict (a run.json); names it does not know are ignored."""
    args = cls()
    return replace(args, **{k: v for k, v in values.items() if k in flat(args)})


# --eval-only keeps these of the call's own settings; everything else comes from the run's run.json
EVAL_ONLY_OWN = ("run_name", "out_dir", "resume", "eval_only", "eval_saar", "eval_sampled", "device", "wandb_project")


def args_of_run(args):
    """--eval-only: the run's own settings (its run.json), with this call's run, eval and device flags. A run
    from an older commit may lack newer settings: they keep their defaults."""
    path = os.path.join(args.run.out_dir, args.run.run_name, "run.json")
    if not args.run.run_name or not os.path.exists(path):
        raise SystemExit(f"--eval-only: no run at {path}; name an existing run with --run-name (and --out-dir)")
    with open(path) as f:
        saved = json.load(f)["args"]
    mine = flat(args)
    return replace(unflat(type(args), saved), **{k: mine[k] for k in EVAL_ONLY_OWN})


def apply_faithful(args):
    """args with FAITHFUL's values for the settings it has, when --faithful is set."""
    if not args.common.faithful:
        return args
    return replace(args, **{k: v for k, v in FAITHFUL.items() if k in flat(args)})


def cli(cls, description: str, argv: list[str] | None = None):
    """Parse an entry script's command line into cls (flat flag names), --faithful applied."""
    return apply_faithful(tyro.cli(tyro.conf.OmitArgPrefixes[cls], args=argv, description=description))
