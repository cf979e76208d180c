"""Rollouts with real models on the HF engine: log-probs, masks and round trips; a SmolLM2 run on real data."""
import asyncio
import json

import pytest
import torch

import config
import rollout
import tools
from data.models import load_model, load_tokenizer
from data.problems import load_named
from machinery.hf_engine import HFEngine
from sandbox import Sandbox


@pytest.fixture(scope="module")
def sb():
    with Sandbox(slots=2, timeout_s=4.0) as s:
        yield s


def forward_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()  # (T-1, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # (T-1,)


@pytest.mark.parametrize("name,fmt", [("tiny-qwen3", "hermes"), ("tiny-bytes", "markdown")])
def test_rollout_logprobs_match_a_fresh_forward_pass(name, fmt, sb):
    tok, model = load_tokenizer(name), load_model(name).eval()
    eng = HFEngine(model, tok, max_batch=8)
    problems = ["What is 2+2?", "Count primes below 100."]
    prompts = [rollout.prompt_ids(tok, p, "math", fmt) for p in problems]
    cfg = config.Rollout(tool_format=fmt, max_turns=3, max_response_tokens=32, temperature=1.0)
    trajs = asyncio.run(rollout.rollout_batch(eng, sb, tok, prompts, cfg, seeds=[1, 2]))
    eng.shutdown()
    for tr, p in zip(trajs, prompts):
        assert tr.prompt_ids == p
        assert len(tr.response_ids) == len(tr.loss_mask) == len(tr.logprobs) > 0
        assert len(tr.response_ids) <= 32
        assert tok.decode(tr.response_ids, skip_special_tokens=False) == tr.text
        ref = forward_logprobs(model, tr.prompt_ids + tr.response_ids)[len(p) - 1:]  # log p(response token t)
        sampled = torch.tensor(tr.logprobs)
        m = torch.tensor(tr.loss_mask, dtype=torch.bool)
        assert m[0], "the first response token is sampled"
        torch.testing.assert_close(sampled[m], ref[m], atol=2e-4, rtol=1e-4)
        assert (sampled[~m] == 0).all()


def test_smollm2_rollout_on_real_problems_writes_jsonl(sb, shared_data, tmp_path):
    tok, model = load_tokenizer("smollm2-135m"), load_model("smollm2-135m").eval()
    eng = HFEngine(model, tok, max_batch=8)
    probs = load_named("aime24", data_dir=shared_data, limit=2) + load_named("math_train", data_dir=shared_data,
                                                                             limit=1, on_error="skip")
    prompts = [rollout.prompt_ids(tok, p.problem, p.task, "markdown") for p in probs]
    cfg = config.Rollout(tool_format="markdown", max_turns=3, max_response_tokens=128, temperature=1.0)
    trajs = asyncio.run(rollout.rollout_batch(eng, sb, tok, prompts, cfg, seeds=list(range(len(prompts))),
                                              metas=[{"id": p.id} for p in probs]))
    eng.shutdown()
    path = tmp_path / "rollouts.jsonl"
    with open(path, "w") as f:
        for tr in trajs:
            f.write(json.dumps(vars(tr)) + "\n")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["meta"]["id"] for r in rows] == [p.id for p in probs]
    for r in rows:
        assert r["finish_reason"] in ("answer", "length", "max_turns", "max_tool_calls")
        assert r["text"] and len(r["response_ids"]) == len(r["loss_mask"])
        for t in r["turns"]:  # every call the model made was executed and its result recorded
            assert t["error_kind"] in ("none", "exception", "syntax", "timeout", "memory", "output_limit", "crash",
                                       "malformed")


def test_prompt_template_file(tmp_path):
    """--prompt-template: a JSON file of the user's wording by task, with {problem} and {tool}, braces as written,
    and a system prompt; bad files are named with what is wrong."""
    tok = load_tokenizer("tiny-qwen3")
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"math": "Q: {problem}\n{tool}Put the answer in \\boxed{}.", "system": "Be brief."}))
    t = rollout.load_prompt_template(str(path))
    assert rollout.make_prompt(" 1+1? ", "math", "markdown", t) == \
        "Q: 1+1?\n" + tools.sentence("markdown") + "Put the answer in \\boxed{}."
    assert rollout.make_prompt("x", "code", "hermes", t) == rollout.make_prompt("x", "code", "hermes")  # ours
    text = tok.decode(rollout.prompt_ids(tok, "1+1?", "math", "hermes", templates=t))
    assert "Be brief." in text and "Q: 1+1?" in text
    for bad, msg in [({"math": "no placeholder"}, "has no {problem}"), ({"poem": "{problem}"}, "unknown keys"),
                     (["x"], "JSON object of strings")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg):
            rollout.load_prompt_template(str(path))
    path.write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        rollout.load_prompt_template(str(path))
    with pytest.raises(FileNotFoundError, match="no such file"):
        rollout.load_prompt_template(str(tmp_path / "missing.json"))


def test_resolve_tool_format_picks_hermes_for_a_one_token_tool_call():
    """--tool-format auto: hermes for Qwen's tokenizer (<tool_call> is one token), markdown for the others."""
    assert rollout.resolve_tool_format(load_tokenizer("tiny-qwen3"), "auto") == "hermes"
    assert rollout.resolve_tool_format(load_tokenizer("smollm2-135m"), "auto") == "markdown"
    assert rollout.resolve_tool_format(load_tokenizer("tiny-qwen3"), "markdown") == "markdown"
    assert rollout.resolve_tool_format(load_tokenizer("smollm2-135m"), "none") == "none"
