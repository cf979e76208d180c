"""SAAR's pure parts on real tokenizers: similarity, splitting on token boundaries, shallow vs deep."""
import difflib
import json
import math

import pytest

import rollout
import saar
from data.models import load_tokenizer

HERMES, MARKDOWN = rollout.CallSyntax("hermes"), rollout.CallSyntax("markdown")


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-bytes"])
def tok(request):
    return load_tokenizer(request.param)


def hermes(reasoning: str, code: str) -> str:
    call = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
    return f"{reasoning}<tool_call>\n{call}\n</tool_call>"


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_similarity_is_difflib_ratio():
    a, b = "print(sum(range(10))", "print(sum(range(10)))"
    assert saar.similarity(a, b) == difflib.SequenceMatcher(None, a, b).ratio()
    assert saar.similarity("abc", "abc") == 1.0
    assert saar.similarity("", "") == 1.0


def test_typo_fix_is_shallow_and_keeps_reasoning_bytes(tok):
    reasoning = "Let me add the numbers from 0 to 9 with a quick script.\n"
    old = enc(tok, hermes(reasoning, "print(sum(range(10))"))
    new = enc(tok, hermes("Oops, a missing parenthesis. Fixed:\n", "print(sum(range(10)))"))
    rep = saar.replace_turn(old, new, tokenizer=tok, gamma=0.5, syntax=HERMES)
    assert rep.kind == "shallow" and rep.similarity > 0.9
    k = rep.keep
    assert rep.ids[:k] == old[:k]  # the old reasoning tokens, byte for byte
    assert tok.decode(rep.ids[:k]) == reasoning
    assert tok.decode(rep.ids) == hermes(reasoning, "print(sum(range(10)))")


def test_different_algorithm_is_deep(tok):
    old_code = "total = 0\nfor i in range(1, 1001):\n    if i % 3 == 0 or i % 5 == 0:\n        total += i\nprint(total)"
    new_code = ("from itertools import combinations\nwords = [\"apple\", \"kiwi\", \"banana\"]\n"
                "pairs = [w1 + w2 for w1, w2 in combinations(words, 2)]\nprint(sorted(pairs, key=len)[-1].upper())")
    old = enc(tok, hermes("Brute force it.\n", old_code))
    new = enc(tok, hermes("Use sympy instead.\n", new_code))
    rep = saar.replace_turn(old, new, tokenizer=tok, gamma=0.5, syntax=HERMES)
    assert rep.kind == "deep" and rep.similarity < 0.5
    assert rep.ids == new and rep.keep == 0


def test_turn_without_call_is_deep(tok):
    old = enc(tok, hermes("Compute.\n", "print(1/0)"))
    new = enc(tok, "The answer is \\boxed{3}.")
    rep = saar.replace_turn(old, new, tokenizer=tok, syntax=HERMES)
    assert rep.kind == "deep" and math.isnan(rep.similarity) and rep.ids == new
    rep = saar.replace_turn(new, old, tokenizer=tok, syntax=HERMES)
    assert rep.kind == "deep" and rep.ids == old


def test_unicode_in_code(tok):
    reasoning = "Print the greeting — «café» ✓\n"
    old = enc(tok, hermes(reasoning, "print('héllo ✓ 中文'"))
    new = enc(tok, hermes("fixed\n", "print('héllo ✓ 中文')"))
    rep = saar.replace_turn(old, new, tokenizer=tok, syntax=HERMES)
    assert rep.kind == "shallow"
    assert tok.decode(rep.ids) == hermes(reasoning, "print('héllo ✓ 中文')")


def test_empty_call(tok):
    old = enc(tok, "Let me try.\n<tool_call>\n\n</tool_call>")
    new = enc(tok, hermes("Now with code.\n", "print(2**10)"))
    k = saar.split_turn(old, tokenizer=tok, syntax=HERMES)
    assert tok.decode(old[:k]) == "Let me try.\n"
    rep = saar.replace_turn(old, new, tokenizer=tok, syntax=HERMES)
    assert rep.kind in ("shallow", "deep")
    k_new = saar.split_turn(new, tokenizer=tok, syntax=HERMES)
    expected = saar.similarity("<tool_call>\n\n</tool_call>", tok.decode(new[k_new:]))
    assert rep.similarity == pytest.approx(expected)


def test_marker_split_across_tokens():
    # SmolLM2's tokenizer has no <tool_call> token, so the marker spans several tokens; in markdown
    # the fence shares a token with the newline before it.
    smol = load_tokenizer("smollm2-135m")
    text = hermes("Let me check this:", "print(7*6)")
    ids = enc(smol, text)
    assert len(enc(smol, "<tool_call>")) > 1
    k = saar.split_turn(ids, tokenizer=smol, syntax=HERMES)
    head, tail = smol.decode(ids[:k]), smol.decode(ids[k:])
    assert head + tail == text and "<tool_call>" in tail and "<tool_call>" not in head
    assert text.startswith(head) and len(head) <= text.index("<tool_call>")
    md = "I will compute it\n```python\nprint(7*6)\n```\n"
    q = load_tokenizer("tiny-qwen3")
    ids = enc(q, md)
    k = saar.split_turn(ids, tokenizer=q, syntax=MARKDOWN)
    head, tail = q.decode(ids[:k]), q.decode(ids[k:])
    assert head + tail == md and tail.lstrip("\n").startswith("```python") and "```" not in head


def test_markdown_shallow_and_code_similarity():
    q = load_tokenizer("tiny-qwen3")
    old = enc(q, "Compute it.\n```python\nprint(sum(i*i for i in range(100))\n```\n")
    new = enc(q, "Fix.\n```python\nprint(sum(i*i for i in range(100)))\n```\n")
    rep = saar.replace_turn(old, new, tokenizer=q, syntax=MARKDOWN)
    assert rep.kind == "shallow"
    assert q.decode(rep.ids) == "Compute it.\n```python\nprint(sum(i*i for i in range(100)))\n```\n"
    # on code only, a JSON-wrapped call and a different short program are told apart
    a = enc(q, hermes("", "x = 3\nprint(x * 2)"))
    b = enc(q, hermes("", "import math\nprint(math.pi)"))
    on_call = saar.replace_turn(a, b, tokenizer=q, syntax=HERMES, sim_on="call").similarity
    on_code = saar.replace_turn(a, b, tokenizer=q, syntax=HERMES, sim_on="code").similarity
    assert on_code < on_call
    assert on_code == pytest.approx(saar.similarity("x = 3\nprint(x * 2)", "import math\nprint(math.pi)"))
    with pytest.raises(ValueError, match="sim_on"):
        saar.replace_turn(a, b, tokenizer=q, syntax=HERMES, sim_on="bogus")


def test_sim_eos_compares_the_call_as_the_official_loop_has_it():
    """The official call segment runs to the end of the turn, <|im_end|> included; ours stops at </tool_call>.
    Ten equal characters more on both sides lift a ratio just below gamma over it: sim_eos makes that decision."""
    tok = load_tokenizer("tiny-qwen3")
    flipped = None
    for k in range(1, 200):  # two unrelated codes of growing length: the ratio falls through 0.5
        old, new = enc(tok, hermes("Try.\n", "a" * k)), enc(tok, hermes("Again.\n", "b" * k))
        ours = saar.replace_turn(old, new, tokenizer=tok, syntax=HERMES)
        official = saar.replace_turn(old, new, tokenizer=tok, syntax=HERMES, sim_eos=True)
        if ours.kind != official.kind:
            flipped = k
            break
    assert flipped is not None and (ours.kind, official.kind) == ("deep", "shallow")
    seg = lambda code: hermes("", code)  # noqa: E731
    assert ours.similarity == difflib.SequenceMatcher(None, seg("a" * k), seg("b" * k)).ratio() < 0.5
    assert official.similarity == difflib.SequenceMatcher(None, seg("a" * k) + "<|im_end|>",
                                                          seg("b" * k) + "<|im_end|>").ratio() >= 0.5
