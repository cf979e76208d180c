"""Tests for grpo.py, machinery/packing.py and machinery/precision.py: advantages, the clipped loss,
aggregation, chunked and packed log-probs, shared-prompt packing, the update loop (accumulation, NaN guard,
loss scaling, learning), and 2-rank FSDP2 equivalence.

The models are tiny random Hugging Face configs built here (the one thing tests may fake).
"""
import dataclasses
import json
import math
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import config  # noqa: E402
import grpo  # noqa: E402
from grpo import NonFiniteLossError, TrainSeq  # noqa: E402
from machinery import checkpoint, packing, precision  # noqa: E402
from machinery import policy as policy_mod  # noqa: E402

V = 300


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_model(kind="qwen2", attn="sdpa", seed=0, tie=False):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=tie)
    cfg = {"qwen2": lambda: transformers.Qwen2Config(**common),
           "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **common),
           "llama": lambda: transformers.LlamaConfig(**common)}[kind]()
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).float()


def plain_logprobs(model, ids):
    """Reference: full logits, log_softmax, shift. ids (1, T) -> (T,) with 0 at t=0."""
    logits = model(input_ids=ids).logits.float()[0]  # (T, V)
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), lp])


def make_batch(lengths, seed=0, prompt=3, adv=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, V, (n,), generator=g).tolist()
        mask = [0] * prompt + (torch.rand(n - prompt, generator=g) < 0.8).long().tolist()
        mask[-1] = 1
        a = float(torch.randn((), generator=g)) if adv is None else adv[i]
        old = (-5.0 + 0.3 * torch.randn(n, generator=g)).tolist()
        out.append(TrainSeq(input_ids=ids, loss_mask=mask, advantage=a, old_logp=old))
    return out


def sections(**settings) -> tuple[config.Grpo, config.Update]:
    """config.Grpo and config.Update with their defaults but for `settings` (fields of either)."""
    how = {f.name for f in dataclasses.fields(config.Update)}
    return (config.Grpo(**{k: v for k, v in settings.items() if k not in how}),
            config.Update(**{k: v for k, v in settings.items() if k in how}))


def update(model, opt, sched, batch, *, mini_batch_size, scaler=None, autocast_dtype=None, **settings):
    """grpo.update with the defaults but for `settings` (sections), max_len 64, temperature 1."""
    return grpo.update(model, opt, sched, batch, *sections(**settings), mini_batch_size=mini_batch_size,
                       max_len=64, temperature=1.0, scaler=precision.LossScaler() if scaler is None else scaler,
                       autocast_dtype=autocast_dtype)


def old_logprobs(model, batch, **settings):
    """grpo.compute_old_logprobs with config.Update's defaults but for `settings`, temperature 1."""
    return grpo.compute_old_logprobs(model, batch, config.Update(**settings), temperature=1.0)


# ----------------------------------------------------------------------------- advantages

def test_warmup_multipliers_ours_and_verls():
    ours, verl = grpo.warmup_lambda(4), grpo.warmup_lambda(4, from_zero=True)
    assert [ours(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [verl(i) for i in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]  # veRL: the first step has lr 0


def test_dynamic_sampling_keeps_only_groups_with_mixed_outcomes():
    groups = ["a", "a", "b", "b", "c", "c", 7, 7]
    outcomes = [True, False, True, True, False, False, False, True]
    assert grpo.groups_with_signal(groups, outcomes) == {"a", 7}
    # exactly the groups whose advantages are not all zero
    adv, _ = grpo.compute_advantages([1.0 if o else -1.0 for o in outcomes], groups)
    assert {g for g, a in zip(groups, adv.tolist()) if a != 0} == {"a", 7}
    with pytest.raises(ValueError):
        grpo.groups_with_signal(groups, outcomes[:-1])


def test_equal_rewards_give_zero_advantage_and_zero_gradient():
    rewards = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.1, 0.1, 0.1, 0.1]
    adv, st = grpo.compute_advantages(rewards, group_size=4)
    assert adv[:4].eq(0).all() and adv[8:].eq(0).all()  # exactly, not approximately
    assert st["zero_adv_groups"] == 2 and st["n_groups"] == 3
    s = math.sqrt(1 / 3)  # unbiased std of [0, 1, 0, 1]
    assert torch.allclose(adv[4:8], torch.tensor([-0.5, 0.5, -0.5, 0.5]) / (s + 1e-6))
    adv_dr, _ = grpo.compute_advantages(rewards, group_size=4, norm_std=False)
    assert torch.allclose(adv_dr[4:8], torch.tensor([-0.5, 0.5, -0.5, 0.5]))
    # group ids in any order and type give the same answer; a lone sample gets 0
    ids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    perm = torch.randperm(12).tolist()
    adv_p, _ = grpo.compute_advantages([rewards[i] for i in perm], [ids[i] for i in perm])
    assert torch.allclose(adv_p, adv[perm])
    adv1, st1 = grpo.compute_advantages([3.0, 1.0, 2.0], ["x", "y", "y"])
    assert adv1[0] == 0 and st1["zero_adv_groups"] == 1
    with pytest.raises(ValueError, match="groups of 4"):
        grpo.compute_advantages(rewards[:6], group_size=4)

    logp = torch.randn(12, 5, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, logp.detach() + 0.1, adv[:, None], torch.ones(12, 5))
    loss.backward()
    assert logp.grad[:4].eq(0).all() and logp.grad[8:].eq(0).all()
    assert logp.grad[4:8].abs().gt(0).all()


# ----------------------------------------------------------------------------- loss

@pytest.mark.parametrize("agg", grpo.AGG_MODES)
def test_masked_tokens_get_exactly_zero_gradient(agg):
    torch.manual_seed(0)
    logp = torch.randn(3, 6, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]])
    old = logp.detach() + 0.3 * torch.randn(3, 6)
    old[mask == 0] = float("nan")  # garbage where the mask is 0 must not leak
    isw = torch.full((3, 6), float("nan"))
    isw[mask == 1] = 0.7
    ref = torch.where(mask == 1, logp.detach() - 0.2, float("inf"))
    loss, _ = grpo.policy_loss(logp, old, torch.randn(3, 1), mask, agg=agg, max_len=8, is_weight=isw,
                               ref_logp=ref, kl_coef=0.1)
    loss.backward()
    assert torch.isfinite(loss)
    assert logp.grad[mask == 0].eq(0).all()
    assert logp.grad[mask == 1].ne(0).all()


def _one_token_loss(ratio, adv, **kw):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, st = grpo.policy_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), st


@pytest.mark.parametrize("ratio,adv,want_loss,clipped", [
    (0.5, 2.0, -1.0, False),     # A > 0: below 1 - 0.2 is not clipped (moving up is wanted)
    (1.1, 2.0, -2.2, False),
    (1.5, 2.0, -2.56, True),     # A > 0: capped at 1 + clip_high = 1.28
    (0.5, -2.0, 1.6, True),      # A < 0: floored at 1 - clip_low = 0.8
    (1.1, -2.0, 2.2, False),
    (5.0, -2.0, 10.0, False),    # A < 0 above 1 + clip_high is not clipped (moving down is wanted)
])
def test_clipping_bounds_the_ratio(ratio, adv, want_loss, clipped):
    loss, grad, st = _one_token_loss(ratio, adv, dual_clip_c=None)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    # d loss / d logp = -A * ratio unclipped, 0 when clipped
    assert grad == pytest.approx(0.0 if clipped else -adv * ratio, rel=1e-5, abs=1e-12)
    assert st["clipfrac"].item() == float(clipped)


def test_dual_clip_caps_negative_advantage_losses_only():
    loss, grad, st = _one_token_loss(50.0, -2.0)  # c = 10: loss -A * c
    assert loss == pytest.approx(20.0) and grad == 0.0 and st["clipfrac_lower"].item() == 1.0
    loss, grad, _ = _one_token_loss(50.0, -2.0, dual_clip_c=None)
    assert loss == pytest.approx(100.0, rel=1e-5) and grad == pytest.approx(100.0, rel=1e-5)
    loss, grad, st = _one_token_loss(5.0, -2.0)  # under c: untouched
    assert loss == pytest.approx(10.0, rel=1e-5) and st["clipfrac_lower"].item() == 0.0
    loss, grad, st = _one_token_loss(50.0, 2.0)  # positive advantage: only clip_high applies
    assert loss == pytest.approx(-2.56, rel=1e-5) and grad == 0.0 and st["clipfrac_lower"].item() == 0.0
    with pytest.raises(ValueError, match="dual_clip_c"):
        _one_token_loss(1.0, -1.0, dual_clip_c=1.0)


def test_aggregation_modes_match_hand_computation():
    # ratio 1 everywhere, so the per-token loss is -A.
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])  # row sums of -A: -3 over 2 tokens, -8 over 4
    logp = torch.zeros(2, 4)
    want = {"token-mean": -11 / 6, "seq-mean-token-sum": -5.5, "seq-mean-token-mean": (-1.5 - 2.0) / 2,
            "seq-mean-token-sum-norm": (-3 - 8) / 2 / 10, "verl-token-mean": -11 / 6}  # verl: one micro-batch
    for agg, w in want.items():
        loss, _ = grpo.policy_loss(logp, logp, adv, mask, agg=agg, max_len=10)
        assert loss.item() == pytest.approx(w), agg
        # the same two sequences packed into one row, told apart by seq_ids
        packed = lambda x: x.reshape(1, -1)  # noqa: E731
        seq = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
        loss_p, _ = grpo.policy_loss(packed(logp), packed(logp), packed(adv), packed(mask), agg=agg,
                                     max_len=10, seq_ids=seq)
        assert loss_p.item() == pytest.approx(w), agg
    # a given normaliser replaces the local count (tokens for token-mean, sequences otherwise)
    assert grpo.policy_loss(logp, logp, adv, mask, normaliser=11)[0].item() == pytest.approx(-1.0)
    assert grpo.policy_loss(logp, logp, adv, mask, agg="seq-mean-token-sum", normaliser=4)[0].item() == \
        pytest.approx(-11 / 4)
    # veRL's token-mean when each sequence is its own micro-batch: each micro's token-mean times its share (1/2)
    # of the mini-batch's sequences, summed by gradient accumulation; our token-mean weights tokens equally
    verl = sum(grpo.policy_loss(logp[i:i + 1], logp[i:i + 1], adv[i:i + 1], mask[i:i + 1], agg="verl-token-mean",
                                normaliser=2)[0].item() for i in range(2))
    ours = sum(grpo.policy_loss(logp[i:i + 1], logp[i:i + 1], adv[i:i + 1], mask[i:i + 1], normaliser=6)[0].item()
               for i in range(2))
    assert verl == pytest.approx(-3 / 2 / 2 - 8 / 4 / 2) and ours == pytest.approx(-11 / 6)
    with pytest.raises(ValueError, match="max_len"):
        grpo.policy_loss(logp, logp, adv, mask, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="agg"):
        grpo.policy_loss(logp, logp, adv, mask, agg="sum")


def test_kl_terms_and_importance_weight():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.full((1, 2), math.log(2.0))
    mask = torch.ones(1, 2)
    zero_adv = torch.zeros(1, 2)
    assert grpo.policy_loss(logp, logp.detach(), zero_adv, mask, ref_logp=ref)[0].item() == 0.0  # KL off
    k1, st = grpo.policy_loss(logp, logp.detach(), zero_adv, mask, ref_logp=ref, kl_coef=0.5, kl_type="kl")
    assert k1.item() == pytest.approx(0.5 * -math.log(2.0)) and st["kl"].item() == pytest.approx(-math.log(2))
    k3, _ = grpo.policy_loss(logp, logp.detach(), zero_adv, mask, ref_logp=ref, kl_coef=0.5)
    assert k3.item() == pytest.approx(0.5 * (2.0 - math.log(2.0) - 1.0))  # exp(d) - d - 1, d = ref - logp
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.policy_loss(logp, logp.detach(), zero_adv, mask, kl_coef=0.1)

    adv = torch.tensor([[1.0, 3.0]])
    isw = torch.tensor([[1.0, 0.5]], requires_grad=True)
    loss, _ = grpo.policy_loss(logp, logp.detach(), adv, mask, is_weight=isw)
    loss.backward()
    assert loss.item() == pytest.approx(-(1.0 + 1.5) / 2)
    assert isw.grad is None  # detached
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.75])


# ----------------------------------------------------------------------------- log-probs

@pytest.mark.parametrize("tie", [False, True])
def test_chunked_logprobs_equal_plain_values_and_gradients(tie):
    model = tiny_model("qwen3", tie=tie)
    ids = torch.randint(0, V, (1, 37), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(37)[None]
    w = torch.randn(37)
    ref = plain_logprobs(model, ids)
    (ref * w).sum().backward()
    g_ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    def saved_activations(fn):
        """Shapes of the tensors autograd keeps for backward while fn runs, weights excluded."""
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        shapes = []
        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                shapes.append(tuple(t.shape))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
        return out, [s for s in shapes if s and s[-1] == V]  # logits-like: (..., vocab)
    lp, logit_like = saved_activations(lambda: packing.token_logprobs(model, ids, pos, chunk_size=5)[0])
    assert torch.allclose(lp, ref, atol=1e-5) and lp[0] == 0
    (lp * w).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, g_ref[n], atol=1e-5, rtol=1e-4), n
    # no (tokens x vocab) logits are kept for backward: the chunks are recomputed
    assert all(math.prod(s) <= 5 * V for s in logit_like), logit_like
    _, plain_kept = saved_activations(lambda: plain_logprobs(model, ids))
    assert max(math.prod(s) for s in plain_kept) >= 36 * V  # the control does keep them
    # with a mask, only those positions are computed
    mask = torch.zeros(1, 37, dtype=torch.bool)
    mask[0, [3, 10, 36]] = True
    with torch.no_grad():
        lp_m = packing.token_logprobs(model, ids, pos, mask=mask, chunk_size=2)[0]
    assert torch.allclose(lp_m[mask[0]], ref[mask[0]].detach(), atol=1e-5) and lp_m[~mask[0]].eq(0).all()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_equals_each_sequence_alone(kind, attn):
    model = tiny_model(kind, attn).eval()
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, V, (n,), generator=g) for n in (5, 9, 7)]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    with torch.no_grad():
        packed = packing.token_logprobs(model, ids, pos)[0]
        alone = torch.cat([packing.token_logprobs(model, s[None], torch.arange(len(s))[None])[0] for s in seqs])
        # control: without restarting positions the sequences attend to each other
        leaky = packing.token_logprobs(model, ids, torch.arange(ids.shape[1])[None])[0]
    assert torch.allclose(packed, alone, atol=1e-5)
    assert not torch.allclose(leaky[5:], alone[5:], atol=1e-3)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_packed_attention_runs_each_sequence_alone_and_leaves_other_calls_unchanged(kind):
    """packing.packed_attention: a packed row's log-probs and gradients equal those of sdpa under the block-diagonal
    mask and of each sequence alone; padded rows, prefill and cached decode give bit-identical outputs."""
    base, fast = tiny_model(kind, seed=6), tiny_model(kind, seed=6)
    assert packing.packed_attention(fast) and fast.config._attn_implementation == packing.PACKED_SDPA
    assert not packing.packed_attention(tiny_model(kind, "eager"))  # other implementations are left alone
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, V, (n,), generator=g) for n in (6, 11, 4, 9)]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    out = {}
    for name, m in (("base", base), ("fast", fast)):
        lp = packing.token_logprobs(m, ids, pos)[0]
        (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
        out[name] = lp.detach(), torch.cat([p.grad.flatten() for p in m.parameters()])
    with torch.no_grad():
        alone = torch.cat([packing.token_logprobs(base, s[None], torch.arange(len(s))[None])[0] for s in seqs])
    assert torch.allclose(out["fast"][0], alone, atol=1e-5) and torch.allclose(out["fast"][0], out["base"][0], atol=1e-5)
    assert torch.allclose(out["fast"][1], out["base"][1], atol=1e-5, rtol=1e-4)
    # control: the same row without restarting positions is one long sequence, and the answers differ
    with torch.no_grad():
        leaky = packing.token_logprobs(fast, ids, torch.arange(ids.shape[1])[None])[0]
    assert not torch.allclose(leaky[6:], alone[6:], atol=1e-3)
    # everything that is not a packed row goes through transformers' sdpa unchanged, bit for bit
    L = max(len(s) for s in seqs)  # right-padded rows, as the engine batches prompts
    rows = torch.stack([torch.nn.functional.pad(s, (0, L - len(s))) for s in seqs])
    attn = torch.stack([torch.arange(L) < len(s) for s in seqs]).long()
    with torch.no_grad():
        padded = [m(input_ids=rows, attention_mask=attn).logits for m in (base, fast)]
        steps = []
        for m in (base, fast):
            c = transformers.DynamicCache()
            a = m(input_ids=seqs[1][None], use_cache=True, cache=c).logits
            b = m(input_ids=seqs[2][:1][None], position_ids=torch.tensor([[11]]), use_cache=True,
                  cache=c).logits
            steps.append((a, b))
    assert torch.equal(*padded)
    assert torch.equal(steps[0][0], steps[1][0]) and torch.equal(steps[0][1], steps[1][1])


def test_compute_old_logprobs_splits_packed_rows_back():
    model = tiny_model()
    batch = make_batch([12, 30, 7, 19, 25])
    with torch.no_grad():
        want = [plain_logprobs(model, torch.tensor([t.input_ids])) * torch.tensor(t.loss_mask) for t in batch]
    got = old_logprobs(model, batch, max_tokens_per_micro=40)
    assert model.training  # mode restored
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5)


def group_batch(prompts=(7, 11, 5), samples=4, seed=0):
    """GRPO-shaped: per prompt, `samples` trajectories that share it (loss mask 0) and go on differently."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in prompts:
        prompt = torch.randint(0, V, (p,), generator=g).tolist()
        for _ in range(samples):
            n = int(torch.randint(3, 15, (), generator=g))
            resp = torch.randint(0, V, (n,), generator=g).tolist()
            mask = [0] * p + [1] * n
            if n > 4:
                mask[p + 2] = 0  # a tool output inside the response: no loss, not shared
            out.append(TrainSeq(input_ids=prompt + resp, loss_mask=mask, advantage=float(torch.randn((), generator=g)),
                                old_logp=(-5.0 + 0.3 * torch.randn(p + n, generator=g)).tolist()))
    return out


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_shared_prompt_packing_gives_the_same_logprobs_and_update_for_fewer_tokens(kind):
    """A group's samples packed behind one copy of their prompt: the same old log-probs and the same weights
    after an update as each sample packed whole, with the prompt copies counted as shared; a row that skips
    the prompt without the branch-aware attention gives other log-probs (the control)."""
    batch = group_batch()
    assert packing.shared_prompts(batch) == [0, 7, 7, 7, 0, 11, 11, 11, 0, 5, 5, 5]
    res = {}
    for share in (False, True):
        model = tiny_model(kind, seed=4)
        packing.packed_attention(model)
        old = old_logprobs(model, batch, max_tokens_per_micro=64, share_prompts=share)
        opt, sched = torch.optim.SGD(model.parameters(), lr=0.5), None
        st = update(model, opt, sched, batch, mini_batch_size=8, max_tokens_per_micro=64, share_prompts=share)
        res[share] = old, _params(model), st
    for a, b, t in zip(res[False][0], res[True][0], batch):
        assert b.shape == (len(t.input_ids),) and torch.allclose(a, b, atol=1e-5)
    assert all(torch.allclose(p, res[False][1][n], atol=1e-5) for n, p in res[True][1].items())
    assert res[True][2]["shared_tokens"] == 3 * (7 + 11 + 5) and res[False][2]["shared_tokens"] == 0
    assert res[True][2]["tokens"] == res[False][2]["tokens"] == sum(len(t.input_ids) for t in batch)
    assert res[True][2]["pad_frac"] == 0.0
    # control: the same shared row under transformers' own sdpa (a block per segment) loses the prompt
    model = tiny_model(kind, seed=4).eval()
    mb = packing.collate(batch[:4], share=True)
    assert mb.input_ids.shape[1] == sum(len(t.input_ids) for t in batch[:4]) - 3 * 7
    with torch.no_grad():
        lp = packing.token_logprobs(model, mb.input_ids, mb.position_ids, mask=mb.loss_mask)
    blind = torch.cat(mb.per_sequence(lp))
    assert not torch.allclose(blind, torch.cat(res[False][0][:4]), atol=1e-3)


def test_shared_prompt_runs_stay_whole_in_micro_batches_or_repeat_the_prompt():
    """Packing plans runs at their shared cost; a run too long for one micro-batch is cut, each piece with its own
    prompt; the old log-probs still equal the unshared ones."""
    batch = group_batch(prompts=(20, 20), samples=4, seed=3)
    shared = packing.shared_prompts(batch)
    bins = packing._plan([len(t.input_ids) for t in batch], 60, torch.device("cpu"), shared)
    assert sorted(i for b in bins for i in b) == list(range(8))
    for b in bins:  # each bin fits when laid out, with each piece's first trajectory whole
        mb = packing.collate([batch[i] for i in b], share=True)
        assert mb.input_ids.shape[1] <= 60
    model = tiny_model(seed=2)
    packing.packed_attention(model)
    a = old_logprobs(model, batch, max_tokens_per_micro=60)
    b = old_logprobs(model, batch, max_tokens_per_micro=60, share_prompts=False)
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))


def test_autocast_update_keeps_float32_weights_and_steps_smaller_than_bfloat16_can_hold():
    """--update-dtype bfloat16 on one process: matmuls in bf16 under torch.autocast, the weights and the Adam
    state in fp32. A step of lr 1e-5 is far below bf16's resolution at these weights (~1e-3): the fp32 weights
    take it. The negative control, the same update on weights stored in bf16, loses nearly all of it."""
    batch = make_batch([20, 15, 30, 12], seed=3)
    kw = dict(mini_batch_size=4, max_tokens_per_micro=64, autocast_dtype=torch.bfloat16)

    def moved(model):
        before = _params(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
        st = update(model, opt, None, batch, **kw)
        assert math.isfinite(st["loss"])
        diffs = [(p.detach().float() - before[n].float()).abs() for n, p in model.named_parameters()]
        return torch.cat([d.flatten() for d in diffs]), model
    d32, m32 = moved(tiny_model(seed=4))
    assert all(p.dtype == torch.float32 for p in m32.parameters())
    assert (d32 > 0).float().mean() > 0.8 and d32.max() < 2e-5  # all but unseen tokens' embeddings took a ~lr step
    d16, _ = moved(tiny_model(seed=4).to(torch.bfloat16))
    assert (d16 > 0).float().mean() < 0.2  # bf16 weights round the same step away, but for weights near 0
    # and the update is the fp32 one up to bf16's rounding of the forward pass
    ref = tiny_model(seed=4)
    update(ref, torch.optim.AdamW(ref.parameters(), lr=1e-5, weight_decay=0.0), None, batch,
           **{**kw, "autocast_dtype": None})
    for (n, p), q in zip(m32.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2.5e-5), n


def test_pack_first_fit_decreasing():
    lengths = [5, 9, 7, 3, 8, 2]
    bins = packing.pack(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # 34 tokens need at least 4 bins of 10
    assert bins == [[1], [4, 5], [2, 3], [0]]
    more = packing._split_to(bins, 7, lengths)
    assert len(more) == 7 and sorted(i for b in more for i in b) == list(range(6))
    assert all(sum(lengths[i] for i in b) <= 10 for b in more) and more.count([]) == 1
    with pytest.raises(ValueError, match="trajectory 1 has 9 tokens"):
        packing.pack(lengths, 8)


def test_check_batch_names_the_bad_trajectory():
    batch = make_batch([6, 8])
    batch[1].loss_mask = batch[1].loss_mask[:-1]
    with pytest.raises(ValueError, match="trajectory 1: loss_mask has 7 entries"):
        grpo.check_batch(batch)
    batch = make_batch([6, 8])
    batch[0].old_logp = None
    with pytest.raises(ValueError, match="trajectory 0: old_logp is missing"):
        grpo.check_batch(batch)
    batch = make_batch([6, 8])
    batch[1].loss_mask[0] = 1
    with pytest.raises(ValueError, match="trajectory 1: loss_mask\\[0\\]"):
        grpo.check_batch(batch)


# ----------------------------------------------------------------------------- update

def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("agg", [a for a in grpo.AGG_MODES if a != "verl-token-mean"])  # veRL's depends on the cut
def test_global_normaliser_makes_micro_batches_equal_one_batch(agg):
    lengths = [40, 12, 33, 9, 27, 18, 50, 6]
    batch = make_batch(lengths)
    kw = dict(mini_batch_size=8, grad_clip=0.0, agg=agg)  # max_len 64
    results = []
    for max_tokens, ckpt in [(1000, False), (60, False), (60, True)]:  # 1 micro-batch vs several
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        st = update(model, opt, None, batch, max_tokens_per_micro=max_tokens, gradient_checkpointing=ckpt, **kw)
        results.append((st, _params(model), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert results[0][0]["n_micro_batches"] == 1 and results[1][0]["n_micro_batches"] >= 4
    for st, params, grads in results[1:]:
        assert st["loss"] == pytest.approx(results[0][0]["loss"], rel=1e-5)
        for n in grads:
            assert torch.allclose(grads[n], results[0][2][n], atol=1e-7, rtol=1e-4), n
            assert torch.allclose(params[n], results[0][1][n], atol=1e-6), n

    # two half-batches, each normalised by the global count, sum to the full batch's gradient;
    # normalising each half by its own count does not (this is what the normaliser fixes)
    def grads_of(parts, global_norm):
        model = tiny_model()
        for part in parts:
            mb = packing.collate(part)
            lp = packing.token_logprobs(model, mb.input_ids, mb.position_ids, mask=mb.loss_mask)
            norm = grpo.loss_normaliser(batch, agg) if global_norm else None
            loss, _ = grpo.policy_loss(lp, mb.old_logp, mb.adv, mb.loss_mask, agg=agg, max_len=64,
                                       seq_ids=mb.seq_ids, normaliser=norm)
            loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])
    full = grads_of([batch], True)
    halves = grads_of([batch[:4], batch[4:]], True)
    assert torch.allclose(full, halves, atol=1e-7, rtol=1e-4)
    assert not torch.allclose(full, grads_of([batch[:4], batch[4:]], False), atol=1e-6, rtol=1e-3)


def test_loss_scale_is_undone_before_the_clip_and_step():
    batch = make_batch([30, 20, 25])
    out = []
    for scale in (1.0, 1024.0):
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        st = update(model, opt, None, batch, mini_batch_size=3, max_tokens_per_micro=1000, grad_clip=1.0,
                    scaler=precision.LossScaler(scale=scale))
        out.append((st, _params(model)))
    assert out[1][0]["loss"] == pytest.approx(out[0][0]["loss"], rel=1e-6)
    moved = False
    for n, p in out[0][1].items():
        assert torch.allclose(out[1][1][n], p, atol=1e-6), n
        moved |= not torch.equal(p, tiny_model().state_dict()[n])
    assert moved


def test_nonfinite_loss_raises_before_weights_change():
    for field in ("old_logp", "is_weight"):
        model = tiny_model()
        opt, sched = grpo.make_optimizer(model, lr=1e-3, warmup_steps=2)
        before = _params(model)
        batch = make_batch([20, 15, 30, 12])
        t = batch[2]
        bad_t = t.loss_mask.index(1, 5)
        vals = list(t.old_logp) if field == "old_logp" else [1.0] * len(t.input_ids)
        vals[bad_t] = float("nan") if field == "old_logp" else float("inf")
        setattr(t, field, vals)
        with pytest.raises(NonFiniteLossError, match="trajectories \\[2\\]"):
            update(model, opt, sched, batch, mini_batch_size=4, max_tokens_per_micro=32)
        after = _params(model)
        assert all(torch.equal(before[n], after[n]) for n in before)
        assert not opt.state and sched.last_epoch == 0
        assert all(p.grad is None for p in model.parameters())


def test_loss_scaler_from_the_config_scales_only_a_float16_backward_by_default():
    s = precision.loss_scaler(config.Update(update_dtype="float16"))
    assert (s.scale, s.growth_interval) == (1024.0, 200) and s.can_skip()  # dynamic
    for dtype in ("float32", "bfloat16"):
        s = precision.loss_scaler(config.Update(update_dtype=dtype))
        assert (s.scale, s.growth_interval) == (1.0, 0) and not s.can_skip()
    s = precision.loss_scaler(config.Update(update_dtype="bfloat16", loss_scale=8.0))
    assert (s.scale, s.growth_interval) == (8.0, 0)  # --loss-scale by hand: static outside float16
    s = precision.loss_scaler(config.Update(update_dtype="float16", loss_scale=64.0, loss_scale_growth=0))
    assert (s.scale, s.growth_interval) == (64.0, 0) and not s.can_skip()


def test_dynamic_loss_scale_skips_an_overflowed_step_and_halves():
    batch = make_batch([20, 15, 30, 12])

    def run(scaler, poison: bool):
        model = tiny_model()
        opt, sched = grpo.make_optimizer(model, lr=1e-3, warmup_steps=2)
        before = _params(model)
        if poison:  # an fp16 overflow: finite losses, an infinite gradient
            next(model.parameters()).register_hook(lambda g: g * float("inf"))
        return model, before, update(model, opt, sched, batch, mini_batch_size=4, max_tokens_per_micro=64,
                                     scaler=scaler), opt, sched

    scaler = precision.LossScaler(scale=1024.0, growth_interval=3)
    model, before, st, opt, sched = run(scaler, poison=True)
    assert st["skipped_steps"] == 1 and st["loss_scale"] == 512.0 and scaler.skipped_steps == 1
    assert all(torch.equal(before[n], p) for n, p in _params(model).items())  # the step was not taken
    assert not opt.state and sched.last_epoch == 0
    # static, or dynamic already at its floor: the same gradient stops the update
    for scaler in (precision.LossScaler(scale=1024.0), precision.LossScaler(scale=1.0, growth_interval=3)):
        with pytest.raises(NonFiniteLossError, match="non-finite gradient in mini-batch 0.*grad_norm=(inf|nan)"):
            run(scaler, poison=True)
    # healthy steps grow the scale after growth_interval of them, and the update equals an unscaled one
    scaler = precision.LossScaler(scale=8.0, growth_interval=2)
    model, _, st, _, _ = run(scaler, poison=False)
    ref, _, _, _, _ = run(precision.LossScaler(), poison=False)
    model2, _, _, _, _ = run(precision.LossScaler(scale=8.0, growth_interval=2), poison=False)
    assert st["skipped_steps"] == 0 and scaler.good_steps == 1 and scaler.scale == 8.0
    assert all(torch.allclose(p, _params(ref)[n], atol=1e-6) for n, p in _params(model).items())
    batch2 = make_batch([20, 15, 30, 12, 9, 14, 22, 18])
    model = tiny_model()
    opt, sched = grpo.make_optimizer(model, lr=1e-3, warmup_steps=2)
    update(model, opt, sched, batch2, mini_batch_size=4, max_tokens_per_micro=64, scaler=scaler)
    assert scaler.scale == 16.0 and scaler.good_steps == 1  # 3 good steps in all: one doubling


def test_training_on_a_learnable_reward_raises_it():
    """Reward = fraction of response tokens with id < 30 (10% under a uniform policy)."""
    model = tiny_model(seed=3)
    opt, sched = grpo.make_optimizer(model, lr=1e-2, warmup_steps=1, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    n, resp_len = 8, 6

    def good_mass():
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(prompts)).logits[:, -1]
        return torch.softmax(logits, -1)[:, :30].sum(-1).mean().item()

    def sample():
        with torch.no_grad():
            ids = torch.tensor(prompts).repeat_interleave(n, 0)  # (P * n, 3)
            for _ in range(resp_len):
                probs = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1)
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
        return ids

    start = good_mass()
    rewards_seen = []
    for step in range(8):
        ids = sample()
        rewards = (ids[:, 3:] < 30).float().mean(1)
        rewards_seen.append(rewards.mean().item())
        adv, _ = grpo.compute_advantages(rewards, group_size=n)
        batch = [TrainSeq(input_ids=row.tolist(), loss_mask=[0] * 3 + [1] * resp_len, advantage=a)
                 for row, a in zip(ids, adv.tolist())]
        for t, lp in zip(batch, old_logprobs(model, batch, max_tokens_per_micro=64)):
            t.old_logp = lp
        st = update(model, opt, sched, batch, mini_batch_size=16, max_tokens_per_micro=64)
        assert st["n_mini_batches"] == 2 and math.isfinite(st["loss"])
    end = good_mass()
    assert start < 0.15 and end > 2 * start, (start, end, rewards_seen)


# ----------------------------------------------------------------------------- distributed

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, out_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = tiny_model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = make_batch(DIST_LENGTHS)
    # rank r holds half of each mini-batch of 8 (of 7 for the last); rank 0 gets the long ones, so
    # rank 1 must split its micro-batches and, in the last mini-batch, run an empty dummy one
    mine = [t for k in (0, 8) for t in (batch[k:k + 4] if rank == 0 else batch[k + 4:k + 8])]
    st = update(model, opt, None, mine, mini_batch_size=4, max_tokens_per_micro=60, grad_clip=1.0)
    params = {n: p.full_tensor().tolist() for n, p in model.named_parameters()}
    if rank == 0:
        Path(out_dir, "params.json").write_text(json.dumps({"params": params, "grad_norm": st["grad_norm"]}))
    dist.barrier()  # as train.py: no rank tears gloo down while the other is still in its last collective
    dist.destroy_process_group()


DIST_LENGTHS = [50, 44, 38, 47, 6, 9, 12, 8, 41, 55, 30, 36, 10, 7, 5]


def test_two_fsdp2_ranks_equal_one_process(tmp_path):
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    st = update(model, opt, None, make_batch(DIST_LENGTHS), mini_batch_size=8, max_tokens_per_micro=60,
                grad_clip=1.0)
    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    got = json.loads((tmp_path / "params.json").read_text())
    assert got["grad_norm"] == pytest.approx(st["grad_norm"], rel=1e-4)
    for n, p in model.named_parameters():
        assert torch.allclose(torch.tensor(got["params"][n]), p.detach(), atol=1e-6), n


def test_first_mini_batch_old_logp_from_the_update_pass_is_exact():
    """Old log-probs left out of the first mini-batch come from the update's own forward pass: the same
    weights as with compute_old_logprobs; outside the first mini-batch they are refused."""
    def run(fill: str):
        model = tiny_model(seed=5)
        opt, sched = torch.optim.SGD(model.parameters(), lr=0.1), None  # Adam's first step is ~sign(g): too touchy
        batch = make_batch([20, 15, 30, 12, 9, 14], seed=2)
        for t in batch:
            t.old_logp = None
        todo = batch if fill == "all" else batch[3:]
        for t, lp in zip(todo, old_logprobs(model, todo, max_tokens_per_micro=64)):
            t.old_logp = lp
        st = update(model, opt, sched, batch, mini_batch_size=3, max_tokens_per_micro=64)
        return _params(model), st
    ref, st_ref = run("all")
    fused, st = run("later")
    assert st["n_mini_batches"] == 2 and st["ppo_kl"] == pytest.approx(st_ref["ppo_kl"], abs=1e-6)
    assert all(torch.allclose(p, ref[n], atol=1e-6) for n, p in fused.items())
    model = tiny_model()
    opt, sched = grpo.make_optimizer(model, lr=1e-3)
    batch = make_batch([10, 10, 10])
    batch[2].old_logp = None
    with pytest.raises(ValueError, match="trajectory 2: old_logp is missing outside the first mini-batch"):
        update(model, opt, sched, batch, mini_batch_size=2, max_tokens_per_micro=64)


def test_freeze_below_trains_only_the_top_layers():
    model = tiny_model(seed=1)
    policy_mod.freeze_below(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trainable)
    before = _params(model)
    opt, sched = grpo.make_optimizer(model, lr=1e-2, warmup_steps=1)
    update(model, opt, sched, make_batch([12, 16, 9, 20]), mini_batch_size=4, max_tokens_per_micro=64)
    after = _params(model)
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert changed and changed <= trainable and "model.layers.1.mlp.up_proj.weight" in changed
    policy_mod.freeze_below(model, 0)
    assert all(p.requires_grad for p in model.parameters())


def test_lora_starts_at_the_model_trains_only_adapters_and_merges_exactly():
    """--lora-rank: adapters on the top layer start at zero (same logits), a real grpo.update moves only them (no
    weight gradient on the frozen weights), and merge_lora turns the result into the plain model's state dict,
    whose logits equal the LoRA model's."""
    model = tiny_model("qwen3", seed=1)
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(0))
    before = model(input_ids=ids).logits.detach()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    policy_mod.add_lora(model, rank=4, alpha=8.0, train_layers=1)
    assert torch.equal(model(input_ids=ids).logits.detach(), before)  # B = 0 at the start
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n and ".layers.1." in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == set(policy_mod.LORA_TARGETS)
    opt, _ = grpo.make_optimizer(model, lr=1e-2, warmup_steps=0)
    update(model, opt, None, make_batch([10, 12, 9, 11], adv=[1.0, -1.0, 0.5, -0.5]), mini_batch_size=4,
           max_tokens_per_micro=1000)
    state = model.state_dict()
    for k, v in state.items():  # the warm start's weights, bit for bit
        if ".lora_" not in k:
            assert torch.equal(v, frozen[k.replace(".base_layer.", ".")]), k
    assert any(state[k].abs().sum() > 0 for k in state if ".lora_B." in k)  # the adapters moved
    after = model(input_ids=ids).logits.detach()
    assert not torch.allclose(after, before)
    merged = checkpoint.merge_lora(state, scale=8.0 / 4)
    assert set(merged) == set(frozen)
    plain = tiny_model("qwen3", seed=2)
    plain.load_state_dict(merged)
    torch.testing.assert_close(plain(input_ids=ids).logits.detach(), after, atol=1e-5, rtol=1e-5)
