"""The paper's scripts, run as a user runs them: every script in scripts/ end to end, in miniature, on SGLang.

Each script runs unchanged (`NPROC=2 bash scripts/qwen3_4b_cleaner.sh <flags>`), with only flags appended that
shrink the run (SHRINK: the offline SmolLM2-135M, warm-started in the scripts' hermes format; the CPU in
float32; 2 steps of 2 prompts x 4 samples; short responses) or place it (the data, the run folder). The main run
on two torchrun ranks, each with its own SGLang CPU engine at the default memory share, the policy under FSDP2
over gloo, from an empty cache; the other recipes on one rank, in its caches. The training data is a fixture in Open-AgentRL's published verl row layout, through
data/download.py's converter; the eval scripts read AIME from the shared problem sets, GPQA-Diamond as its CSV and
LiveCodeBench as code_generation_lite files, each through the project's loaders. Then each eval script on the
checkpoint its training script wrote, its records re-scored by `eval.py --score`, and the paper's table made
from them (scripts/table.py).

The main run loses a rank mid-step (SIGKILL, after step 1's checkpoint); the job must end and the run resume to
the end. SGLang's CPU engine ignores per-request seeds (it has no deterministic mode), so a resumed run samples
other rollouts than an uninterrupted one would, and their final weights cannot be compared (they differ by as
much as a step moves them). What a resume must do is checked instead: it starts at the checkpoint's step and
trains from the data position the checkpoint holds. The bit-for-bit resume is
test_train's (the HF engine under --deterministic).

These run in the environment `bash scripts/sglang_env.sh DIR` builds (.ci/run); elsewhere they skip, unless
CLEANER_REQUIRE_SGLANG=1 turns a missing sglang into a failure.
"""
import base64
import importlib.util
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    if os.environ.get("CLEANER_REQUIRE_SGLANG"):
        raise ImportError("CLEANER_REQUIRE_SGLANG is set, but sglang is not installed in this environment "
                          "(build one with bash scripts/sglang_env.sh DIR and run DIR/bin/python -m pytest)")
    pytest.skip("the paper's scripts run on SGLang, not installed here (bash scripts/sglang_env.sh DIR)",
                allow_module_level=True)


from data import download as dl  # noqa: E402
from data.synth import make_problems  # noqa: E402
from test_sglang import sglang_shm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SHRINK = ["--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32", "--update-dtype", "float32",
          "--no-gradient-checkpointing", "--steps", "2", "--prompts-per-step", "2", "--mini-batch-prompts", "2",
          "--samples-per-prompt", "4", "--max-response-tokens", "384", "--overlong-buffer", "32",
          "--eval-size", "1", "--max-tokens-per-micro", "2048", "--sandbox-slots", "2", "--save-every", "1"]
EVAL_SHRINK = ["--device", "cpu", "--dtype", "float32", "--n", "2", "--lcb-n", "2", "--limit", "1",
               "--max-new-tokens", "128", "--max-turns", "3"]
STEP = re.compile(r"step +(\d+) \|.*\| saar s/d/g (\d+)/(\d+)/(\d+) .*\| mismatch_kl ([0-9.e+-]+)")


# ---------------------------------------------------------------------- the user's files

def open_agentrl_rows() -> list[dict]:
    """Rows in Open-AgentRL-30K's verl parquet layout (data_source, prompt, reward_model, ability, extra_info):
    math rows (problems of the kinds the warm start learned to compute, so that the miniature's model calls the
    tool) and code rows (real Codeforces problems with their stdin/stdout tests, in the TACO ground-truth form)."""
    tail = " Let's think step by step and output the final answer within \\boxed{}."
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": p.problem + tail}], "ability": "math",
             "reward_model": {"ground_truth": p.answer, "style": "rule"}, "extra_info": {"index": i}}
            for i, p in enumerate(make_problems(6, seed=11, difficulty="rl"))]
    for i, line in enumerate((SHARED / "codeforces_test.jsonl").read_text().splitlines()[:2]):
        cf = json.loads(line)
        gt = {"inputs": [t["input"] for t in cf["tests"]], "outputs": [t["output"] for t in cf["tests"]]}
        rows.append({"data_source": "train-code-taco-medium", "prompt": [{"role": "user", "content": cf["problem"]}],
                     "ability": "code", "reward_model": {"ground_truth": json.dumps(gt), "style": "rule"},
                     "extra_info": {"index": 100 + i}})
    return rows


def lcb_rows() -> list[dict]:
    """Real Codeforces problems in LiveCodeBench's code_generation_lite layout, dated in the paper's window, the
    private tests stored as LiveCodeBench stores them (base64 of zlib of a pickled JSON string)."""
    rows = []
    for i, line in enumerate((SHARED / "codeforces_test.jsonl").read_text().splitlines()[2:5]):
        cf = json.loads(line)
        cases = [dict(t, testtype="stdin") for t in cf["tests"]]
        rows.append({"question_title": f"cf {cf['id']}", "question_content": cf["problem"], "platform": "codeforces",
                     "question_id": str(cf["id"]), "contest_id": "cf", "contest_date": f"2025-03-0{i + 1}T00:00:00",
                     "starter_code": "", "difficulty": "easy", "public_test_cases": json.dumps(cases[:1]),
                     "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases[1:])))).decode(),
                     "metadata": "{}"})
    return rows


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """The user's machine: the SGLang venv first on PATH, an empty cache, the data as download.py writes it."""
    if not SHARED.is_dir():
        pytest.skip(f"real problem sets not found at {SHARED}")
    base = tmp_path_factory.mktemp("paper")
    data = base / "data_cache"
    rows = dl.convert_open_agentrl(open_agentrl_rows())
    assert {("tests" in r) for r in rows} == {True, False}  # math rows and code rows
    dl.write_jsonl(rows, data / "open_agentrl_30k.jsonl")
    lcb = data / "livecodebench"
    lcb.mkdir()
    (lcb / "test6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lcb_rows()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "CLEANER_CACHE": str(base / "cache"), "GPQA": str(ROOT / "tests" / "fixtures" / "gpqa_synthetic.csv"),
           "LCB": str(lcb), "PYTHONUNBUFFERED": "1"}
    return dict(base=base, env=env, out=base / "out",
                place=["--train-data", str(data / "open_agentrl_30k.jsonl"), "--out-dir", str(base / "out")])


def script(paper, name: str, *flags, nproc: int = 2, env: dict | None = None, timeout: int = 900):
    """bash scripts/NAME.sh FLAGS as a user runs it; (exit code, everything it printed)."""
    r = subprocess.run(["bash", f"scripts/{name}.sh", *flags], cwd=ROOT, capture_output=True, text=True,
                       env={**paper["env"], "NPROC": str(nproc), **(env or {})}, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def steps(printed: str) -> list[tuple[int, int, int, int, float]]:
    """Each step line's (step, shallow, deep, given up, mismatch KL)."""
    return [(int(a), int(b), int(c), int(d), float(e)) for a, b, c, d, e in STEP.findall(printed)]


# ---------------------------------------------------------------------- bad input

def test_bad_input_stops_before_a_model_loads(paper):
    """A missing data file, a model path that does not exist, NPROC that the prompts do not divide by, and a
    Python without sglang: a line naming the problem, before any model loads (SHRINK's model is never built),
    and no traceback of ours (torchrun's report of the failed ranks follows)."""
    flags = [*SHRINK, *paper["place"]]
    cases = [
        (dict(), ["--train-data", str(paper["base"] / "nope.jsonl")], "nope.jsonl"),
        (dict(), ["--model", str(paper["base"] / "no-run" / "hf")], "no model folder at"),
        (dict(nproc=4), [], "must divide by mini_batch_prompts (2), and that by the world size (4)"),
    ]
    venv = ROOT / ".venv" / "bin"
    if (venv / "torchrun").exists() and subprocess.run([venv / "python", "-c", "import sglang"],
                                                       capture_output=True).returncode:
        cases.append((dict(env={"PATH": f"{venv}:{os.environ['PATH']}"}), [], "bash scripts/sglang_env.sh DIR"))
    for kw, extra, says in cases:
        t0 = time.monotonic()
        code, printed = script(paper, "qwen3_4b_cleaner", *flags, *extra, timeout=300, **kw)
        assert code != 0 and says in printed, printed[-3000:]
        assert not re.search(r'File ".*(train|config|eval)\.py", line', printed), printed[-3000:]  # torchrun's own
        assert not (paper["base"] / "cache" / "models").exists()  # nothing was built, nothing loaded
        assert time.monotonic() - t0 < 120
    code, printed = script(paper, "eval_qwen3_4b_cleaner", *EVAL_SHRINK, env={"MODEL": str(paper["base"] / "no")})
    assert code != 0 and "no model folder at" in printed and "Traceback" not in printed, printed[-3000:]


# ---------------------------------------------------------------------- the main run: a rank killed, resumed

def processes(has: str, under: int | None = None) -> list:
    """The live processes whose command line has `has` (below the process `under`, or anywhere)."""
    import psutil
    procs = psutil.Process(under).children(recursive=True) if under else psutil.process_iter()
    found = []
    for p in procs:
        try:
            if has in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone meanwhile
            pass
    return found


@pytest.fixture(scope="module")
def cleaner(paper):
    """The main run, from an empty cache: one rank SIGKILLed mid-step 2, after step 1's checkpoint; then the job
    again with --resume, to the end."""
    flags = [*SHRINK, *paper["place"]]  # the hermes cold start fails about 9 calls in 10 here: SAAR has work at 4 samples
    run = paper["out"] / "qwen3-4b-cleaner"
    proc = subprocess.Popen(["bash", "scripts/qwen3_4b_cleaner.sh", *flags], cwd=ROOT,
                            env={**paper["env"], "NPROC": "2"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    first, engines, t_kill = [], None, None
    try:
        for line in proc.stdout:
            first.append(line)
            if t_kill is None and "step    1 |" in line:
                while not (run / "ckpt.pt").exists():  # step 1's checkpoint, written in the background
                    time.sleep(0.2)
                engines = len(processes("sglang::scheduler", under=proc.pid))
                ranks = [p for p in processes("train.py", under=proc.pid) if p.environ().get("RANK") == "1"]
                assert len(ranks) == 1, "".join(first)[-3000:]
                ranks[0].kill()  # SIGKILL to rank 1 mid-step: the rest of the job must follow
                t_kill = time.monotonic()
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    t_down = time.monotonic() - t_kill if t_kill else None
    for _ in range(60):  # every engine process of the dead job ends too (the dead rank's own orphans included)
        left = processes("sglang::")
        if not left:
            break
        time.sleep(1)
    for p in left:
        p.kill()
    shm = sglang_shm()  # what the SIGKILLed engines left is theirs: the resumed job must leave nothing of its own
    code, resumed = script(paper, "qwen3_4b_cleaner", *flags, "--resume")
    return dict(first="".join(first), t_down=t_down, code=proc.returncode, engines=engines, left=len(left),
                resumed=resumed, resumed_code=code, after=dict(processes=len(processes("sglang::")),
                                                               shm=sglang_shm() - shm))


def test_main_run_two_ranks_two_engines_saar_and_caches(paper, cleaner):
    first, resumed = cleaner["first"], cleaner["resumed"]
    assert cleaner["resumed_code"] == 0, resumed[-5000:]
    info = json.loads((paper["out"] / "qwen3-4b-cleaner" / "run.json").read_text())["args"]
    assert info["engine"] == "sglang" and info["faithful"] and info["tool_format"] == "hermes"
    assert cleaner["engines"] == 2  # two ranks, each with its own SGLang CPU engine
    lines = steps(first) + steps(resumed)
    assert [s[0] for s in lines] == [1, 2], first[-3000:] + resumed[-3000:]
    assert all(s[4] < 1e-6 for s in lines)  # float32 both: the pushed weights are live on both ranks' engines
    assert "warning: step" not in first + resumed
    assert cleaner["after"] == dict(processes=0, shm=set())  # the finished job left no engine and no /dev/shm file
    assert sum(s[1] + s[2] + s[3] for s in lines) >= 1, first[-3000:]  # SAAR at work: calls failed
    # every cache built once on this machine, by one of the two ranks that wanted it, and reused after
    assert first.count("[models] building smollm2-135m") == 1 and first.count("fine-tuning once into") == 1
    assert resumed.count("[sft] warm start: using cached") == 2  # both ranks


def test_a_killed_rank_ends_the_job_and_the_run_resumes(paper, cleaner):
    first, resumed = cleaner["first"], cleaner["resumed"]
    assert cleaner["t_down"] is not None and cleaner["t_down"] < 120, first[-3000:]
    assert cleaner["code"] != 0 and "local_rank: 1" in first and "SIGKILL" in first, first[-3000:]
    assert cleaner["left"] == 0  # no engine outlived its job
    assert "resumed" in resumed and [s[0] for s in steps(resumed)] == [2], resumed[-3000:]
    # the checkpoint the kill left was whole: the resumed run went on at its step and its data position (a
    # rollout's group is the data position of its prompt: step 1 drew positions 0 and 1, one a rank)
    rows = [json.loads(x) for x in (paper["out"] / "qwen3-4b-cleaner" / "rollouts" / "step_000002.jsonl").open()]
    assert rows and {r["meta"]["group"] for r in rows} == {2}  # rank 0's prompt of step 2


# ---------------------------------------------------------------------- the other recipes

# name: (its run folder, flags); the no-tool run's held-out evaluation is its own (no tool in the prompt), so it
# would cost a step's time without being reused: its eval script evaluates it below
RECIPES = {"qwen3_4b_baseline": ("qwen3-4b-baseline", []), "qwen3_4b_notool": ("qwen3-4b-notool", ["--eval-size", "0"]),
           "qwen25_7b_cleaner": ("qwen25-7b-cleaner", [])}


@pytest.fixture(scope="module")
def recipes(paper, cleaner):
    """The baseline (no SAAR), the no-tool run and the 7B recipe, 1 step each, after the main run, whose caches
    they reuse (the baseline's and the 7B's step-0 evaluation too: their eval settings are the main run's); on one
    rank each (the main run has shown two), 2 samples a prompt."""
    printed = {}
    for name, (_, extra) in RECIPES.items():
        code, printed[name] = script(paper, name, *SHRINK, *paper["place"], "--steps", "1", "--samples-per-prompt", "2",
                                     *extra, nproc=1)
        assert code == 0, printed[name][-5000:]
    return printed


def test_baseline_notool_and_7b_recipes_run(paper, cleaner, recipes):
    settings = {name: json.loads((paper["out"] / run / "run.json").read_text())["args"]
                for name, (run, _) in RECIPES.items()}
    assert not settings["qwen3_4b_baseline"]["saar"]
    assert settings["qwen3_4b_notool"]["tool_format"] == "none" and settings["qwen3_4b_notool"]["max_turns"] == 1
    assert settings["qwen25_7b_cleaner"]["rollback_p"] == 0.7 and settings["qwen25_7b_cleaner"]["lr"] == 1e-6
    for name, printed in recipes.items():
        lines = steps(printed)
        assert [s[0] for s in lines] == [1], printed[-5000:]
        assert all(s[4] < 1e-6 for s in lines)
        assert (paper["out"] / RECIPES[name][0] / "hf" / "model.safetensors").exists()
    assert all(s[1] == s[2] == s[3] == 0 for s in steps(recipes["qwen3_4b_baseline"]))  # SAAR off: no event
    assert re.search(r"tool_calls 0\.00 ", recipes["qwen3_4b_notool"])
    # SAAR purified failed calls (shallow or deep) somewhere in the SAAR runs: the main run's 2 steps, the 7B's
    saar = steps(cleaner["first"]) + steps(cleaner["resumed"]) + steps(recipes["qwen25_7b_cleaner"])
    assert sum(s[1] + s[2] for s in saar) >= 1, [s for s in saar]
    # the step-0 evaluation of the same cold start and eval settings, computed once and reused (the baseline and
    # the 7B recipe differ from the main run only in training settings)
    assert re.search(r"eval step 0 \|.*\| cached ", recipes["qwen3_4b_baseline"])
    assert re.search(r"eval step 0 \|.*\| cached ", recipes["qwen25_7b_cleaner"])


# ---------------------------------------------------------------------- evaluation, and the paper's table

EVALS = {"eval_qwen3_4b_cleaner": "qwen3-4b-cleaner", "eval_qwen3_4b_baseline": "qwen3-4b-baseline",
         "eval_qwen3_4b_notool": "qwen3-4b-notool", "eval_qwen25_7b_cleaner": "qwen25-7b-cleaner",
         "eval_demyagent_4b": "demyagent-4b"}


def test_eval_scripts_on_their_checkpoints_rescored_and_tabled(paper, recipes):
    """Each eval script on the checkpoint its training script wrote (DemyAgent's on the main run's), as the paper
    evaluates (AIME24/25, GPQA-Diamond, LiveCodeBench; test-time SAAR as the paper sets it), its records re-scored
    by eval.py --score to the same tables, then the paper's table from all of them."""
    files = []
    for name, run in EVALS.items():
        model = paper["out"] / (run if run != "demyagent-4b" else "qwen3-4b-cleaner") / "hf"
        out = paper["base"] / "eval" / f"{run}.jsonl"
        # DemyAgent's script is the main run's eval script with its model: one benchmark shows it hands that on
        extra = ["--out", str(out)] + (["--model", str(model), "--benchmarks", "aime24"] if run == "demyagent-4b" else [])
        code, printed = script(paper, name, *EVAL_SHRINK, *extra, env={"MODEL": str(model)})
        assert code == 0 and "Traceback" not in printed, printed[-5000:]
        scored = subprocess.run([sys.executable, "eval.py", "--score", str(out), "--gpqa-path", paper["env"]["GPQA"],
                                 "--lcb-dir", paper["env"]["LCB"]], cwd=ROOT, env=paper["env"], capture_output=True,
                                text=True, timeout=600)
        assert scored.returncode == 0 and "Traceback" not in scored.stdout + scored.stderr, scored.stderr[-3000:]
        tables = scored.stdout.strip()
        assert tables and tables in printed, (tables, printed[-3000:])  # the same numbers, benchmark by benchmark
        assert {json.loads(x)["benchmark"] for x in out.read_text().splitlines()} == \
            ({"aime24"} if run == "demyagent-4b" else {"aime24", "aime25", "gpqa", "lcb"})
        files.append(out)
    table = subprocess.run([sys.executable, "scripts/table.py", *map(str, files)], cwd=ROOT, env=paper["env"],
                           capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-3000:]
    rows = [line for line in table.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == list(EVALS.values())
    assert "published 72.6" in rows[-1]  # DemyAgent-4B's AIME24, beside our miniature's
