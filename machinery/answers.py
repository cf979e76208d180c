"""machinery/answers.py: the answer a response gives, as text (reward.py grades it): the last \\boxed{} (math), the
option letter (GPQA), the final fenced python block (code); and one key for equivalent plain numbers. Pure string
work, no project module: which extraction counts, and how it is compared with the gold answer, is reward.py's.
"""
from __future__ import annotations

import re
from fractions import Fraction


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def box_content(text: str, start: int) -> str | None:
    """Content of the box whose command ends at `start`; None if its braces never close."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        depth, j = 0, i
        while j < len(text):
            c = text[j]
            if c == "\\":  # \{ and \} are literal braces: skip the escaped character
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1:j]
            j += 1
        return None
    # `\boxed 5` (no braces): the next token, up to whitespace or a closing `$`
    m = re.match(r"[^\s$]+", text[i:])
    return m.group(0).rstrip(".,;") if m else None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed X` in text, braces balanced.

    The last box is the model's final word (it overrides earlier boxes, e.g. a late correction).
    Empty boxes are skipped (a restated instruction "put it in \\boxed{}" is not an answer); a last box
    whose braces never close (a truncated response) gives None rather than an older box.
    """
    if not isinstance(text, str):
        return None
    for m in reversed(list(_BOX_RE.finditer(text))):
        content = box_content(text, m.end())
        if content is None:
            return None
        content = content.strip()
        if not content:
            continue
        inner = extract_boxed(content) if _BOX_RE.match(content) else None  # \boxed{\boxed{5}}
        return inner if inner else content
    return None


_DEGREE_RE = re.compile(r"(\^\s*\{?\s*\\circ\s*\}?|°|\\degree)$")
_FRAC_RE = re.compile(r"^([+-]?)\\[dt]?frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))$")


def as_number(s: str) -> Fraction | None:
    """Exact value of a plain numeric answer ("033", "1,000", "0.5", "\\frac{3}{4}", "336^\\circ"), else None."""
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\[!,;: ]|~", "", s)  # LaTeX spacing, also used as a thousands separator
    s = s.replace("{,}", ",")
    s = _DEGREE_RE.sub("", s).strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", s):
        return Fraction(s[:-1] if s.endswith(".") else s)
    m = re.fullmatch(r"([+-]?\d+)\s*/\s*(\d+)", s)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    m = _FRAC_RE.match(s)
    if m:
        num, den = int(m.group(2) or m.group(3)), int(m.group(4) or m.group(5))
        if den == 0:
            return None
        return (-1 if m.group(1) == "-" else 1) * Fraction(num, den)
    return None


def squash(s: str) -> str:
    """An answer with its whitespace and $ signs gone, \\dfrac and \\tfrac read as \\frac."""
    return re.sub(r"\s+", "", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").strip("$")


def answer_key(pred: str) -> str:
    """One key for equivalent plain answers, so that they vote together (eval.py's maj@n): "033" and "33"
    share one, as do "0.5" and "\\frac12"."""
    v = as_number(pred)
    return str(v) if v is not None else squash(pred)


_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")
_BOXED_LETTER_RE = re.compile(r"(?:(?:option|choice)\s*)?[\(\[]?\s*([A-Da-d])\s*[\)\]]?(?![A-Za-z])", re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(
    r"answer\s*(?:is)?\s*[:：]?\s*\**\s*(?:option|choice)?\s*[\(\[]?\s*([A-D])(?![A-Za-z])", re.IGNORECASE)


def extract_choice(text: str) -> str | None:
    """The option letter (A-D) the response chose: the letter in the last \\boxed{} (\\text{} and
    parentheses stripped), else the last `Answer: X` (upper-case X, so "answer is a bit" is not A)."""
    if not isinstance(text, str):
        return None
    boxed = extract_boxed(text)
    if boxed is not None:
        s = boxed
        for _ in range(3):  # nested wrappers, e.g. \text{\textbf{B}}
            s = _TEXT_WRAP_RE.sub(r"\1", s)
        m = _BOXED_LETTER_RE.match(s.strip().strip("$").strip())
        if m:
            return m.group(1).upper()
    hits = [m.group(1) for m in _ANSWER_LINE_RE.finditer(text) if m.group(1).isupper()]
    return hits[-1] if hits else None


_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The final fenced python block of text (```python / ```py / ```python3), else the final
    unlabeled block; None if there is none. An unclosed final fence (a truncated response) is ignored."""
    if not isinstance(text, str):
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]
    for wanted in (("python", "py", "python3"), ("",)):
        for lang, body in reversed(blocks):
            if lang in wanted and body.strip():
                return body
    return None
