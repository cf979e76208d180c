"""Synthetic problems for the CPU demo, and warm-up tool-use conversations.

Paper: CLEANER starts from a cold-start SFT model that already calls the Python tool, then runs
GRPO on Open-AgentRL-30K-style math/code data. A tiny CPU model cannot learn from AIME, so this
module is ours, not the paper's: seeded problems that are easy to state, have exact integer answers,
and are tedious or infeasible by hand, so that calling the interpreter pays off. Kinds: counting
primes in a range, digit sums of big powers, linear recurrences mod m, shopping-list totals in
cents, Collatz step counts, and counting integers coprime to m.

- `make_problems(n, seed, difficulty)` -> list[Problem] (task="math", answer = str(int)).
  "warmup" problems use small numbers and few items; "rl" problems are bigger (ranges of 10^5+,
  N up to 10^6, n up to 10^9, discount rules), so naive code hits timeouts, recursion limits and
  slips, and RL still sees failed tool calls for SAAR to purify.
- `make_sft_conversations(n, seed, tool_format, prompt_fn)`: for warm-up problems, a full tool-use
  conversation (user -> assistant with code -> tool output -> assistant with \\boxed{N}). The tool
  output is real: the code is ours and trusted, so it is exec'd in-process and checked against the
  answer. This stands in for the paper's cold-start SFT data (Open-AgentRL-SFT-3K).
- `warmup_conversations(n, seed, tool_format, fix_fraction)`: sft.py's data, those conversations with the
  rollout's prompt and the tool output as RL shows it; a share of them first makes a broken call and
  fixes it after reading the real sandbox's error.

Answers are computed by fast direct methods (segmented sieve, matrix power, inclusion-exclusion);
each problem also carries `meta["reference_code"]`, a plain program that prints the answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from math import isqrt, log10
from typing import Callable

from data.problems import Problem

# ---------------------------------------------------------------------------------------------
# direct answer computations (fast; the tests re-derive every answer by a different method)


def count_primes(lo: int, hi: int) -> int:
    """Number of primes p with lo <= p <= hi (segmented sieve: memory ~ hi - lo, not hi)."""
    lo = max(lo, 2)
    if hi < lo:
        return 0
    r = isqrt(hi)
    small = bytearray([1]) * (r + 1)
    small[0:2] = b"\x00\x00"[: r + 1]
    for i in range(2, isqrt(r) + 1):
        if small[i]:
            small[i * i :: i] = bytes(len(range(i * i, r + 1, i)))
    seg = bytearray([1]) * (hi - lo + 1)
    for p in range(2, r + 1):
        if small[p]:
            start = max(p * p, -(-lo // p) * p)
            seg[start - lo :: p] = bytes(len(range(start, hi + 1, p)))
    return seg.count(1)


def digit_sum(n: int) -> int:
    # chunked, so it works past Python's 4300-digit int->str limit
    s = 0
    while n:
        n, r = divmod(n, 10**18)
        s += sum(map(int, str(r)))
    return s


def recurrence_term(x0: int, x1: int, p: int, q: int, r: int, m: int, n: int) -> int:
    """x_n for x_k = (p x_{k-1} + q x_{k-2} + r) mod m, via a 3x3 matrix power on (x_k, x_{k-1}, 1)."""
    if n == 0:
        return x0 % m

    def mul(a, b):
        return [[sum(a[i][k] * b[k][j] for k in range(3)) % m for j in range(3)] for i in range(3)]

    result = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    base = [[p % m, q % m, r % m], [1, 0, 0], [0, 0, 1]]
    e = n - 1
    while e:
        if e & 1:
            result = mul(result, base)
        base = mul(base, base)
        e >>= 1
    v = (x1 % m, x0 % m, 1)
    return sum(result[0][k] * v[k] for k in range(3)) % m


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def prime_factors(m: int) -> list[int]:
    out, d = [], 2
    while d * d <= m:
        if m % d == 0:
            out.append(d)
            while m % d == 0:
                m //= d
        d += 1
    if m > 1:
        out.append(m)
    return out


def count_coprime(n: int, m: int) -> int:
    """#{1 <= k <= n : gcd(k, m) = 1} by inclusion-exclusion over the distinct primes of m."""
    ps = prime_factors(m)
    total = 0
    for mask in range(1 << len(ps)):
        d, bits = 1, 0
        for i, p in enumerate(ps):
            if mask >> i & 1:
                d *= p
                bits += 1
        total += (-1) ** bits * (n // d)
    return total


def shopping_total(items: list[list], min_qty: int | None, pct: int, ship: int, free_over: int | None) -> int:
    """Total in cents. items: [name, qty, cents]. Lines with qty >= min_qty get pct% off, rounded down
    to whole cents; then `ship` cents of shipping unless the subtotal is at least free_over."""
    sub = 0
    for _, q, c in items:
        line = q * c
        if min_qty is not None and q >= min_qty:
            line = line * (100 - pct) // 100
        sub += line
    if free_over is not None and sub < free_over:
        sub += ship
    return sub


# ---------------------------------------------------------------------------------------------
# generators: (rng, level) -> (kind, text, answer, params, reference code); level is warmup, medium or rl


def _gen_primes(rng: random.Random, level: str):
    hard = level == "rl"
    if hard:
        a = rng.randint(100_000, 3_000_000)
        b = a + rng.randint(20_000, 200_000)
    elif level == "medium":  # naive code is fast enough; counting by hand is not
        a = rng.randint(500, 20_000)
        b = a + rng.randint(1_000, 10_000)
    else:
        a = rng.randint(2, 400)
        b = a + rng.randint(100, 1500)
    text = rng.choice([
        f"How many prime numbers are there between {a} and {b}, inclusive?",
        f"Count the primes p with {a} <= p <= {b}.",
        f"Find the number of primes in the interval [{a}, {b}].",
    ])
    if rng.random() < 0.5:
        code = (f"lo, hi = {a}, {b}\n"
                "sieve = [True] * (hi + 1)\n"
                "sieve[0] = sieve[1] = False\n"
                "for i in range(2, int(hi ** 0.5) + 1):\n"
                "    if sieve[i]:\n"
                "        for j in range(i * i, hi + 1, i):\n"
                "            sieve[j] = False\n"
                "print(sum(sieve[lo:hi + 1]))\n")
    else:
        code = ("def is_prime(k):\n"
                "    if k < 2:\n"
                "        return False\n"
                "    d = 2\n"
                "    while d * d <= k:\n"
                "        if k % d == 0:\n"
                "            return False\n"
                "        d += 1\n"
                "    return True\n\n"
                f"print(sum(1 for k in range({a}, {b} + 1) if is_prime(k)))\n")
    return "primes", text, count_primes(a, b), {"lo": a, "hi": b}, code


def _gen_digit_sum(rng: random.Random, level: str):
    hard = level == "rl"
    if hard:
        a = rng.randint(13, 99)
        e = rng.randint(int(1000 / log10(a)), int(3990 / log10(a)))  # 1000..4000 digits
    elif level == "medium":
        a = rng.randint(2, 30)
        e = rng.randint(40, 300)
    else:
        a = rng.randint(2, 9)
        e = rng.randint(10, 40)
    text = rng.choice([
        f"What is the sum of the decimal digits of {a}^{e}?",
        f"Compute the digit sum of the integer {a}^{{{e}}}.",
        f"Write {a} raised to the power {e} in base 10. What is the sum of its digits?",
    ])
    if rng.random() < 0.5:
        code = f"print(sum(int(c) for c in str({a} ** {e})))\n"
    else:
        code = (f"n = {a} ** {e}\n"
                "total = 0\n"
                "while n > 0:\n"
                "    total += n % 10\n"
                "    n //= 10\n"
                "print(total)\n")
    return "digit_sum", text, digit_sum(a**e), {"base": a, "exp": e}, code


def _gen_recurrence(rng: random.Random, level: str):
    hard = level == "rl"
    if hard:
        m = rng.choice([10**9 + 7, 998_244_353, 1_000_003, rng.randint(100_000, 10**9)])
        n = rng.randint(100_000, 1_000_000)
        p, q, r = rng.randint(2, 99), rng.randint(1, 99), rng.randint(0, 999)
        x0, x1 = rng.randint(0, 999), rng.randint(0, 999)
    elif level == "medium":
        m = rng.randint(1_000, 100_000)
        n = rng.randint(100, 5_000)
        p, q, r = rng.randint(2, 30), rng.randint(1, 30), rng.randint(0, 100)
        x0, x1 = rng.randint(0, 99), rng.randint(0, 99)
    else:
        m = rng.randint(50, 1000)
        n = rng.randint(10, 60)
        p, q, r = rng.randint(2, 9), rng.randint(1, 9), rng.randint(0, 20)
        x0, x1 = rng.randint(0, 9), rng.randint(0, 9)
    text = rng.choice([
        f"A sequence is defined by x_0 = {x0}, x_1 = {x1}, and x_n = ({p} x_(n-1) + {q} x_(n-2) + {r}) mod {m} "
        f"for n >= 2. Find x_{n}.",
        f"Let a(0) = {x0} and a(1) = {x1}. For every n >= 2, a(n) is the remainder of "
        f"{p}*a(n-1) + {q}*a(n-2) + {r} when divided by {m}. What is a({n})?",
    ])
    if rng.random() < 0.5:
        code = (f"prev, cur = {x0}, {x1}\n"
                f"for _ in range(2, {n} + 1):\n"
                f"    prev, cur = cur, ({p} * cur + {q} * prev + {r}) % {m}\n"
                "print(cur)\n")
    else:
        code = (f"x = [{x0}, {x1}]\n"
                f"for k in range(2, {n} + 1):\n"
                f"    x.append(({p} * x[k - 1] + {q} * x[k - 2] + {r}) % {m})\n"
                f"print(x[{n}])\n")
    params = {"x0": x0, "x1": x1, "p": p, "q": q, "r": r, "m": m, "n": n}
    return "recurrence", text, recurrence_term(x0, x1, p, q, r, m, n), params, code


_GOODS = ["notebook", "pen", "mug", "apple", "battery", "candle", "towel", "sticker", "lamp", "scarf",
          "stapler", "plate", "glove", "cable", "brush", "jar of jam", "bar of soap", "pack of tea",
          "box of nails", "roll of tape"]


def _plural(name: str, q: int) -> str:
    if q == 1:
        return name
    if " of " in name:
        head, tail = name.split(" of ", 1)
        return f"{_plural(head, q)} of {tail}"
    if name.endswith("y") and name[-2] not in "aeiou":
        return name[:-1] + "ies"
    return name + ("es" if name.endswith(("x", "sh", "ch")) else "s")


def _dollars(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def _gen_shopping(rng: random.Random, level: str):
    hard = level == "rl"
    k = rng.randint(5, 9) if hard else rng.randint(4, 7) if level == "medium" else rng.randint(2, 4)
    names = rng.sample(_GOODS, k)
    if hard:
        items = [[nm, rng.randint(1, 40), rng.randint(19, 4999)] for nm in names]
        min_qty, pct = rng.randint(5, 15), rng.choice([5, 10, 12, 15, 20, 25, 30])
        ship, free_over = rng.randint(299, 1499), rng.randint(50, 400) * 100
    elif level == "medium":
        items = [[nm, rng.randint(1, 25), rng.randint(49, 4999)] for nm in names]
        min_qty, pct, ship, free_over = None, 0, 0, None
    else:
        items = [[nm, rng.randint(1, 6), rng.randint(49, 999)] for nm in names]
        min_qty, pct, ship, free_over = None, 0, 0, None
    parts = [f"{q} {_plural(nm, q)} at {_dollars(c)} each" for nm, q, c in items]
    listing = ", ".join(parts[:-1]) + " and " + parts[-1]
    text = rng.choice([f"You buy {listing}.", f"A shopping list has {listing}.", f"An order contains {listing}."])
    if hard:
        text += (f" Every line with at least {min_qty} units gets {pct}% off that line's cost, rounded down to "
                 f"the nearest cent. Shipping costs {_dollars(ship)} unless the (discounted) subtotal is at least "
                 f"{_dollars(free_over)}.")
    text += rng.choice([" What is the total cost in cents?", " How many cents does it cost in total?"])
    rows = ",\n".join(f"    ({nm!r}, {q}, {c})" for nm, q, c in items)
    if hard:
        code = (f"items = [\n{rows},\n]  # (name, quantity, price in cents)\n"
                "subtotal = 0\n"
                "for name, qty, cents in items:\n"
                "    line = qty * cents\n"
                f"    if qty >= {min_qty}:\n"
                f"        line = line * {100 - pct} // 100\n"
                "    subtotal += line\n"
                f"if subtotal < {free_over}:\n"
                f"    subtotal += {ship}\n"
                "print(subtotal)\n")
    elif rng.random() < 0.5:
        code = (f"items = [\n{rows},\n]  # (name, quantity, price in cents)\n"
                "print(sum(qty * cents for _, qty, cents in items))\n")
    else:
        code = ("total = 0\n" + "".join(f"total += {q} * {c}  # {nm}\n" for nm, q, c in items) + "print(total)\n")
    params = {"items": items, "min_qty": min_qty, "pct": pct, "ship": ship, "free_over": free_over}
    return "shopping", text, shopping_total(items, min_qty, pct, ship, free_over), params, code


def _gen_collatz(rng: random.Random, level: str):
    hard = level == "rl"
    rule = "replace n by n/2 if n is even and by 3n + 1 if n is odd"
    if hard:
        a, count = rng.randint(10**9, 10**15), rng.randint(50, 200)
        b = a + count - 1
        text = (f"For a positive integer n, repeatedly {rule}, until n = 1; call the number of replacements "
                f"S(n). What is S({a}) + S({a + 1}) + ... + S({b})?")
        code = ("def steps(n):\n"
                "    s = 0\n"
                "    while n != 1:\n"
                "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
                "        s += 1\n"
                "    return s\n\n"
                f"print(sum(steps(n) for n in range({a}, {b} + 1)))\n")
        return "collatz", text, sum(collatz_steps(n) for n in range(a, b + 1)), {"lo": a, "hi": b}, code
    n = rng.randint(10_000, 10**7) if level == "medium" else rng.randint(27, 10_000)
    text = rng.choice([
        f"Start with n = {n} and repeatedly {rule}. How many steps does it take to reach 1?",
        f"In the Collatz process (if n is even, n -> n/2; if odd, n -> 3n + 1), how many steps does "
        f"{n} take to reach 1?",
    ])
    code = (f"n = {n}\n"
            "steps = 0\n"
            "while n != 1:\n"
            "    if n % 2 == 0:\n"
            "        n //= 2\n"
            "    else:\n"
            "        n = 3 * n + 1\n"
            "    steps += 1\n"
            "print(steps)\n")
    return "collatz", text, collatz_steps(n), {"lo": n, "hi": n}, code


def _gen_coprime(rng: random.Random, level: str):
    hard = level == "rl"
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
    if hard:
        while True:  # a few distinct primes, some squared, with m <= 10^5
            ps = rng.sample(primes, rng.randint(3, 5))
            m = 1
            for p in ps:
                m *= p ** rng.choice([1, 1, 2])
            if m <= 100_000:
                break
        n = rng.randint(10**7, 10**9)
    elif level == "medium":
        ps = rng.sample(primes[:8], rng.randint(2, 4))
        m = 1
        for p in ps:
            m *= p
        n = rng.randint(1_000, 100_000)
    else:
        ps = rng.sample(primes[:6], rng.randint(2, 3))
        m = 1
        for p in ps:
            m *= p
        n = rng.randint(50, 1000)
    text = rng.choice([
        f"How many integers k with 1 <= k <= {n} satisfy gcd(k, {m}) = 1?",
        f"Count the positive integers not exceeding {n} that are relatively prime to {m}.",
    ])
    if hard:
        code = ("from itertools import combinations\n"
                "from math import prod\n\n"
                f"n, m = {n}, {m}\n"
                "primes, d, t = [], 2, m\n"
                "while d * d <= t:\n"
                "    if t % d == 0:\n"
                "        primes.append(d)\n"
                "        while t % d == 0:\n"
                "            t //= d\n"
                "    d += 1\n"
                "if t > 1:\n"
                "    primes.append(t)\n"
                "total = 0\n"
                "for r in range(len(primes) + 1):\n"
                "    for c in combinations(primes, r):\n"
                "        total += (-1) ** r * (n // prod(c))\n"
                "print(total)\n")
    else:
        code = ("from math import gcd\n"
                f"print(sum(1 for k in range(1, {n} + 1) if gcd(k, {m}) == 1))\n")
    return "coprime", text, count_coprime(n, m), {"n": n, "m": m}, code


_GENERATORS = (_gen_primes, _gen_digit_sum, _gen_recurrence, _gen_shopping, _gen_collatz, _gen_coprime)
LEVELS = ("warmup", "medium", "rl")  # easy enough to do by hand / naive code works / naive code times out
KINDS = ("primes", "digit_sum", "recurrence", "shopping", "collatz", "coprime")  # same order as above


def make_problems(n: int, seed: int, difficulty: str = "rl", kinds: tuple[str, ...] | None = None) -> list[Problem]:
    """n seeded problems; kinds cycle so any len(kinds) consecutive problems cover every kind (all six by default).

    Each problem gets its own RNG keyed by (difficulty, seed, index), so make_problems(k, s) is a
    prefix of make_problems(n, s) for k <= n, and warm-up and RL sets never share a stream. A subset of
    kinds keeps the same keys, with the index counted within the subset's own cycle.
    """
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty must be one of {LEVELS}, got {difficulty!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown or (kinds is not None and not kinds):
        raise ValueError(f"unknown problem kinds {unknown or '(none given)'}; choose from {KINDS}")
    gens = _GENERATORS if kinds is None else tuple(_GENERATORS[KINDS.index(k)] for k in kinds)
    tag = "" if kinds is None else ":" + ",".join(kinds)
    offset = random.Random(f"synth:{difficulty}:{seed}").randrange(len(gens))
    out = []
    for i in range(n):
        rng = random.Random(f"synth:{difficulty}:{seed}{tag}:{i}")  # str seeds hash deterministically (sha512)
        kind, text, answer, params, code = gens[(offset + i) % len(gens)](rng, difficulty)
        meta = {"kind": kind, "difficulty": difficulty, "params": params, "reference_code": code}
        out.append(Problem(id=f"synth-{difficulty}-{seed}{tag}-{i}", problem=text, answer=str(answer),
                           task="math", tests=None, meta=meta))
    return out


# ---------------------------------------------------------------------------------------------
# warm-up SFT conversations


def default_prompt(problem_text: str) -> str:
    return problem_text + "\n\nYou can run Python code to help. Put your final answer in \\boxed{}."


def run_trusted(code: str) -> str:
    """exec our own generated code in-process and return what it printed (never for model code)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<synth>", "exec"), {"__name__": "__main__"})
    return buf.getvalue()


_PLANS = {
    "primes": ["Counting primes over a range this long by hand is error-prone, so I'll let Python count them.",
               "I need the number of primes from {lo} to {hi}. A short program can test every number in that range."],
    "digit_sum": ["{base}^{exp} has too many digits to expand by hand. Python has exact big integers, so I'll "
                  "compute the power and add up its digits.",
                  "I'll compute {base}**{exp} exactly in Python and sum its decimal digits."],
    "recurrence": ["I'll iterate the recurrence up to index {n}, reducing mod {m} at every step.",
                   "Each term depends only on the previous two, so a simple loop up to n = {n} gives the value."],
    "shopping": ["I'll work in cents to avoid rounding errors: multiply each quantity by its price and add up.",
                 "The total is the sum of quantity times unit price over all items. Integers in cents keep it exact."],
    "collatz": ["I'll simulate the process and count the steps until the value reaches 1.",
                "This is the Collatz map. A loop that applies the rule and counts steps will do it."],
    "coprime": ["I'll count the k in 1..{n} with gcd(k, {m}) = 1 directly.",
                "A direct count with math.gcd over 1..{n} is quick at this size."],
}
_LEADS = ["", "Let me compute this. ", "Plan: ", "Let's use code. "]
_FINALS = [
    "The code prints {a}, so the answer is \\boxed{{{a}}}.",
    "The program's output is {a}.\n\nTherefore, the answer is \\boxed{{{a}}}.",
    "The computation gives {a}. Final answer: \\boxed{{{a}}}",
    "So the result is \\boxed{{{a}}}.",
]


def make_sft_conversations(n: int, seed: int, tool_format: str = "markdown",
                           prompt_fn: Callable[[str], str] = default_prompt) -> list[dict]:
    """n warm-up tool-use conversations: {"id", "answer", "messages": [user, assistant, tool, assistant]}.

    tool_format "markdown": the call is a ```python fenced block; "hermes": Qwen-style
    `<tool_call>\\n{"name": "code_interpreter", "arguments": {"code": ...}}\\n</tool_call>`.
    The tool message holds the code's real stdout (trailing newline stripped). prompt_fn turns the
    problem text into the user message (rollout.py passes its own template).
    """
    if tool_format not in ("markdown", "hermes"):
        raise ValueError(f"tool_format must be 'markdown' or 'hermes', got {tool_format!r}")
    out = []
    for i, p in enumerate(make_problems(n, seed, difficulty="warmup")):
        rng = random.Random(f"sft:{seed}:{i}")
        code = p.meta["reference_code"]
        printed = run_trusted(code).rstrip("\n")
        if printed.strip() != p.answer:
            raise AssertionError(f"{p.id}: reference code printed {printed!r}, expected {p.answer}")
        plan = rng.choice(_LEADS) + rng.choice(_PLANS[p.meta["kind"]]).format(**p.meta["params"])
        call = _call_turn(plan, code, tool_format)
        messages = [
            {"role": "user", "content": prompt_fn(p.problem)},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": printed},
            {"role": "assistant", "content": rng.choice(_FINALS).format(a=p.answer)},
        ]
        out.append({"id": p.id, "answer": p.answer, "messages": messages})
    return out


# Broken first calls for --fix-fraction: each edit gives a real error (NameError, SyntaxError) in the sandbox.
_BREAKS = (
    lambda c: re.sub(r"^(from \S+ )?import [^\n]*\n", "", c, count=1, flags=re.M),  # a dropped import
    lambda c: c.replace("print(", "pirnt(", 1),                                     # a misspelt name
    lambda c: c.replace(":\n", "\n", 1),                                             # a missing colon
    lambda c: c.rstrip("\n")[:-1] + "\n",                                            # an unclosed bracket
)
_FIX_LEADS = ("The code failed with {err}. Here is the corrected version.", "That raised {err}; I'll fix it and run it "
              "again.", "{err}: the code has a mistake. Fixed:", "I'll correct the {err} and run it again.")


def warmup_conversations(n: int, seed: int, tool_format: str, fix_fraction: float = 0.0) -> list[dict]:
    """Generated warm-up conversations with the rollout's user prompt and the tool output as RL shows it.

    With fix_fraction, that share of them first makes a broken call and reads its error exactly as the rollout
    shows it (the real sandbox's text), then calls again with working code: the paper's cold start teaches the
    model to retry after an error, and SAAR has nothing to purify in a model that answers instead."""
    if not 0.0 <= fix_fraction <= 1.0:
        raise ValueError(f"fix_fraction must be in [0, 1], got {fix_fraction}")
    import rollout  # the trainer's own modules: the prompt, the call's parser, the sandbox's text
    import tools
    from sandbox import Sandbox
    convs = make_sft_conversations(n, seed, tool_format=tool_format,
                                   prompt_fn=lambda p: rollout.make_prompt(p, "math", tool_format))
    rng = random.Random(f"sft-fix:{seed}")
    broken = {c["id"] for c in convs if rng.random() < fix_fraction}
    sandbox = None
    try:
        for c in convs:
            msgs = c["messages"]
            call = msgs[1]["content"]
            code = rollout.parse_call(call, tool_format).code
            # make_sft_conversations strips the trailing newline; the sandbox shows raw stdout, so RL sees "42\n"
            msgs[2] = {"role": "tool", "content": run_trusted(code)}
            if c["id"] not in broken:
                continue
            plan = call.partition("\n\n")[0]
            if _call_turn(plan, code, tool_format) != call:
                raise AssertionError(f"{c['id']}: synth's call turn is no longer plan + blank line + call")
            if sandbox is None:
                sandbox = Sandbox(slots=1, timeout_s=4.0)
            for k in rng.sample(range(len(_BREAKS)), len(_BREAKS)):
                bad = _BREAKS[k](code)
                res = tools.ToolResult.from_exec(sandbox.run(bad)) if bad != code else None
                if res is not None and not res.ok:
                    break
            else:
                raise AssertionError(f"{c['id']}: no edit of the reference code fails")
            lead = rng.choice(_FIX_LEADS).format(err=res.exception_type or "an error")
            msgs[1:2] = [{"role": "assistant", "content": _call_turn(plan, bad, tool_format)},
                         {"role": "tool", "content": res.text},
                         {"role": "assistant", "content": _call_turn(lead, code, tool_format)}]
    finally:
        if sandbox is not None:
            sandbox.close()
    return convs


def _call_turn(plan: str, code: str, tool_format: str) -> str:
    """An assistant turn of the warm-up's shape: the plan, a blank line, the call (the rollout's stop marks it)."""
    if tool_format == "markdown":
        return f"{plan}\n\n```python\n{code}```"
    payload = json.dumps({"name": "code_interpreter", "arguments": {"code": code}}, ensure_ascii=False)
    return f"{plan}\n\n<tool_call>\n{payload}\n</tool_call>"


def load_problems(spec: str, *, seed: int, n: int | None) -> list[Problem]:
    """train.py's --train-data/--eval-data: 'synth[-level][:kind,kind,...]' generates n problems (default 4096)
    from this seed ('synth' is the "rl" level); anything else is a named set of data/problems.py or a JSONL path,
    its malformed rows skipped and counted."""
    from data import problems
    if spec.split(":")[0] in ("synth", "synth-medium", "synth-warmup"):
        level, _, kinds = spec.partition(":")
        return make_problems(n or 4096, seed, difficulty={"synth": "rl"}.get(level, level[len("synth-"):]),
                             kinds=tuple(kinds.split(",")) if kinds else None)
    if spec in problems.FILES:
        return problems.load_named(spec, limit=n, on_error="skip")
    return problems.load_jsonl(spec, limit=n, on_error="skip")
