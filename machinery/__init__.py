"""machinery: what makes the root scripts fast or safe, not what they compute. Read the root first.

Each module is called from a named place in the root, so a reader of the algorithm can skip it:
  packing.py     the update's packed micro-batches and their log-probs       grpo.update, sft.py
  precision.py   dtypes, autocast, the fp16 loss scaler, the non-finite guard grpo.update, train.py
  mismatch.py    the engine/trainer log-prob gap, veRL's rollout correction   train.py
  lcb.py         code answers run against their tests, judged outside         reward.grade_code
  mathverify.py  math-verify in worker processes, behind a timeout            reward.math_equal
  policy.py      the policy placed: FSDP2 over ranks, its engine, reference  train.setup
  checkpoint.py  the run folder: run.json, checkpoints, metrics, HF export    train.py
  evalcache.py   the step-0 evaluation, reused across runs                    train.py
  warmstart.py   the cold start (sft.py), trained once and reused             train.py, bench/rollout.py
  engine.py      the generation engines: HF (CPU) and SGLang, one interface   build_engine: train.py, eval.py, sft.py
  sandbox_pool.py the sandbox's pool of zygotes, the trainer's side           sandbox.Sandbox
  zygote.py      the zygote's program: its entry, its start and its loop      sandbox_pool.Pool, as a process
  zygote_*.py    its rooms: containment, framing, runs, sessions, ... (zygote.py lists them)  zygote.py
packing, precision, mismatch, lcb, mathverify, engine and zygote_frame are leaves: they import no project module
(tests/test_imports.py checks it). The zygote's program, zygote*.py, imports nothing of the project but itself
(it runs alone, in the sandbox), and sandbox_pool.py only that program. checkpoint.py reads config.py and
engine.require, evalcache.py the modules whose source is part of its key, warmstart.py runs sft.py, and policy.py
calls grpo.py's freezing and LoRA before it shards.
"""
