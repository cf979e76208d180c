"""End-to-end learning checks: GRPO really learns, and SAAR's purified tokens are what it learns from.

1. `test_grpo_learns_and_sign_flip_unlearns`: a tiny random model (the offline tiny-bytes model) samples
   through the real `hf_engine.HFEngine` (seeded, temperature 1) and is trained with the real
   `grpo.compute_advantages` / `grpo.compute_old_logprobs` / `grpo.update` on a reward it can learn from
   scratch: +1 if the 8 sampled tokens contain one of the bytes "0123", else -1 (about 10% of samples at
   init). The reward rises far beyond sampling noise. Negative control in the same test: the identical run
   from the same weights with the advantages' sign flipped makes the reward fall instead, so the rise comes
   from the sign of the GRPO signal, not from any drift of training. Rewards are measured on a fresh,
   fixed-seed evaluation batch (the same seeds before and after, in both runs), on the training batches,
   and, without sampling noise, as the policy's probability mass on the target bytes.
   It also checks that every sampled log-prob equals the trainer's recomputed one, i.e. the engine always
   samples from the weights being trained (the prefix KV cache is flushed after each update).

2. `test_tool_tokens_get_no_gradient_and_saar_splice_does`: real rollouts (real sandbox, real Qwen
   tokenizer, scripted model) with SAAR on, one trajectory with a shallow and one with a deep rollback,
   graded by reward.py and batched exactly as train.py batches them. With grpo's own loss pieces, the
   gradient of the GRPO loss w.r.t. every token's log-prob is exactly 0 on the prompt, the tool output
   and the scaffolding, and non-zero on every token SAAR spliced in; the failed call and its error are
   gone from the token sequence; and one real `grpo.update` step on the batch changes the weights.
"""
import asyncio
import copy
import json

import pytest
import torch

import config
import grpo
import reward
import rollout
import saar
from data.models import load_model, load_tokenizer
from machinery.engine import SamplingParams
from machinery.hf_engine import HFEngine
from fakes import ScriptedEngine
from machinery import packing, precision
from sandbox import Sandbox


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- 1. learning

PROBLEMS = ["What is 6*7?", "Name a colour.", "Say hello.", "Count to three."]
TARGET = frozenset(b"0123")   # token id == byte value in tiny-bytes
RESP_LEN = 8                  # tokens sampled per continuation
GROUP = 8                     # samples per prompt (a GRPO group)
STEPS = 10
LR = 1e-2
EVAL_PER_PROMPT = 64          # 4 x 64 = 256 evaluation samples, the same seeds every time
CFG = config.Grpo()           # the update's settings: the defaults (token-mean)
HOW = config.Update()         # and how it runs: the defaults (4096-token micro-batches)


def _reward(token_ids) -> float:
    return 1.0 if TARGET & set(token_ids) else -1.0


async def _sample(eng, prompts, n, seed0):
    reqs = [(p, seed0 + 1000 * i + j) for i, p in enumerate(prompts) for j in range(n)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=RESP_LEN, seed=s) for _, s in reqs]
    outs = await asyncio.wait_for(asyncio.gather(*[eng.generate(p, q) for (p, _), q in zip(reqs, params)]), 120)
    return [p for p, _ in reqs], outs


def _target_mass(model, prompts) -> float:
    """Noise-free view: the policy's mean probability of a target byte as the first response token."""
    with torch.no_grad():
        m = [torch.softmax(model(input_ids=torch.tensor([p])).logits[0, -1].float(), -1)[sorted(TARGET)].sum()
             for p in prompts]
    return torch.stack(m).mean().item()


def _train(base, tok, prompts, *, sign: float, seed: int = 0):
    """Train a copy of `base` with GRPO for STEPS steps, advantages multiplied by `sign`.

    Returns (eval reward before, eval reward after, training rewards per step, eval success rates
    before/after, target mass after)."""
    model = copy.deepcopy(base)
    # eos_token_ids=[]: every continuation is exactly RESP_LEN tokens, so the reward is about which tokens
    # are sampled, not how many. The engine reads the policy's own weights (one process, one module).
    eng = HFEngine(model, tok, eos_token_ids=[])
    opt, sched = grpo.make_optimizer(model, lr=LR, warmup_steps=1, weight_decay=0.0)
    loop = asyncio.new_event_loop()

    def evaluate():
        _, outs = loop.run_until_complete(_sample(eng, prompts, EVAL_PER_PROMPT, 10**7 + seed * 10**5))
        r = [_reward(o.token_ids) for o in outs]
        return sum(r) / len(r), sum(x > 0 for x in r) / len(r)

    try:
        r0, p0 = evaluate()
        rewards = []
        for step in range(STEPS):
            ps, outs = loop.run_until_complete(_sample(eng, prompts, GROUP, seed * 10**5 + step * 100))
            assert all(len(o.token_ids) == RESP_LEN for o in outs)
            r = [_reward(o.token_ids) for o in outs]
            rewards.append(round(sum(r) / len(r), 3))
            adv, _ = grpo.compute_advantages(r, group_size=GROUP)
            adv = adv * sign
            batch = [grpo.TrainSeq(input_ids=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                                     advantage=a) for p, o, a in zip(ps, outs, adv.tolist())]
            for b, o, lp in zip(batch, outs, grpo.compute_old_logprobs(model, batch, HOW, temperature=1.0)):
                b.old_logp = lp
                # the engine sampled from exactly the policy being trained (no stale KV, no stale weights)
                assert torch.allclose(lp[-RESP_LEN:], torch.tensor(o.logprobs), atol=1e-3), step
            st = grpo.update(model, opt, sched, batch, CFG, HOW, mini_batch_size=len(batch), max_len=RESP_LEN,
                             temperature=1.0, scaler=precision.LossScaler())
            assert st["n_mini_batches"] == 1 and st["loss_tokens"] == len(batch) * RESP_LEN
            eng.flush_cache()  # the prompts' cached KV was computed by the old weights
        r1, p1 = evaluate()
    finally:
        eng.shutdown()
        loop.close()
    return r0, r1, rewards, (p0, p1), _target_mass(model, prompts)


def test_grpo_learns_and_sign_flip_unlearns():
    _learn_and_unlearn(seed=0)


def _learn_and_unlearn(seed: int):
    """Both runs and every assertion; `seed` picks the sampling seeds (checked for several by hand)."""
    tok = load_tokenizer("tiny-bytes")
    base = load_model("tiny-bytes")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in PROBLEMS]
    mass0 = _target_mass(base, prompts)

    r0, r1, rewards_up, (p0, p1), mass_up = _train(base, tok, prompts, sign=1.0, seed=seed)
    d0, d1, rewards_down, (q0, q1), mass_down = _train(base, tok, prompts, sign=-1.0, seed=seed)
    print(f"\neval reward (256 fixed-seed samples): learn {r0:.3f} -> {r1:.3f}; flipped {d0:.3f} -> {d1:.3f}")
    print(f"target mass at the first response token: init {mass0:.4f}, learn {mass_up:.4f}, flipped {mass_down:.5f}")
    print("learn:", rewards_up)
    print("flipped:", rewards_down)

    # the same initial weights and evaluation seeds: both runs start from the same measurement
    assert (r0, p0) == (d0, q0)
    # the reward is learnable from scratch: rare but not negligible at init
    assert 0.04 <= p0 <= 0.25, p0
    # GRPO raises it far beyond what sampling noise on 256 samples (std of the rate ~0.02) could do
    assert r1 - r0 >= 0.8 and p1 >= p0 + 0.4, (r0, r1)
    assert sum(rewards_up[-2:]) / 2 - sum(rewards_up[:2]) / 2 >= 0.5, rewards_up
    assert mass_up >= 5 * mass0, (mass0, mass_up)
    # negative control: the flipped signal drives the target out (the fall is bounded by the low start)
    assert q1 <= q0 / 3 and d1 <= d0 - 0.1, (d0, d1)
    assert mass_down <= mass0 / 5, (mass0, mass_down)


# ----------------------------------------------------------------------------- 2. SAAR + gradient mask

def _call(code: str, reasoning: str) -> str:
    return reasoning + "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + \
        "\n</tool_call>"


DEEP_CODE = """from fractions import Fraction
terms = [Fraction(k, k + 1) for k in range(1, 8)]
acc = Fraction(0)
for t in terms:
    acc += t
    assert acc.denominator > 0, 'bad denominator'
numbers = sorted({a * b for a in range(2, 9) for b in range(3, 7)})
print(len(numbers), acc.numerator % 10, acc.denominator % 7)"""

# (failed turn, SAAR's regeneration, final answer, expected event)
SCRIPTS = [
    (_call("print(6 * 7 / 0)", "I will compute 6*7 in Python.\n"),
     _call("print(6 * 7)", "Dividing by zero was a typo.\n"),
     "The tool printed 42, so the answer is \\boxed{42}.<|im_end|>", "shallow", "ZeroDivisionError"),
    (_call("print(undefined_total)", "Let me look up the stored total.\n"),
     _call(DEEP_CODE, "A completely different approach: sum the fractions exactly.\n"),
     "So the answer is \\boxed{7}.<|im_end|>", "deep", "NameError"),
]


def test_tool_tokens_get_no_gradient_and_saar_splice_does():
    tok = load_tokenizer("tiny-qwen3")
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    prompt = rollout.prompt_ids(tok, "What is 6*7?", "math", "hermes")
    trajs, engines = [], []
    with Sandbox(slots=1, timeout_s=4.0) as sb:
        for i, (bad, fixed, answer, _, _) in enumerate(SCRIPTS):
            eng = ScriptedEngine(tok, [bad, fixed, answer])
            trajs += asyncio.run(asyncio.wait_for(rollout.rollout_batch(
                eng, sb, tok, [prompt], config.Rollout(tool_format="hermes", max_turns=16, max_response_tokens=20480,
                                                       temperature=1.0), config.Saar(), seeds=[i]), 60))
            engines.append(eng)

    spliced_at, tool_at = [], []  # per trajectory: response positions of SAAR's splice / of the tool turn
    for traj, eng, (bad, fixed, answer, kind, error) in zip(trajs, engines, SCRIPTS):
        assert traj.saar and [e["kind"] for e in traj.saar_events] == [kind], traj.saar_events
        assert traj.num_tool_calls == 2 and traj.num_tool_errors == 1 and traj.finish_reason == "answer"
        # the failure was real: the regeneration saw the sandbox's error right after the failed call
        assert eng.inputs[1][:len(prompt) + len(enc(bad))] == prompt + enc(bad) and error in tok.decode(eng.inputs[1])
        # ... and the final sequence holds neither the failed call nor its error
        text = tok.decode(prompt + traj.response_ids)
        bad_code = json.loads(bad[bad.index("{"):bad.rindex("}") + 1])["arguments"]["code"]
        assert error not in text and "Traceback" not in text and json.dumps(bad_code) not in text
        # the splice: shallow = old reasoning + new call, deep = the new turn whole
        old_ids, new_ids = enc(bad), enc(fixed)
        k_new = saar.split_turn(new_ids, tokenizer=tok, syntax=rollout.CallSyntax('hermes')) if kind == "shallow" else 0
        pos = saar.split_turn(old_ids, tokenizer=tok, syntax=rollout.CallSyntax('hermes')) if kind == "shallow" else 0
        spliced = new_ids[k_new:]
        assert traj.response_ids[:pos] == old_ids[:pos]
        dropped = fixed[:fixed.index("<tool_call>")] if kind == "shallow" else bad[:bad.index("<tool_call>")]
        assert dropped.strip() not in text  # the reasoning that the replacement did not keep
        assert traj.response_ids[pos:pos + len(spliced)] == spliced
        assert all(m == 1 for m in traj.loss_mask[:pos + len(spliced)])
        assert json.dumps(json.loads(fixed[fixed.index("{"):fixed.rindex("}") + 1])["arguments"]["code"]) in text
        spliced_at.append(range(pos, pos + len(spliced)))
        # layout: [the purified turn, mask 1] [tool output + scaffolding, mask 0] [the answer, mask 1]
        n1, n_ans = pos + len(spliced), len(enc(answer))
        assert traj.loss_mask == [1] * n1 + [0] * (len(traj.response_ids) - n1 - n_ans) + [1] * n_ans
        assert traj.response_ids[-n_ans:] == enc(answer)
        assert tok.decode(traj.response_ids[n1:-n_ans]).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n")
        tool_at.append(range(n1, len(traj.response_ids) - n_ans))

    # rewards and the batch exactly as train.py builds them
    rewards = [1.0 if reward.grade("math", t.final_text(tok), answer="42") else -1.0 for t in trajs]
    assert rewards == [1.0, -1.0]
    adv, _ = grpo.compute_advantages(rewards, [0, 0])
    batch = [grpo.TrainSeq.of(t, a) for t, a in zip(trajs, adv.tolist())]
    for b, t, at in zip(batch, trajs, spliced_at):  # the spliced tokens are marked, as the monitor reads them
        assert [i - len(t.prompt_ids) for i, s in enumerate(b.spliced) if s] == list(at)
    model = load_model("tiny-qwen3")  # random weights, built once from a fixed seed
    for b, lp in zip(batch, grpo.compute_old_logprobs(model, batch, HOW, temperature=1.0)):
        b.old_logp = lp

    # d loss / d logp_t at EVERY position: the log-probs are computed for all tokens (no mask), then the
    # loss is grpo.policy_loss called as grpo.update calls it (packed row, global normaliser, seq_ids)
    model.train()
    mb = packing.collate(batch)
    logp = packing.token_logprobs(model, mb.input_ids, mb.position_ids)
    loss, _ = grpo.policy_loss(logp, mb.old_logp, mb.adv, mb.loss_mask, is_weight=mb.is_weight,
                               normaliser=grpo.loss_normaliser(batch, "token-mean"), seq_ids=mb.seq_ids)
    (g,) = torch.autograd.grad(loss, logp)
    for b, t, lp, gt, at, tt in zip(batch, trajs, logp[0].detach().split(mb.lengths), g[0].split(mb.lengths),
                                    spliced_at, tool_at):
        mask = torch.tensor(b.loss_mask, dtype=torch.bool)
        p = len(t.prompt_ids)
        assert (lp[1:] != 0).all()        # every position really has a log-prob in the graph
        # the prompt and the tool turn (output + scaffolding, located from the script): exactly no gradient
        tool = torch.tensor([p + i for i in tt])
        assert gt[:p].eq(0).all() and gt[tool].eq(0).all()
        assert gt[~mask].eq(0).all() and gt[mask].ne(0).all()  # and every token with loss mask 1 has one
        spliced = torch.tensor([p + i for i in at])
        assert mask[spliced].all() and gt[spliced].ne(0).all()
        assert torch.sign(gt[spliced]).eq(-torch.sign(torch.tensor(b.advantage))).all()  # up for A > 0

    # one real update on this batch: the same loss, and the weights move
    before = {n: q.detach().clone() for n, q in model.named_parameters()}
    opt, sched = grpo.make_optimizer(model, lr=1e-3, warmup_steps=1)
    st = grpo.update(model, opt, sched, batch, CFG, HOW, mini_batch_size=2, max_len=4096, temperature=1.0,
                     scaler=precision.LossScaler())
    assert st["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    assert st["loss_tokens"] == sum(sum(b.loss_mask) for b in batch)
    assert any(not torch.equal(before[n], q) for n, q in model.named_parameters())
