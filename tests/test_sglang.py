"""sglang_engine.SGLangEngine through the real SGLang: in-process and as an HTTP server, and train.py end to end.

These run in the environment `bash scripts/sglang_env.sh DIR` builds (`DIR/bin/python -m pytest -q
tests/test_sglang.py`; .ci/run does so). On a machine without a GPU that is SGLang's CPU engine, in float32 with
torch-native attention; the model is the only small thing. Outside that environment (no sglang) they skip, unless
CLEANER_REQUIRE_SGLANG=1 (set by .ci/run), which turns a missing sglang into a failure.
"""
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from machinery import engine, hf_engine, sglang_engine
from data import models

if importlib.util.find_spec("sglang") is None:  # find_spec: sglang must not be imported before the engine sets
    if os.environ.get("CLEANER_REQUIRE_SGLANG"):  # SGLANG_USE_CPU_ENGINE, which its modules read at import
        raise ImportError("CLEANER_REQUIRE_SGLANG is set, but sglang is not installed in this environment "
                          "(build one with bash scripts/sglang_env.sh DIR and run DIR/bin/python -m pytest)")
    pytest.skip("sglang is not installed here (bash scripts/sglang_env.sh DIR)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = "float32" if DEVICE == "cpu" else "bfloat16"  # SGLang's CPU engine runs float32; log-probs then match
TOL = 1e-3 if DEVICE == "cpu" else 0.15               # per-token |log-prob| gap to the fp32 trainer
NAME = "smollm2-135m"  # real weights, so greedy text is text and stop strings are met


def sglang_shm() -> set[str]:
    """SGLang's own /dev/shm files (the semaphores this process still holds are unlinked at its exit, which
    tests/test_paper_scripts.py checks of train.py's)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(sglang_engine._SGLANG_SHM)}


@pytest.fixture(scope="module")
def tok():
    return models.load_tokenizer(NAME)


@pytest.fixture(scope="module")
def policy():
    """The trainer's model: float32, the engine's starting weights."""
    return models.load_model(NAME, dtype=torch.float32).eval()


def sglang_tmp() -> set[str]:
    """What names SGLang's sockets in the temp folder: tempfile's names (tmpXXXXXXXX), or the engine's folder."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("tmp", "cleaner-sglang-"))}


@pytest.fixture(scope="module")
def files_before():
    """SGLang's /dev/shm files and temp-folder entries before the engine starts."""
    return sglang_shm(), sglang_tmp()


@pytest.fixture(scope="module")
def eng(tok, files_before):
    e = sglang_engine.SGLangEngine(models.resolve(NAME), dtype=DTYPE, device=DEVICE, mem_fraction_static=0.3,
                            eos_token_ids=[tok.eos_token_id])
    yield e
    e.shutdown()


def prompt(tok, text="What is 2+3? Answer in one line."):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=False))


def gen(eng, ids, **kw):
    return asyncio.run(eng.generate(ids, engine.SamplingParams(**{"temperature": 0.0, "max_new_tokens": 24, **kw})))


def trainer_logprobs(model, ids: list[int], start: int) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= start under the trainer's model, float32 (T - start,)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[start:])[:, None])[:, 0]


def perturbed(model, scale: float = 1.5) -> dict:
    """The model's weights with every MLP down-projection scaled: a different policy of the same shapes."""
    return {k: v * scale if "down_proj" in k else v for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------- generate, score

def test_generate_is_token_in_token_out_with_the_trainers_logprobs(eng, tok, policy):
    ids = prompt(tok)
    out = gen(eng, ids)
    assert out.finish_reason == "stop" and out.token_ids[-1] == tok.eos_token_id  # EOS kept, not trimmed
    assert len(out.logprobs) == len(out.token_ids) > 1
    ref = trainer_logprobs(policy, ids + out.token_ids, len(ids))
    with torch.no_grad():
        first = policy(torch.tensor([ids])).logits[0, -1].argmax().item()
    assert out.token_ids[0] == first  # greedy from the same weights
    torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=TOL, rtol=0)


def test_max_new_tokens_stop_token_and_stop_string(eng, tok):
    ids = prompt(tok)
    full = gen(eng, ids)
    cut = gen(eng, ids, max_new_tokens=3)
    assert cut.token_ids == full.token_ids[:3] and cut.finish_reason == "length"
    at = full.token_ids[2]
    by_token = gen(eng, ids, stop_token_ids=[at])
    assert by_token.token_ids == full.token_ids[:full.token_ids.index(at) + 1] and by_token.finish_reason == "stop"
    text = tok.decode(full.token_ids[1:3])
    by_str = gen(eng, ids, stop=[text])
    assert by_str.finish_reason == "stop" and tok.decode(by_str.token_ids).endswith(text)  # matched text kept
    assert by_str.token_ids == full.token_ids[:len(by_str.token_ids)] and len(by_str.token_ids) <= 3
    assert gen(eng, ids, max_new_tokens=0).token_ids == []


def test_sampling_runs_and_seeds_need_deterministic_inference(eng, tok):
    """Per-request seeds are SGLang's only with deterministic inference, which its CPU attention lacks: asking
    for it on the CPU is refused when the engine is made, before anything starts."""
    outs = [gen(eng, prompt(tok), temperature=1.0, top_p=0.9, max_new_tokens=16, seed=s) for s in (1, 2)]
    assert all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    assert all(lp <= 0.0 for o in outs for lp in o.logprobs)
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="deterministic"):
            sglang_engine.SGLangEngine(models.resolve(NAME), dtype=DTYPE, device="cpu", deterministic=True)
        assert time.perf_counter() - t0 < 1.0  # refused at once, no engine started


def test_score_equals_the_generation_logprobs(eng, tok, policy):
    ids = prompt(tok)
    out = gen(eng, ids)
    scored = asyncio.run(eng.score(ids + out.token_ids, len(ids)))
    torch.testing.assert_close(torch.tensor(scored), torch.tensor(out.logprobs), atol=TOL, rtol=0)
    torch.testing.assert_close(torch.tensor(scored), trainer_logprobs(policy, ids + out.token_ids, len(ids)),
                               atol=TOL, rtol=0)
    assert asyncio.run(eng.score(ids, len(ids))) == []


def test_greedy_tokens_agree_with_the_hf_engine_on_the_demos_prompts(eng, tok, policy, capsys):
    """The demo's own problems, with its tool-format prompts: SGLang's greedy tokens against the HF engine's,
    both float32 on the CPU (on a GPU SGLang runs bfloat16, and only the first tokens are compared)."""
    import config
    import rollout
    from data.synth import load_problems
    cfg = config.Train().rollout
    probs = load_problems(config.Train().data.train_data, seed=0, n=8)
    prompts = [rollout.prompt_ids(tok, p.problem, p.task, cfg.tool_format, meta=p.meta) for p in probs]
    hf = hf_engine.HFEngine(policy, tok, max_batch=1, deterministic=True, eos_token_ids=[tok.eos_token_id])
    n = 48 if DEVICE == "cpu" else 4

    async def both(ids):
        p = engine.SamplingParams(temperature=0.0, max_new_tokens=n)
        return (await eng.generate(ids, p)).token_ids, (await hf.generate(ids, p)).token_ids
    pairs = [asyncio.run(both(ids)) for ids in prompts]
    same = sum(a == b for a, b in pairs)
    with capsys.disabled():
        print(f"\nSGLang ({DTYPE}, {DEVICE}) and HF greedy tokens agree on {same} of {len(pairs)} demo prompts "
              f"({n} tokens each)")
    assert same >= len(pairs) - 1  # a near-tie may flip one: kernels differ in the last bits
    assert all(a[:4] == b[:4] for a, b in pairs)


# ---------------------------------------------------------------------------------------------- the weight push

def test_update_weights_changes_the_tokens_and_matches_the_trainer(eng, tok, policy):
    ids = prompt(tok)
    before = gen(eng, ids)
    new = perturbed(policy)
    eng.update_weights(new.items())
    after = gen(eng, ids)
    assert after.token_ids != before.token_ids
    trainer = models.load_model(NAME, dtype=torch.float32).eval()
    trainer.load_state_dict(new)
    torch.testing.assert_close(torch.tensor(after.logprobs),
                               trainer_logprobs(trainer, ids + after.token_ids, len(ids)), atol=TOL, rtol=0)
    eng.update_weights(policy.state_dict().items())  # back: the other tests' engine holds the policy's weights
    assert gen(eng, ids).token_ids == before.token_ids


def test_a_push_outside_the_weight_update_session_is_refused(eng, policy):
    """Why update_weights opens begin_weight_update ... end_weight_update: SGLang 0.5.23 refuses a push without
    it (the adapter before issue 43 crashed here at the end of a run's first step)."""
    with pytest.raises(RuntimeError, match="begin_weight_update"):
        eng._push(list(policy.state_dict().items())[:1])


def test_flush_release_and_resume(eng, tok, policy):
    ids = prompt(tok)
    before = gen(eng, ids)
    eng.flush_cache()
    eng.release_memory()
    eng.resume_memory()
    eng.update_weights(policy.state_dict().items())  # what train.py does after resume: released weights are gone
    assert gen(eng, ids).token_ids == before.token_ids
    assert eng.frees_memory == (DEVICE != "cpu")  # the memory saver needs CUDA: on the CPU there is nothing to free


def children() -> list:
    """This process's children but multiprocessing's resource tracker (any process that used it has one)."""
    import psutil
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.ZombieProcess:
            out.append(p)  # dead but not reaped: still in the process table
        except psutil.NoSuchProcess:
            pass
    return out


def test_shutdown_leaves_no_process_and_no_file(eng, files_before):
    assert children()  # the engine's scheduler and detokenizer
    eng.shutdown()
    deadline = time.time() + 30
    while children() and time.time() < deadline:
        time.sleep(0.2)
    assert children() == []
    assert sglang_shm() <= files_before[0] and sglang_tmp() <= files_before[1]
    eng.shutdown()  # twice is harmless (the fixture calls it again)


def test_an_engine_that_fails_to_start_leaves_no_file(tok):
    before = sglang_tmp()
    with pytest.raises(TypeError, match="no_such_setting"):  # refused by SGLang's own settings, inside its start
        sglang_engine.SGLangEngine(models.resolve(NAME), dtype=DTYPE, device=DEVICE, no_such_setting=1)
    assert sglang_tmp() <= before


# ---------------------------------------------------------------------------------------------- HTTP server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_server_mode_generates_and_takes_the_same_weight_push(tok, policy, tmp_path):
    """--sglang-url: a server this test starts on loopback, and the same calls over HTTP; CPU tensors travel by
    name through /dev/shm (file_system sharing), so the server must be on this machine, as the adapter says."""
    port, shm = free_port(), set(os.listdir("/dev/shm"))
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", models.resolve(NAME), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", DTYPE, "--device", DEVICE, "--mem-fraction-static", "0.3"]
    if DEVICE == "cpu":
        cmd += ["--attention-backend", "torch_native"]
    # TMPDIR: the files that name the server's sockets, which it never removes, go with the test's folder
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1" if DEVICE == "cpu" else "0", "TMPDIR": str(tmp_path)}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.time() < deadline, "the SGLang server did not come up in 240 s"
            time.sleep(1)
        eng = sglang_engine.SGLangEngine(server_url=url, eos_token_ids=[tok.eos_token_id])
        assert eng.frees_memory == (DEVICE != "cpu")  # read from the server's own settings
        ids = prompt(tok)
        before = gen(eng, ids)
        assert before.finish_reason == "stop" and len(before.logprobs) == len(before.token_ids)
        torch.testing.assert_close(torch.tensor(before.logprobs),
                                   trainer_logprobs(policy, ids + before.token_ids, len(ids)), atol=TOL, rtol=0)
        eng.update_weights(perturbed(policy).items())
        after = gen(eng, ids)
        assert after.token_ids != before.token_ids
        eng.release_memory()
        eng.resume_memory()
        eng.update_weights(policy.state_dict().items())
        assert gen(eng, ids).token_ids == before.token_ids
        scored = asyncio.run(eng.score(ids + before.token_ids, len(ids)))
        torch.testing.assert_close(torch.tensor(scored), torch.tensor(before.logprobs), atol=TOL, rtol=0)
        eng.shutdown()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        sglang_engine._remove_orphan_shm(shm)  # what the server, a process of the user's, leaves: not the adapter's


# ---------------------------------------------------------------------------------------------- train.py

TRAIN = ["--model", "tiny-qwen3", "--no-warm-start", "--tool-format", "hermes", "--prompts-per-step", "2",
         "--samples-per-prompt", "2", "--mini-batch-prompts", "1", "--max-response-tokens", "24",
         "--overlong-buffer", "8", "--eval-size", "0", "--dump-rollouts", "2", "--lr", "1e-3", "--sandbox-slots", "1",
         "--seed", "3", "--no-eval-cache", "--engine", "sglang", "--sglang-mem-fraction", "0.2"]


def metrics(folder: Path) -> dict:
    return {r["step"]: r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())}


def test_a_skipped_weight_push_trips_the_mismatch_monitor(tmp_path):
    """The control: the engine only flushed after each update, never given the new weights, so step 2 samples
    from step 0's policy. The tiny random model earns no reward, so its advantages are 0 and AdamW's decoupled
    weight decay, set large, is what moves the trainer's weights away. (A process of its own: an in-process
    engine's shutdown kills every child of its process.)"""
    import config
    code = ("import sys, config, train; "
            "train.push_weights = lambda s: s.eng.flush_cache(); "
            "train.main(config.cli(train.Args, '', sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, *TRAIN, "--steps", "2", "--weight-decay", "300", "--out-dir",
                        str(tmp_path), "--run-name", "stale"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = metrics(tmp_path / "stale")
    assert m[1]["mismatch_kl"] < 1e-6
    assert m[2]["mismatch_kl"] > config.Grpo.mismatch_warn_kl
    assert "warning: step 2:" in r.stdout and "stale" in r.stdout
