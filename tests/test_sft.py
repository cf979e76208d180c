"""sft.py: the SFT sequences are the rollout's layout token for token, masks, training, saving, the warm-start cache."""
import asyncio
import json
from pathlib import Path

import pytest
import config
import torch

import rollout
import tools
import sft
from data import synth
from data.models import load_model, load_tokenizer
from fakes import ScriptedEngine
from sandbox import Sandbox


@pytest.fixture(scope="module")
def sb():
    with Sandbox(slots=2, timeout_s=4.0) as s:
        yield s


_TOKENIZERS = {}


def tokenizer(name):
    """Load each tokenizer once per module (the Qwen one takes seconds)."""
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = load_tokenizer(name)
    return _TOKENIZERS[name]


def segments(ids, mask):
    """Runs of equal mask: [(mask, ids), ...]."""
    out = []
    for t, m in zip(ids, mask):
        if not out or out[-1][0] != m:
            out.append((m, []))
        out[-1][1].append(t)
    return out


@pytest.mark.parametrize("name,fmt", [("tiny-qwen3", "hermes"), ("tiny-qwen3", "markdown"), ("tiny-bytes", "markdown")])
def test_layout_is_the_rollouts_token_for_token(name, fmt, sb):
    tok = tokenizer(name)
    convs = synth.warmup_conversations(3, seed=5, tool_format=fmt)
    problems = synth.make_problems(3, 5, difficulty="warmup")
    for conv, prob in zip(convs, problems):
        ids, mask = sft.encode_conversation(tok, conv["messages"], tool_format=fmt)
        # built by hand from rollout.py's pieces: the model's call turn stops at the stop marker
        turn = conv["messages"][1]["content"] + ("\n" if fmt == "markdown" else "")
        stdout = tools.tool_text(sb.run(rollout.parse_call(turn, fmt).code))  # what the model reads, e.g. "350\n"
        final = conv["messages"][3]["content"]
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        prompt = rollout.prompt_ids(tok, prob.problem, "math", fmt)
        expected = prompt + enc(turn) + enc(rollout.tool_turn_text(stdout, fmt, ended=False)) + enc(final) + [tok.eos_token_id]
        assert ids == expected
        assert mask == [0] * len(prompt) + [1] * len(enc(turn)) + [0] * len(enc(rollout.tool_turn_text(stdout, fmt, False))) \
            + [1] * (len(enc(final)) + 1)
        # the call turn ends exactly where generation stops, and nowhere earlier
        stop_ids, stop_strs = rollout.stop_conditions(tok, fmt)
        if stop_strs:
            assert turn.endswith(stop_strs[0]) and turn.count(stop_strs[0]) == 1
        else:
            assert enc(turn)[-1] in stop_ids and sum(t in stop_ids for t in enc(turn)) == 1

        # a real rollout whose model samples exactly the masked tokens builds the same sequence and mask
        model_turns = [tok.decode(t) for m, t in segments(ids, mask) if m == 1]
        eng = ScriptedEngine(tok, model_turns)
        traj = asyncio.run(rollout.rollout_one(eng, sb, tok, prompt, config.Rollout(tool_format=fmt, max_turns=16, max_response_tokens=20480, temperature=1.0), seed=0))
        assert eng.outputs == [t for m, t in segments(ids, mask) if m == 1]
        assert traj.finish_reason == "answer" and traj.num_tool_calls == 1 and traj.turns[0]["ok"]
        assert traj.prompt_ids + traj.response_ids == ids
        assert [0] * len(traj.prompt_ids) + traj.loss_mask == mask
        assert traj.turns[0]["output"].strip() == prob.answer


@pytest.mark.parametrize("fmt", ["markdown", "hermes"])
def test_fix_conversations_read_the_real_error_then_call_again(fmt, sb):
    """--fix-fraction 1: every conversation breaks its first call, reads the sandbox's own error text and calls
    again with working code; a rollout (SAAR off) whose model samples the masked turns builds the same tokens."""
    tok = tokenizer("tiny-qwen3")
    convs = synth.warmup_conversations(6, seed=5, tool_format=fmt, fix_fraction=1.0)
    problems = synth.make_problems(6, 5, difficulty="warmup")
    errors = set()
    for conv, prob in zip(convs, problems):
        assert [m["role"] for m in conv["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        ids, mask = sft.encode_conversation(tok, conv["messages"], tool_format=fmt)
        prompt = rollout.prompt_ids(tok, prob.problem, "math", fmt)
        eng = ScriptedEngine(tok, [tok.decode(t) for m, t in segments(ids, mask) if m == 1])
        traj = asyncio.run(rollout.rollout_one(eng, sb, tok, prompt, config.Rollout(tool_format=fmt, max_turns=16, max_response_tokens=20480, temperature=1.0), seed=0))
        assert traj.prompt_ids + traj.response_ids == ids and [0] * len(prompt) + traj.loss_mask == mask
        assert [t["ok"] for t in traj.turns] == [False, True] and traj.finish_reason == "answer"
        assert traj.turns[1]["output"].strip() == prob.answer
        errors.add(conv["messages"][2]["content"].strip().splitlines()[-1].split(":")[0])
    assert errors & {"NameError", "SyntaxError"}, errors
    plain = synth.warmup_conversations(6, seed=5, tool_format=fmt)
    assert plain == synth.warmup_conversations(6, seed=5, tool_format=fmt, fix_fraction=0.0)
    assert [c["messages"][-1] for c in plain] == [c["messages"][-1] for c in convs]
    with pytest.raises(ValueError, match="fix_fraction"):
        synth.warmup_conversations(2, seed=5, tool_format=fmt, fix_fraction=1.5)


def test_openai_messages_with_tool_calls(tmp_path):
    tok = tokenizer("tiny-qwen3")
    code = "x = 2 ** 10\nprint(x)"
    row = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2^10?"},
        {"role": "assistant", "content": "I will compute it.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1024\n" + "x" * 600},
        {"role": "assistant", "content": "So \\boxed{1024}."}]}
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps(row) + "\n\n" + json.dumps({"messages": row["messages"][:3] + row["messages"][4:]}) + "\n")
    rows = sft.load_conversations(str(path))
    assert [w for w, _ in rows] == [f"{path}:1", f"{path}:3"]

    for fmt in ("markdown", "hermes"):
        ids, mask = sft.encode_conversation(tok, rows[0][1], tool_format=fmt)
        segs = segments(ids, mask)
        assert [m for m, _ in segs] == [0, 1, 0, 1]
        head = tok.apply_chat_template(row["messages"][:2], tools=tools.schemas() if fmt == "hermes" else None,
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
        assert segs[0][1] == list(head)
        call = tok.decode(segs[1][1])
        assert call.startswith("I will compute it.") and rollout.parse_call(call, fmt).code.strip() == code
        if fmt == "markdown":
            assert call.endswith("\nprint(x)\n```\n")
        else:  # renamed to the rollout's tool
            assert call.endswith("</tool_call>") and '"name": "code_interpreter"' in call
        tool = tok.decode(segs[2][1])
        assert tool == rollout.tool_turn_text(rollout.truncate_middle("1024\n" + "x" * 600, 256), fmt, ended=False)
        assert tok.decode(segs[3][1]) == "So \\boxed{1024}.<|im_end|>"

    # the second row calls a tool but gets no result: skipped with its location; nothing usable left -> error
    with pytest.raises(ValueError, match="no usable conversations"):
        sft.build_dataset(tok, data=_write(tmp_path, [rows[1][1]]), n=0,
                          tool_format="markdown", tool_output_chars=256, max_len=4096, seed=0)
    seqs = sft.build_dataset(tok, data=str(path), n=0, tool_format="hermes", tool_output_chars=256, max_len=4096, seed=0)
    assert len(seqs) == 1


def _write(tmp_path, convs, name="rows.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    return str(p)


@pytest.mark.parametrize("msgs,err", [
    ([{"role": "assistant", "content": "hi"}], "no user message"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}],
     "last message must be the assistant"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "python", "arguments": {"code": "1"}}}, {"function": {"name": "python", "arguments": {}}}]},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "a"}], "2 tool calls in one turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "python", "arguments": "{\"cmd\": \"ls\"}"}}]},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "a"}], "has no 'code' string"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "no call here"},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "a"}], "holds no markdown call"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "```\nx\n```\n```python\nprint(1)\n```"},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "a"}], "would stop generating there"),
])
def test_unrepresentable_conversations_name_the_problem(msgs, err):
    tok = tokenizer("tiny-bytes")
    with pytest.raises(ValueError, match=err) as e:
        sft.encode_conversation(tok, msgs, tool_format="markdown", where="f.jsonl:7")
    assert "f.jsonl:7" in str(e.value)


def test_bad_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"x\.jsonl:2: malformed JSON line"):
        sft.load_conversations(str(p))
    p.write_text(json.dumps({"messages": "hello"}) + "\n")
    with pytest.raises(ValueError, match=r"x\.jsonl:1: field 'messages'"):
        sft.load_conversations(str(p))
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        sft.load_conversations(str(tmp_path / "nope.jsonl"))


def test_packing_and_training_reduce_the_loss():
    tok = tokenizer("tiny-bytes")
    torch.manual_seed(0)
    model = load_model("tiny-bytes")
    seqs = sft.build_dataset(tok, data="synth", n=2, tool_format="markdown", tool_output_chars=256, max_len=4096, seed=1)
    n_loss = sum(sum(m) for _, m in seqs)
    nll = lambda idx, micro: sft.masked_nll(model, seqs, idx, micro_tokens=micro, normaliser=n_loss,  # noqa: E731
                                            backward=False)
    with torch.no_grad():
        packed, alone = nll([0, 1], 4096), nll([0], 1024) + nll([1], 1024)
    assert packed == pytest.approx(alone, rel=1e-4)  # packed rows do not attend across conversations
    stats = sft.train(model, seqs, epochs=2, lr=1e-2, batch_size=1, micro_tokens=1024, warmup_steps=1,
                      weight_decay=0.0, grad_clip=1.0, seed=0, train_layers=0)
    with torch.no_grad():
        after = nll([0, 1], 4096)
    assert len(stats) == 4 and after < packed - 0.3
    assert all(p.requires_grad for p in model.parameters())  # unfrozen again for whoever uses the model next


def test_warm_start_trains_once_saves_a_loadable_model_and_reuses_it(tmp_path, monkeypatch):
    kw = dict(tool_format="markdown", seed=0, n=1, cache=tmp_path, micro_tokens=1024, train_layers=0)
    # as a torchrun rank on a CPU (one thread of two ranks'): the rank that trains it takes the waiting rank's thread
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = sft.warm_start("tiny-bytes", **kw)
        assert torch.get_num_threads() == 1  # and gives it back
    finally:
        torch.set_num_threads(threads)
    marker = json.loads((Path(path) / sft.MARKER).read_text())
    assert marker["base_model"] == "tiny-bytes" and marker["conversations"] == 1 and marker["args"]["threads"] == 2
    model, tok = load_model(path), load_tokenizer(path)
    base = load_model("tiny-bytes")
    assert tok.eos_token == "<|im_end|>"
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()]  # no temp folder left behind

    assert sft.warm_start("tiny-bytes", **kw) == path
    assert json.loads((Path(path) / sft.MARKER).read_text())["created"] == marker["created"]  # not retrained
    assert sft.warm_start("tiny-bytes", **(kw | {"seed": 1})) != path  # another key, another model

    # a folder whose marker is unreadable (a killed build, a damaged file) is retrained
    (Path(path) / sft.MARKER).write_text("{")
    assert sft.warm_start("tiny-bytes", **kw) == path
    assert json.loads((Path(path) / sft.MARKER).read_text())["created"] > marker["created"]
    with pytest.raises(TypeError, match="unknown Args fields"):
        sft.warm_start("tiny-bytes", cache=tmp_path, learning_rate=1.0)


def test_parse_args_from_the_dataclass():
    a = config.cli(sft.Args, "", ["--epochs", "3", "--no-eval-base", "--tool-format", "hermes", "--lr", "1e-5"])
    assert (a.sft.epochs, a.sft.eval_base, a.sft.tool_format, a.sft.lr, a.common.model) == \
        (3, False, "hermes", 1e-5, "smollm2-135m")
    # every setting has its help line: the string literal under it, which tyro shows with --help
    import ast
    import dataclasses
    import inspect
    sections = [c for c in vars(config).values() if dataclasses.is_dataclass(c) and c.__module__ == "config"]
    for cls in sections:
        body = ast.parse(inspect.getsource(cls)).body[0].body
        docs = {a.target.id for a, b in zip(body, body[1:]) if isinstance(a, ast.AnnAssign) and
                isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and b.value.value.strip()}
        if cls not in (config.Train, config.Eval, config.SftArgs, config.Machinery):  # composites hold sections
            own = set(cls.__annotations__)  # the fields this class declares (TrainSaar: not Saar's)
            assert docs == own, (cls.__name__, own - docs)


@pytest.mark.parametrize("fmt", ["markdown", "hermes"])
def test_eval_rolls_out_and_counts_calls_and_answers(fmt):
    tok = tokenizer("tiny-qwen3")
    answer = synth.make_problems(1, 7 + sft.EVAL_SEED_OFFSET, difficulty="warmup")[0].answer
    call = (f"```python\nprint({answer})\n```" if fmt == "markdown" else
            '<tool_call>\n' + json.dumps({"name": tools.PythonTool.name, "arguments": {"code": f"print({answer})"}}) + '\n</tool_call>')
    good = ScriptedEngine(tok, [f"Compute it.\n{call}", f"So \\boxed{{{answer}}}.<|im_end|>"])
    r = sft.evaluate(good, tok, tool_format=fmt, n=1, seed=7)
    assert (r["n"], r["blocks"], r["right"], r["final"]) == (1, 1, 1, 1), r
    assert len(good.inputs) == 2 and str(answer) in tok.decode(good.inputs[1][-40:])  # the tool's output came back
    wrong = ScriptedEngine(tok, ["```python\nprint(0\n", f"\\boxed{{{answer}1}}<|im_end|>"] if fmt == "markdown" else
                           ["<tool_call>\n{not json}\n</tool_call>", f"\\boxed{{{answer}1}}<|im_end|>"])
    r = sft.evaluate(wrong, tok, tool_format=fmt, n=1, seed=7)
    assert (r["blocks"], r["right"], r["final"]) == (0, 0, 0), r


def test_the_warm_start_keys_on_its_conversations_not_on_source(tmp_path):
    """The warm start's cache key covers what it trains on: in a copy of the checkout, rewording the math prompt
    (data/prompts.py) or the traceback the model reads (tools.py) gives another key, so warm_start trains a new model;
    editing the algorithm (saar.py, grpo.py), which writes no conversation, keeps the key and the cached model."""
    import shutil
    import subprocess
    import sys
    root = Path(sft.__file__).resolve().parent
    copy = tmp_path / "checkout"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "out", "tests",
                                                                 "docs", "bench", "scripts"))
    fixes = {"fix_fraction": 1.0}  # every conversation makes a broken call and reads its real error

    def key() -> str:
        code = f"import sft; print(sft.cache_key('tiny-bytes', 'markdown', 0, 6, {fixes}))"
        return subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                              check=True).stdout.strip()

    def edit(name: str, old: str, new: str) -> None:
        f = copy / name
        assert old in f.read_text()
        f.write_text(f.read_text().replace(old, new))
    first = key()
    edit("saar.py", "return difflib.SequenceMatcher(None, old, new).ratio()", "return 0.0")
    edit("grpo.py", "pg = torch.maximum(pg1, pg2)", "pg = pg1")
    assert key() == first  # an ablation of the algorithm reuses the cold start
    edit("data/prompts.py", "Solve the following math problem step by step.", "Solve this math problem carefully.")
    second = key()
    assert second != first
    assert any("Traceback (most recent call last):" in m["content"] for c in
               synth.warmup_conversations(6, 0, "markdown", 1.0) for m in c["messages"])
    edit("tools.py", '"Traceback (most recent call last):"', '"Traceback:"')
    assert key() not in (first, second)
    assert sft.cache_key("tiny-bytes", "markdown", 0, 6, fixes) == first  # the checkout itself
