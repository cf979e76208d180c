"""Problem sets as JSONL: one problem per line, read into `Problem` records.

Paper: CLEANER trains with GRPO on an Open-AgentRL-30K-style mix of math problems (graded on a
final answer) and code problems (graded by running tests), and evaluates on AIME24/25,
GPQA-Diamond and LiveCodeBench v6. This module reads such sets from JSONL: the real ones in
../shared/data (see its README.md) and whatever data/download.py writes. Departure: the official
code (verl) reads parquet files with chat-formatted prompts; we keep bare problem text here, since
prompt templates belong to rollout.py, and use JSONL so the files can be read and diffed by hand.

Row format (one JSON object per line):
    id       str (or int) - unique within the file
    problem  str          - the problem statement, no prompt template
    answer   str (or int) - required for math rows; optional for code rows
    tests    see below    - present (not null) exactly on code rows
    anything else         - kept in Problem.meta (e.g. level, subject, reference_solution)

Code tests, normalised form (Problem.tests); graders branch on the shape:
    {"functional": src}   src is Python that defines check(candidate) and ends with a call such as
                          `check(Solution().twoSum)` (leetcode_train). The grader never runs src
                          beside the candidate: machinery.lcb.functional_cases turns its asserts into call
                          cases, the sandbox returns the candidate's values and the trainer compares
                          them (a check it cannot convert is an error, never trusted).
                          Neither the solution nor src imports anything: put lcb.LEETCODE_PRELUDE
                          (typing/collections/... star imports, `inf`, ListNode, TreeNode,
                          list_node, tree_node, is_same_list, is_same_tree) first, as the source
                          data's LeetCode graders do.
    {"call": name, "cases": [{"input": str, "output": str}, ...]}
                          function-call tests (LiveCodeBench functional problems): for each case
                          call `Solution().<name>(*args)` (a plain function `<name>` if there is no
                          Solution class), args = one JSON value per line of `input`; the result must
                          equal json.loads(output), tuples counting as lists.
    [{"input": str, "output": str}, ...]
                          stdin/stdout pairs (codeforces): feed `input` on stdin, compare stdout with
                          `output` (graders usually ignore whitespace differences).
All three are validated and copied into exactly these shapes (no other keys, at least one case);
math rows have tests=None.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]

# load_named() names -> file names in the data dir. The first six ship in ../shared/data; the rest
# are what `python data/download.py` writes (it uses this table too, so the names cannot drift).
FILES = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "aime_train": "aime_1983_2023_train.jsonl",
    "math_train": "math_l3to5_train.jsonl",
    "leetcode_train": "leetcode_train.jsonl",
    "codeforces_test": "codeforces_test.jsonl",
    "dapo_math": "dapo_math_17k.jsonl",
    "open_agentrl": "open_agentrl_30k.jsonl",
    "livecodebench": "livecodebench_v6.jsonl",
    "gpqa_diamond": "gpqa_diamond.jsonl",
}

TASKS = ("math", "code")


@dataclass
class Problem:
    id: str
    problem: str  # statement text, no prompt template
    answer: str | None  # reference final answer (math); None for most code problems
    task: str  # "math" or "code"
    tests: dict | list | None = None  # code only, normalised form (see module docstring)
    meta: dict = field(default_factory=dict)  # other row fields, plus "file" and "line" it came from


class DataError(ValueError):
    """A malformed problem row; the message names the file and line when known."""


def _text_field(row: dict, key: str, *, required: bool) -> str | None:
    if key not in row or row[key] is None:
        if required:
            raise DataError(f"missing field {key!r}")
        return None
    v = row[key]
    # ints are accepted for ids/answers because they convert losslessly; floats and bools don't
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str):
        raise DataError(f"field {key!r} must be a string, got {type(v).__name__}")
    if not v.strip():
        raise DataError(f"field {key!r} is empty")
    return v


def _io_cases(cases, where: str) -> list[dict]:
    if not isinstance(cases, list):
        raise DataError(f"field {where!r} must be a list, got {type(cases).__name__}")
    if not cases:
        raise DataError(f"field {where!r} is an empty list")
    out = []
    for i, t in enumerate(cases):
        if not isinstance(t, dict) or set(t) != {"input", "output"}:
            got = sorted(t) if isinstance(t, dict) else type(t).__name__
            raise DataError(f"field '{where}[{i}]' must be an object with keys 'input' and 'output', got {got}")
        for k in ("input", "output"):
            if not isinstance(t[k], str):
                raise DataError(f"field '{where}[{i}].{k}' must be a string, got {type(t[k]).__name__}")
        out.append({"input": t["input"], "output": t["output"]})
    return out


def normalize_tests(tests) -> dict | list:
    """Validate code tests and return a copy in the normalised form; raises DataError naming the fault."""
    if isinstance(tests, list):
        return _io_cases(tests, "tests")
    if not isinstance(tests, dict):
        raise DataError(f"field 'tests' must be an object or a list, got {type(tests).__name__}")
    if set(tests) == {"functional"}:
        src = tests["functional"]
        if not isinstance(src, str) or not src.strip():
            raise DataError("field 'tests.functional' must be a non-empty string of Python source")
        return {"functional": src}
    if set(tests) == {"call", "cases"}:
        name = tests["call"]
        if not isinstance(name, str) or not name.isidentifier():
            raise DataError(f"field 'tests.call' must be a Python identifier, got {name!r}")
        return {"call": name, "cases": _io_cases(tests["cases"], "tests.cases")}
    raise DataError(f"field 'tests' as an object must have the keys ['functional'] or ['call', 'cases'], "
                    f"got {sorted(tests)}")


def problem_from_row(row, task: str | None = None) -> Problem:
    """One parsed JSON row -> Problem. task=None infers it: rows with `tests` are code, others math."""
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} or None, got {task!r}")
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}")
    pid = _text_field(row, "id", required=True)
    text = _text_field(row, "problem", required=True)
    has_tests = row.get("tests") is not None
    inferred = "code" if has_tests else "math"
    if task is not None and task != inferred:
        why = "has 'tests'" if has_tests else "has no 'tests'"
        raise DataError(f"expected a {task} row, but this row {why}")
    if inferred == "math":
        answer, tests = _text_field(row, "answer", required=True), None
    else:
        answer, tests = _text_field(row, "answer", required=False), normalize_tests(row["tests"])
    meta = {k: v for k, v in row.items() if k not in ("id", "problem", "answer", "tests")}
    return Problem(id=pid, problem=text, answer=answer, task=inferred, tests=tests, meta=meta)


def load_jsonl(path: str | Path, task: str | None = None, limit: int | None = None,
               on_error: str = "raise") -> list[Problem]:
    """Read a JSONL problem file. Blank lines are ignored.

    task: None infers math/code per row; "math"/"code" makes a row of the other kind an error.
    limit: stop after this many problems. on_error: "raise" a DataError at the first bad row
    (message `path:line: reason`), or "skip" bad rows and warn once, naming each skipped line.
    Ids must be unique within a file (GRPO groups rollouts by problem id).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} or None, got {task!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "not found"
        raise FileNotFoundError(f"problem file {path} {what}")
    problems: list[Problem] = []
    skipped: list[str] = []
    first_line: dict[str, int] = {}  # id -> line it was first seen on
    nonblank = 0
    with open(path, "rb") as f:  # bytes, so a bad UTF-8 sequence is reported with its line
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(problems) >= limit:
                break
            if not raw.strip():
                continue
            nonblank += 1
            try:
                try:
                    row = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise DataError(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
                except json.JSONDecodeError as e:
                    raise DataError(f"bad JSON: {e.msg} at column {e.colno}") from None
                p = problem_from_row(row, task=task)
                if p.id in first_line:
                    raise DataError(f"duplicate id {p.id!r} (first seen on line {first_line[p.id]})")
            except DataError as e:
                if on_error == "raise":
                    raise DataError(f"{path}:{lineno}: {e}") from None
                skipped.append(f"line {lineno}: {e}")
                continue
            first_line[p.id] = lineno
            p.meta["file"] = path.name
            p.meta["line"] = lineno
            problems.append(p)
    if nonblank == 0 and limit != 0:
        raise DataError(f"{path}: file has no rows")
    if skipped:
        shown = "; ".join(skipped[:20]) + (f"; ... and {len(skipped) - 20} more" if len(skipped) > 20 else "")
        warnings.warn(f"{path}: skipped {len(skipped)} malformed row(s): {shown}", stacklevel=2)
    return problems


def default_data_dir() -> Path:
    """$CLEANER_DATA if set, else ../shared/data next to the repo root if it exists, else ./data_cache."""
    env = os.environ.get("CLEANER_DATA")
    if env:
        return Path(env).expanduser()
    shared = REPO_ROOT.parent / "shared" / "data"
    if shared.is_dir():
        return shared
    return Path.cwd() / "data_cache"


def load_named(name: str, data_dir: str | Path | None = None, limit: int | None = None,
               on_error: str = "raise", task: str | None = None) -> list[Problem]:
    """Load a set by name (a key of FILES) from data_dir (default: default_data_dir()); task as in load_jsonl.

    Note: math_train has two rows with an empty answer (multiple-choice MATH problems whose letter
    answer was lost upstream); load it with on_error="skip" to drop them with a warning.
    """
    if name not in FILES:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(FILES)}")
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    path = d / FILES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"data set {name!r}: {path} not found. Point $CLEANER_DATA (or data_dir) at the folder that "
            f"holds {FILES[name]}, or fetch it with `python data/download.py --sets ... --out {d}`")
    return load_jsonl(path, task=task, limit=limit, on_error=on_error)


def stratified(order: list[int], strata: list) -> list[int]:
    """The permutation `order`, reordered so that its strata come in turn (in the order each first appears),
    each keeping its own order; when one runs out the others go on. order: indices into strata."""
    queues: dict = {}
    for i in order:
        queues.setdefault(strata[i], []).append(i)
    out, depth = [], 0
    while len(out) < len(order):
        out += [q[depth] for q in queues.values() if depth < len(q)]
        depth += 1
    return out


def training_order(train_set: list[Problem], d, seed: int, log, prompt_len, drop_long: bool = True):
    """(the training problems, the order train.py takes them in: indices into them). d: the run's config.Data.
    Problems whose prompt (prompt_len tokens) is longer than d.max_prompt_tokens are dropped and counted, as the
    official recipe does at load time; then one seeded permutation (veRL's sampler), with --data-order
    stratified the kinds in turn, cut to --train-size (a pool the run passes over more than once)."""
    if d.max_prompt_tokens and drop_long:
        n_all = len(train_set)
        train_set = [p for p in train_set if prompt_len(p) <= d.max_prompt_tokens]
        if len(train_set) < n_all:
            log(f"data: dropped {n_all - len(train_set)} of {n_all} training problems whose prompt is longer "
                f"than --max-prompt-tokens {d.max_prompt_tokens}")
        if not train_set:
            raise SystemExit(f"--train-data {d.train_data}: every prompt is longer than --max-prompt-tokens "
                             f"{d.max_prompt_tokens}")
    order = np.random.default_rng(seed).permutation(len(train_set)).tolist()
    if d.data_order == "stratified":  # every third of a run has the same mix of kinds
        order = stratified(order, [p.meta.get("kind") or p.task for p in train_set])
    if d.train_size:
        if d.train_size > len(order):
            log(f"data: --train-size {d.train_size} is more than the {len(order)} training problems of "
                f"{d.train_data}: training on all of them")
        order = order[:d.train_size]
    return train_set, order
