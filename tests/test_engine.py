"""HFEngine against plain transformers: greedy tokens, log-probs, stops, seeds, scoring,
weight pushes, prefix reuse and concurrency. Real (tiny, random) models and real tokenizers."""
import asyncio
import copy
import random

import pytest
import torch

from data.models import load_model, load_tokenizer
from machinery.engine import GenOutput, SamplingParams
from machinery.hf_engine import HFEngine

TEXTS = ["hello world", "a much longer prompt, with quite a few more bytes in it than the others",
         "x", "def f(x):\n    return x * 2\n", "the quick brown fox jumps over"]


def run(coro, timeout=60):
    """Every engine call in these tests is guarded, so a hang fails instead of blocking CI."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture(scope="module", params=["tiny-bytes", "tiny-qwen3"])
def mt(request):
    model = load_model(request.param)
    model.eval()
    return model, load_tokenizer(request.param)


@pytest.fixture(scope="module")
def bytes_mt():
    model = load_model("tiny-bytes")
    model.eval()
    return model, load_tokenizer("tiny-bytes")


@pytest.fixture
def engine_of():
    made = []

    def make(model, tok, **kw):
        e = HFEngine(model, tok, **kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()


def hf_greedy(model, ids, n, eos):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=eos or None,
                         pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def forward_logprobs(model, ids, out, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]


def perturbed(model):
    """A copy of model with every weight moved by seeded noise: other weights to push into an engine."""
    torch.manual_seed(0)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for t in other.parameters():
            t.add_(torch.randn_like(t) * 0.5)
    return other


async def gen_all(engine, prompts, params):
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    return await asyncio.gather(*[engine.generate(p, q) for p, q in zip(prompts, params)])


def test_greedy_equals_hf_generate_in_a_ragged_batch(mt, engine_of):
    model, tok = mt
    engine = engine_of(model, tok, max_batch=8)
    prompts = [tok.encode(t) for t in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts)
    outs = run(gen_all(engine, prompts, SamplingParams(temperature=0, max_new_tokens=20)))
    for p, o in zip(prompts, outs):
        ref = hf_greedy(model, p, 20, engine.eos_token_ids)
        assert o.token_ids == ref
        assert o.finish_reason == ("stop" if ref[-1] in engine.eos_token_ids else "length")
    assert engine.stats["max_rows"] >= 2  # they really were decoded together


def test_logprobs_match_a_fresh_forward_also_for_rows_joining_mid_batch(mt, engine_of):
    model, tok = mt
    engine = engine_of(model, tok, max_batch=8, eos_token_ids=[])
    prompts = [tok.encode(t) for t in TEXTS]

    async def go():
        first = asyncio.ensure_future(engine.generate(prompts[0], SamplingParams(max_new_tokens=40, seed=1)))
        while engine.stats["decode_steps"] < 3:
            await asyncio.sleep(0.005)
        params = [SamplingParams(temperature=0.7, max_new_tokens=12, seed=2),
                  SamplingParams(temperature=0, max_new_tokens=12),
                  SamplingParams(temperature=1.3, top_k=5, max_new_tokens=12, seed=3),
                  SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=12, seed=4)]
        late = await gen_all(engine, prompts[1:], params)
        return [await first] + late, [1.0, 0.7, 1.0, 1.3, 1.0]

    outs, temps = run(go())
    assert engine.stats["joined_running_batch"] >= 1
    for p, o, t in zip(prompts, outs, temps):
        ref = forward_logprobs(model, p, o.token_ids, t)
        torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=2e-4, rtol=0)


def test_long_generations_outgrow_the_cache_buffer(bytes_mt, engine_of):
    # the batch cache grows 256 positions at a time; 300 tokens force it to move into bigger buffers
    model, tok = bytes_mt
    engine = engine_of(model, tok, eos_token_ids=[])
    prompts = [tok.encode(t) for t in TEXTS[:2]]
    outs = run(gen_all(engine, prompts, [SamplingParams(temperature=0, max_new_tokens=300),
                                         SamplingParams(max_new_tokens=300, seed=0)]))
    ids = prompts[0] + outs[0].token_ids  # greedy: every token is the argmax of a fresh forward's logits
    with torch.no_grad():
        argmax = model(torch.tensor([ids])).logits[0, len(prompts[0]) - 1:-1].argmax(-1)
    assert outs[0].token_ids == argmax.tolist()
    torch.testing.assert_close(torch.tensor(outs[1].logprobs), forward_logprobs(model, prompts[1], outs[1].token_ids),
                               atol=2e-4, rtol=0)


def test_top_k_1_and_tiny_top_p_are_greedy_and_keep_untruncated_logprobs(bytes_mt, engine_of):
    model, tok = bytes_mt
    engine = engine_of(model, tok, eos_token_ids=[])
    p = tok.encode(TEXTS[1])
    greedy, k1, p0 = run(gen_all(engine, [p, p, p], [SamplingParams(temperature=0, max_new_tokens=10),
                                                     SamplingParams(top_k=1, max_new_tokens=10, seed=5),
                                                     SamplingParams(top_p=1e-6, max_new_tokens=10, seed=6)]))
    assert k1.token_ids == greedy.token_ids == p0.token_ids
    # truncation changes what is sampled, never the reported log-prob (temperature-scaled, pre-truncation)
    torch.testing.assert_close(torch.tensor(k1.logprobs), torch.tensor(greedy.logprobs), atol=2e-4, rtol=0)
    assert max(k1.logprobs) < 0


def test_samples_follow_the_temperature_and_truncated_distribution(bytes_mt, engine_of):
    model, tok = bytes_mt
    engine = engine_of(model, tok, max_batch=16)
    p = tok.encode(TEXTS[0])
    with torch.no_grad():
        logits = model(torch.tensor([p])).logits[0, -1].float()
    n = 400
    for kw in ({"temperature": 0.2, "top_k": 4}, {"temperature": 0.15, "top_p": 0.7}):
        outs = run(gen_all(engine, [p] * n, [SamplingParams(max_new_tokens=1, seed=s, **kw) for s in range(n)]))
        probs = torch.softmax(logits / kw["temperature"], -1)
        order = probs.argsort(descending=True)
        if "top_k" in kw:
            keep = order[:kw["top_k"]]
        else:
            mass = probs[order].cumsum(0) - probs[order]
            keep = order[mass < kw["top_p"]]
        expected = torch.zeros_like(probs)
        expected[keep] = probs[keep] / probs[keep].sum()
        counts = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=len(probs)).float()
        assert set(counts.nonzero()[:, 0].tolist()) <= set(keep.tolist())
        assert 0.5 * (counts / n - expected).abs().sum() < 0.1  # total variation, sampling noise ~0.03


def test_a_rows_draw_does_not_depend_on_the_other_rows(bytes_mt, engine_of):
    from machinery.hf_engine import _Req
    model, tok = bytes_mt
    engine = engine_of(model, tok)
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 3  # (B, V)
    params = [SamplingParams(seed=1), SamplingParams(temperature=0), SamplingParams(top_k=7, seed=2),
              SamplingParams(temperature=0.6, top_p=0.8, seed=3)]

    def rows(idx):
        return [_Req("gen", [0], params[i], 0, None, None, gen=torch.Generator().manual_seed(params[i].seed or 0))
                for i in idx]
    together, lps = engine._sample(logits, rows(range(4)))
    for i in range(4):
        alone, lp = engine._sample(logits[i:i + 1], rows([i]))
        assert alone[0] == together[i] and lp[0] == lps[i]


def test_rows_leaving_the_batch_cache_leave_every_other_row_its_own_kv(bytes_mt, engine_of):
    # a leaving row's cache row takes the batch's last row; each remaining request must still find its own KV
    model, tok = bytes_mt
    engine = engine_of(model, tok, max_batch=8)
    reqs = [type("R", (), {"i": i})() for i in range(6)]
    engine._rows, engine._lens = list(reqs), torch.tensor([5, 9, 3, 7, 4, 6])
    engine._last = torch.arange(6)
    engine._room(6, 9)
    torch.manual_seed(0)
    engine._kv.normal_()
    before = {r.i: engine._kv[:, :, j, :, :int(n)].clone() for j, (r, n) in enumerate(zip(reqs, engine._lens))}
    engine._select([0, 2, 3])  # the last row (5) leaves too
    assert [r.i for r in engine._rows] == [0, 3, 2] and engine._last.tolist() == [0, 3, 2]
    for j, (r, n) in enumerate(zip(engine._rows, engine._lens)):
        assert torch.equal(engine._kv[:, :, j, :, :int(n)], before[r.i])
    engine._select([])
    assert engine._kv is None and engine._rows == []


def test_rows_leaving_and_joining_a_full_batch_decode_as_they_would_alone(bytes_mt, engine_of):
    # max_batch 3 and 6 requests of different lengths: rows finish mid-batch, later ones take their places
    model, tok = bytes_mt
    engine = engine_of(model, tok, max_batch=3, eos_token_ids=[])
    prompts = [tok.encode(t) for t in TEXTS] + [tok.encode(TEXTS[1] + TEXTS[3])]
    lengths = [6, 30, 11, 25, 8, 14]
    outs = run(gen_all(engine, prompts, [SamplingParams(temperature=0, max_new_tokens=n) for n in lengths]))
    for p, o, n in zip(prompts, outs, lengths):
        ids = p + o.token_ids  # greedy: every token is the argmax of a fresh forward's logits
        with torch.no_grad():
            argmax = model(torch.tensor([ids])).logits[0, len(p) - 1:-1].argmax(-1)
        assert len(o.token_ids) == n and o.token_ids == argmax.tolist()
        torch.testing.assert_close(torch.tensor(o.logprobs), forward_logprobs(model, p, o.token_ids), atol=2e-4,
                                   rtol=0)
    assert engine.stats["max_rows"] == 3
    assert engine.stats["prefills"] == 6 and engine.stats["cache_rebuilds"] < 6  # some joined in place


def test_stop_token_stop_string_eos_and_length(bytes_mt, engine_of):
    model, tok = bytes_mt
    p = tok.encode(TEXTS[3])
    ref = hf_greedy(model, p, 30, [])
    free = engine_of(model, tok, eos_token_ids=[])
    g = lambda e, **kw: run(e.generate(p, SamplingParams(temperature=0, **kw)))  # noqa: E731

    # stop token: generation ends right after emitting it, and it is kept
    k = len(ref) // 2
    o = g(free, max_new_tokens=30, stop_token_ids=[ref[k]])
    first = ref.index(ref[k])
    assert (o.token_ids, o.finish_reason) == (ref[:first + 1], "stop")

    # stop string: matched on the decoded new text, the matching tokens are kept (no trim)
    s = tok.decode(ref[10:12])
    j = next(j for j in range(1, len(ref) + 1) if s in tok.decode(ref[:j]))
    o = g(free, max_new_tokens=30, stop=[s])
    assert (o.token_ids, o.finish_reason) == (ref[:j], "stop")
    assert tok.decode(o.token_ids).endswith(s)

    # EOS (the engine's eos ids), kept in the output
    eos_engine = engine_of(model, tok, eos_token_ids=[ref[k]])
    o = g(eos_engine, max_new_tokens=30)
    assert (o.token_ids, o.finish_reason) == (ref[:first + 1], "stop")

    # length
    o = g(free, max_new_tokens=4)
    assert (o.token_ids, o.finish_reason) == (ref[:4], "length")
    assert len(o.logprobs) == 4
    assert g(free, max_new_tokens=0) == GenOutput([], [], "length")


def test_default_eos_comes_from_the_model_and_tokenizer(bytes_mt, engine_of):
    model, tok = bytes_mt
    assert tok.eos_token_id in engine_of(model, tok).eos_token_ids
    p = tok.encode(TEXTS[4])
    ref = hf_greedy(model, p, 20, [])
    # make a token the model really emits its EOS: generation stops there, with "stop"
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [ref[6]]
    engine = engine_of(model, tok)
    assert engine.eos_token_ids == sorted({ref[6], tok.eos_token_id})
    out = run(engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20)))
    first = ref.index(ref[6])
    assert (out.token_ids, out.finish_reason) == (ref[:first + 1], "stop")


def test_same_seed_same_tokens_whatever_the_batch_in_deterministic_mode(mt, engine_of):
    model, tok = mt
    prompts = [tok.encode(t) for t in TEXTS]
    target = prompts[1]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, seed=1234)
    e1 = engine_of(model, tok, deterministic=True, eos_token_ids=[])
    alone = run(e1.generate(target, params))
    e2 = engine_of(model, tok, deterministic=True, eos_token_ids=[], max_batch=8)
    others = [SamplingParams(temperature=1.0, max_new_tokens=n, seed=i) for i, n in enumerate([5, 20, 3, 9])]
    outs = run(gen_all(e2, prompts[:1] + [target] + prompts[2:], others[:1] + [params] + others[1:]))
    assert outs[1].token_ids == alone.token_ids
    assert outs[1].logprobs == alone.logprobs  # bit for bit
    assert e2.stats["max_rows"] == 1
    # a different seed gives a different sample (the seed is really used)
    other = run(e1.generate(target, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, seed=99)))
    assert other.token_ids != alone.token_ids


def test_seeded_requests_repeat_in_batched_mode(bytes_mt, engine_of):
    model, tok = bytes_mt
    engine = engine_of(model, tok, eos_token_ids=[])
    prompts = [tok.encode(t) for t in TEXTS]
    params = [SamplingParams(max_new_tokens=12, seed=i) for i in range(len(prompts))]
    a = run(gen_all(engine, prompts, params))
    engine.flush_cache()
    b = run(gen_all(engine, prompts, params))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_score_equals_a_forward_pass(mt, engine_of):
    model, tok = mt
    engine = engine_of(model, tok)
    ids = tok.encode(TEXTS[1])
    for start in (1, 5, len(ids) - 1):
        got = run(engine.score(ids, start))
        ref = forward_logprobs(model, ids[:start], ids[start:])
        torch.testing.assert_close(torch.tensor(got), ref, atol=1e-5, rtol=0)
    assert run(engine.score(ids, len(ids))) == []
    for bad in (0, len(ids) + 1):
        with pytest.raises(ValueError, match="start"):
            run(engine.score(ids, bad))


def test_update_weights_changes_outputs_and_flushes_the_prefix_cache(bytes_mt, engine_of):
    model, tok = bytes_mt
    model = copy.deepcopy(model)  # we overwrite its weights
    engine = engine_of(model, tok, eos_token_ids=[])
    p = tok.encode(TEXTS[1])
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    before = run(engine.generate(p, greedy))
    assert run(engine.generate(p, greedy)).token_ids == before.token_ids
    assert engine.stats["prefix_hit_tokens"] > 0  # the repeated prompt reused cached KV
    # pushing the module's own tensors (the trainer shares the module) copies nothing
    engine.update_weights(model.named_parameters())
    assert run(engine.generate(p, greedy)).token_ids == before.token_ids

    other = perturbed(model)
    engine.update_weights((n, t.clone()) for n, t in other.named_parameters())
    hits = engine.stats["prefix_hit_tokens"]
    after = run(engine.generate(p, greedy))
    assert engine.stats["prefix_hit_tokens"] == hits  # stale KV was flushed, not reused
    assert after.token_ids != before.token_ids
    assert after.token_ids == hf_greedy(other, p, 12, [])
    with pytest.raises(KeyError, match="no parameter"):
        engine.update_weights([("not.a.weight", torch.zeros(1))])


def test_packed_weights_decode_like_the_plain_ones_and_take_weight_pushes(mt, engine_of):
    model, tok = mt
    prompts = [tok.encode(t) for t in TEXTS]
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    packed, plain = engine_of(model, tok, max_batch=8), engine_of(model, tok, max_batch=8, pack=False)
    assert packed._packed and not plain._packed
    a, b = run(gen_all(plain, prompts, greedy)), run(gen_all(packed, prompts, greedy))
    assert packed.stats["max_rows"] >= 2
    for x, y in zip(a, b):  # another summation order: the same tokens, log-probs equal to float32 rounding
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(torch.tensor(y.logprobs), torch.tensor(x.logprobs), atol=1e-4, rtol=0)
    # a weight push (the trainer's sync after an update) is packed again: the engine samples from the new weights
    mine = copy.deepcopy(model)
    eng = engine_of(mine, tok, max_batch=8)
    other = perturbed(model)
    eng.update_weights((n, t.clone()) for n, t in other.named_parameters())
    p = prompts[1]
    assert run(eng.generate(p, greedy)).token_ids == hf_greedy(other, p, 16, eng.eos_token_ids)


def test_smollm2_greedy_tokens_are_the_eager_models_on_demo_prompts(engine_of):
    # the demo's model on the demo's prompts, batched with rows of different lengths: the engine's own decoder,
    # packed weights and batch cache give transformers' greedy tokens. A perturbed weight must change them.
    from data import synth
    import rollout
    tok, model = load_tokenizer("smollm2-135m"), load_model("smollm2-135m").eval()
    prompts = [rollout.prompt_ids(tok, p.problem, p.task, "markdown")
               for p in synth.make_problems(6, seed=123, difficulty="rl")]
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    outs = run(gen_all(engine_of(model, tok, max_batch=8), prompts, greedy), timeout=300)
    refs = [hf_greedy(model, p, 24, []) for p in prompts]
    assert [o.token_ids for o in outs] == [r[:len(o.token_ids)] for o, r in zip(outs, refs)]
    assert sum(len(o.token_ids) for o in outs) > 60
    with torch.no_grad():  # the negative control: one weight moved, the same engine code
        model.model.layers[3].mlp.down_proj.weight.mul_(1.5)
    moved = run(gen_all(engine_of(model, tok, max_batch=8), prompts, greedy), timeout=300)
    assert [o.token_ids for o in moved] != [o.token_ids for o in outs]


def test_multi_turn_prompts_reuse_the_previous_turns_kv(mt, engine_of):
    model, tok = mt
    engine = engine_of(model, tok, eos_token_ids=[])
    p1 = tok.encode(TEXTS[3])
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    o1 = run(engine.generate(p1, greedy))
    p2 = p1 + o1.token_ids + tok.encode("\nresult: 42\n")
    o2 = run(engine.generate(p2, greedy))
    assert engine.stats["prefix_hit_tokens"] >= len(p1) + len(o1.token_ids) - 1
    assert o2.token_ids == hf_greedy(model, p2, 10, [])
    # the cache keeps one entry per conversation, its longest: the earlier turns' are contained in it
    assert [len(k) for k in engine._prefix] == [len(p2) + len(o2.token_ids) - 1]
    torch.testing.assert_close(torch.tensor(o2.logprobs), forward_logprobs(model, p2, o2.token_ids),
                               atol=2e-4, rtol=0)


def test_many_concurrent_requests_all_complete(bytes_mt, engine_of):
    model, tok = bytes_mt
    engine = engine_of(model, tok, max_batch=4)
    prompts = [tok.encode(TEXTS[i % len(TEXTS)] + str(i)) for i in range(40)]

    async def trajectory(i):
        # several turns per trajectory, interleaved with other coroutines' awaits (like sandbox calls)
        ids = prompts[i]
        for turn in range(2):
            o = await engine.generate(ids, SamplingParams(max_new_tokens=3 + i % 7, seed=i * 10 + turn))
            assert 1 <= len(o.token_ids) <= 3 + i % 7
            await asyncio.sleep(0)
            ids = ids + o.token_ids + tok.encode(" ok ")
        return await engine.score(ids, len(prompts[i]))

    async def go():
        # one request abandoned by its caller must not wedge the others
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.generate(prompts[0], SamplingParams(max_new_tokens=500)), 0.01)
        return await asyncio.gather(*[trajectory(i) for i in range(40)])

    scores = run(go())
    assert len(scores) == 40 and all(len(s) > 0 for s in scores)
    assert engine.stats["max_rows"] <= 4


def test_bad_input_and_shutdown(bytes_mt, engine_of):
    model, tok = bytes_mt
    engine = engine_of(model, tok)
    with pytest.raises(ValueError, match="empty"):
        run(engine.generate([], SamplingParams()))
    with pytest.raises(ValueError, match="vocabulary"):
        run(engine.generate([10 ** 6], SamplingParams()))
    for bad in (SamplingParams(temperature=-1), SamplingParams(top_p=0), SamplingParams(top_k=0),
                SamplingParams(stop="x"), SamplingParams(stop=[""])):
        with pytest.raises(ValueError):
            run(engine.generate([1, 2], bad))

    async def go():
        t = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=100000)))
        while engine.stats["decode_steps"] < 2:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(RuntimeError, match="shut down"):
            await t
        with pytest.raises(RuntimeError, match="shut down"):
            await engine.generate([1, 2, 3], SamplingParams())
    run(go())


@pytest.mark.slow
def test_smollm2_greedy_equals_hf_generate(engine_of):
    model, tok = load_model("smollm2-135m"), load_tokenizer("smollm2-135m")
    model.eval()
    engine = engine_of(model, tok)
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):")]
    outs = run(gen_all(engine, prompts, SamplingParams(temperature=0, max_new_tokens=8)))
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(model, p, 8, engine.eos_token_ids)


def test_lockstep_batches_follow_the_tokens_not_the_clock(bytes_mt, engine_of):
    """Eight trajectories of three turns, each turn followed by a wait standing in for a sandbox call, whose length
    follows the machine's load: two runs with other random waits. With lockstep every token and log-prob is the
    same to the last bit. The control, without lockstep: trajectories that come back after other numbers of
    decode steps (counted, so that the control does not depend on this machine's load) share other steps, and
    some log-prob moves."""
    model, tok = bytes_mt
    prompts = [tok.encode(f"Problem {i}: " + "x" * (3 * i)) for i in range(8)]

    async def trajectory(eng, i, wait):
        ids, out = prompts[i], []
        for turn in range(3):
            g = await eng.generate(ids, SamplingParams(temperature=1.0, max_new_tokens=6 + (5 * i + turn) % 7,
                                                       seed=100 * i + turn))
            out.append((g.token_ids, g.logprobs))
            ids = ids + g.token_ids
            await wait(eng, i, turn)
        return out

    async def run(lockstep: bool, wait):
        eng = engine_of(model, tok, max_batch=4, lockstep=lockstep)
        tasks = [asyncio.ensure_future(trajectory(eng, i, wait)) for i in range(8)]
        if lockstep:
            eng.track(tasks)
        return await asyncio.gather(*tasks)

    def seconds(seed):
        waits = random.Random(seed).choices([0.0, 0.003, 0.01, 0.03], k=24)
        return lambda eng, i, turn: asyncio.sleep(waits[3 * i + turn])

    def steps(shift):
        async def wait(eng, i, turn):
            end = eng.stats["decode_steps"] + (i + turn + shift) % 3
            while eng.stats["decode_steps"] < end and (eng._rows or eng._queue):
                await asyncio.sleep(0)
        return wait

    assert asyncio.run(run(True, seconds(1))) == asyncio.run(run(True, seconds(2)))
    assert asyncio.run(run(False, steps(0))) != asyncio.run(run(False, steps(1)))
