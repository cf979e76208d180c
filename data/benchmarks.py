"""GPQA-Diamond and LiveCodeBench rows -> Problems: one converter per benchmark.

Paper: CLEANER evaluates on GPQA-Diamond and on LiveCodeBench v6 (contests 2025-02..2025-05).
eval.py reads the raw release files at evaluation time and data/download.py writes the same
problems as JSONL; both go through these functions, so a problem has one id, one text and (GPQA)
one gold letter whichever way it was read. Departure: the official code formats each problem
with its own prompt around it; here the text is the problem and its choices or its I/O contract,
and prompt templates stay in rollout.py.

GPQA-Diamond: the four choices of a question are shuffled with an RNG keyed by (seed, Record ID),
so the gold letter is stable across runs and machines, and listed as "A) ...". Its authors ask
that the questions never appear in plain text online: no message here quotes question text.

LiveCodeBench (code_generation_lite): public and private tests are all kept; private tests are
base64(zlib(pickle)), read by an unpickler that refuses anything but plain containers. Problems
with metadata.func_name (LeetCode) are graded by calling Solution().<func_name>; the others read
stdin and write stdout.

eval.py's loaders (load_aime, load_gpqa, load_lcb) read a benchmark's files into these Problems; their errors
name the file, the row and the eval.py flag to fix. eval.py's own records (one line per sampled response) are
read and written here too (read_records, write_records).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import pickle
import random
import re
import zipfile
import zlib
from pathlib import Path

from data.problems import DataError, Problem, load_named

GPQA_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def read_gpqa_rows(path: str | Path, password: str = "deserted-untie-orchid") -> list[dict]:
    """The rows of a GPQA file as dicts of column -> value: the official gpqa_diamond.csv, GPQA's
    password-protected dataset.zip, the hub parquet, or JSONL with the same columns."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GPQA file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            try:
                return [json.loads(line) for line in f if line.strip()]
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {e.lineno}: not JSON") from None
    if suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("gpqa_diamond.csv")]
            if not names:
                raise DataError(f"{path}: no gpqa_diamond.csv inside the zip")
            try:
                data = zf.read(names[0], pwd=password.encode())
            except RuntimeError as e:  # zipfile's "Bad password for file"
                raise DataError(f"{path}: cannot decrypt {names[0]} ({e}); check the zip password") from None
            except NotImplementedError as e:
                raise DataError(f"{path}: {e}; unzip it yourself and pass the CSV") from None
        return list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (`pip install pyarrow`); "
                            "or pass the official CSV or dataset.zip") from None
        return pq.read_table(path).to_pylist()
    raise DataError(f"{path}: unknown GPQA file type {suffix!r}; expected .csv, .jsonl, .parquet or .zip")


def gpqa_problem(row: dict, seed: int = 0, index: int = 1) -> Problem:
    """A GPQA row in the official columns -> Problem(task="gpqa", answer=letter). A row that is
    already converted (`problem` with the choices in it, and `solution` or `answer` a letter) is
    taken as it is. `index` (1-based) names rows without a Record ID. Errors never quote the text."""
    pid = str(row.get("Record ID") or row.get("id") or f"gpqa-{index}")
    meta = {"benchmark": "gpqa", "domain": row.get("High-level domain") or row.get("domain")}
    if "Question" in row:
        for c in GPQA_COLUMNS:
            if not isinstance(row.get(c), str) or not row[c].strip():
                raise DataError(f"missing or empty column {c!r}")
        choices = [row[c].strip() for c in GPQA_COLUMNS[1:]]  # the correct one first, as in the source
        order = list(range(4))
        random.Random(f"{seed}:{pid}").shuffle(order)
        text = row["Question"].strip() + "\n\n" + "\n".join(f"{letter}) {choices[j]}" for letter, j in zip("ABCD", order))
        return Problem(id=pid, problem=text, answer="ABCD"[order.index(0)], task="gpqa", meta=meta)
    if "problem" in row and ("solution" in row or "answer" in row):
        gold = str(row.get("solution") or row.get("answer") or "").strip().upper()
        if gold not in ("A", "B", "C", "D"):
            raise DataError("column 'solution' (or 'answer') must be a letter A-D")
        return Problem(id=pid, problem=str(row["problem"]), answer=gold, task="gpqa", meta=meta)
    raise DataError("expected the official columns ('Question', 'Correct Answer', 'Incorrect Answer 1'..'3') "
                    f"or 'problem' + 'solution'; got {sorted(row)[:8]}")


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles only plain data (str, bytes, numbers, lists, tuples, dicts, sets): any global
    (a class or function, which is how a pickle runs code) is refused."""

    def find_class(self, module, name):
        if module == "builtins" and name in ("set", "frozenset"):
            return {"set": set, "frozenset": frozenset}[name]
        raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}: only plain containers are allowed")


def decode_lcb_tests(field: str | list) -> list[dict]:
    """LiveCodeBench test cases: a JSON list, or (private tests) base64 of zlib of a pickled JSON string."""
    if isinstance(field, list):
        return field
    try:
        return json.loads(field)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(field.encode("utf-8"), validate=False))
    except (ValueError, zlib.error) as e:
        raise DataError(f"test cases are neither JSON nor base64+zlib ({e})") from None
    try:
        obj = _PlainUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise DataError(f"private test cases: {e}") from None
    except Exception as e:
        raise DataError(f"private test cases: not a readable pickle ({type(e).__name__}: {e})") from None
    if isinstance(obj, (bytes, str)):
        obj = json.loads(obj)
    if not isinstance(obj, list):
        raise DataError(f"private test cases: expected a list, got {type(obj).__name__}")
    return obj


def lcb_in_window(row: dict, start: str | None, end: str | None) -> bool:
    """Whether the row's contest date lies in [start, end], bounds as YYYY-MM or YYYY-MM-DD (inclusive)."""
    date = str(row.get("contest_date", ""))
    return (not start or date[:len(start)] >= start) and (not end or date[:len(end)] <= end)


def lcb_problem(row: dict) -> Problem:
    """A code_generation_lite row -> Problem(task="code") with all its tests; DataError names the fault."""
    for key in ("question_id", "question_content", "contest_date", "public_test_cases", "private_test_cases"):
        if key not in row:
            raise DataError(f"missing field {key!r}")
    try:
        cases = decode_lcb_tests(row["public_test_cases"]) + decode_lcb_tests(row["private_test_cases"])
    except json.JSONDecodeError as e:
        raise DataError(f"test cases: {e}") from None
    if not cases:
        raise DataError("no test cases")
    kinds = {c.get("testtype", "stdin") if isinstance(c, dict) else None for c in cases}
    for i, c in enumerate(cases):
        if not isinstance(c, dict) or not isinstance(c.get("input"), str) or not isinstance(c.get("output"), str):
            raise DataError(f"test case {i} must have string 'input' and 'output'")
    cases = [{"input": c["input"], "output": c["output"]} for c in cases]
    meta = row.get("metadata") or "{}"
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except json.JSONDecodeError as e:
        raise DataError(f"metadata: {e}") from None
    starter = (row.get("starter_code") or "").strip()
    if kinds == {"functional"}:
        func = meta.get("func_name")
        if not func:
            raise DataError("functional problem without metadata.func_name")
        for i, c in enumerate(cases):  # undecodable test data fails here, not at grading time
            try:
                [json.loads(line) for line in c["input"].split("\n") if line.strip()]
                json.loads(c["output"])
            except json.JSONDecodeError as e:
                raise DataError(f"functional test case {i} is not JSON ({e})") from None
        tests = {"call": func, "cases": cases}
        text = (row["question_content"].rstrip() + "\n\nComplete this starter code (a `Solution` method), "
                f"in a final ```python block:\n```python\n{starter}\n```")
    elif kinds == {"stdin"}:
        tests = cases
        text = (row["question_content"].rstrip() + "\n\nRead the input from stdin and write the answer to "
                "stdout. Give the whole program in a final ```python block.")
    else:
        raise DataError(f"test types {sorted(map(str, kinds))}; expected all 'stdin' or all 'functional'")
    return Problem(id=str(row["question_id"]), problem=text, answer=None, task="code", tests=tests,
                   meta={"benchmark": "lcb", "title": row.get("question_title"), "platform": row.get("platform"),
                         "difficulty": row.get("difficulty"), "contest_date": row["contest_date"],
                         "starter_code": starter})


# ---------------------------------------------------------------------- eval.py's benchmarks: their Problems, with
# meta["benchmark"] set; `problem` is the text the model sees (GPQA: question and lettered choices; LiveCodeBench:
# statement and I/O contract). A bad file or row is a DataError that names it, and the flag that points at it.

def load_aime(name: str, data_dir: str = "", limit: int = 0) -> list[Problem]:
    try:
        problems = load_named(name, data_dir or None, limit=limit or None, task="math")
    except (FileNotFoundError, DataError) as e:
        raise DataError(f"{name}: {e}") from None
    for p in problems:
        p.meta["benchmark"] = name
    return problems


def load_gpqa(path: str, seed: int = 0, limit: int = 0, password: str = "deserted-untie-orchid") -> list[Problem]:
    """GPQA-Diamond with the choices of each question shuffled by Random(f"{seed}:{record id}")
    (gpqa_problem)."""
    if not path:
        raise DataError("the gpqa benchmark needs --gpqa-path: the official gpqa_diamond.csv, the hub parquet, "
                        "or GPQA's password-protected dataset.zip (it is not bundled: its authors ask that "
                        "the questions not be redistributed)")
    try:
        rows = read_gpqa_rows(path, password)
    except (FileNotFoundError, DataError) as e:
        raise DataError(str(e).replace("the zip password", "--gpqa-zip-password")) from None
    if not rows:
        raise DataError(f"{path}: no rows")
    problems = []
    for i, row in enumerate(rows[:limit or None], start=1):
        try:
            problems.append(gpqa_problem(row, seed, index=i))
        except DataError as e:
            raise DataError(f"{path}: row {i}: {e}") from None
    return problems


def load_lcb(lcb_dir: str, start: str = "2025-02", end: str = "2025-05", limit: int = 0,
             ids: set[str] | None = None) -> list[Problem]:
    """LiveCodeBench problems with start <= contest month <= end (or exactly `ids`, for --score)."""
    if not lcb_dir:
        raise DataError("the lcb benchmark needs --lcb-dir: a folder with LiveCodeBench's test*.jsonl "
                        "release files (livecodebench/code_generation_lite)")
    d = Path(lcb_dir)
    files = sorted(d.glob("test*.jsonl")) if d.is_dir() else []
    if not files:
        raise DataError(f"no LiveCodeBench test*.jsonl files in {d}")
    for m in (start, end):
        if not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", m):
            raise DataError(f"LiveCodeBench window bounds must look like 2025-02 or 2025-02-15, got {m!r}")
    problems, seen = [], set()
    for path in files:
        for where, row in jsonl_rows(path):
            qid = str(row.get("question_id"))
            if qid in seen or (qid not in ids if ids is not None else not lcb_in_window(row, start, end)):
                continue
            try:
                problems.append(lcb_problem(row))
            except DataError as e:
                raise DataError(f"{where}: {e}") from None
            seen.add(qid)
            if limit and len(problems) >= limit:
                return problems
    return problems


def jsonl_rows(path: Path):
    """(file:line, parsed value) for each non-blank line; a line that is not JSON is a DataError naming it."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno})") from None


# ------------------------------------------------------------------- eval.py's records: one line per sampled response
# benchmark, problem_id (LiveCodeBench: question_id), sample_idx (0..n-1), response (the final assistant text, what
# is graded), pred (what the grader extracted: boxed answer, letter or code), gold (null for lcb: its tests are
# re-read by problem_id), correct, num_tool_calls, num_tool_errors (calls whose execution failed), saar (test-time
# SAAR on), meta (free: finish reason, lengths, ...)
_REQUIRED = {"benchmark": str, "problem_id": str, "sample_idx": int, "response": str,
             "num_tool_calls": int, "num_tool_errors": int, "saar": bool}
RECORD_FIELDS = ("benchmark", "problem_id", "sample_idx", "response", "pred", "gold", "correct",
                 "num_tool_calls", "num_tool_errors", "saar", "meta")


def read_records(path: str | Path, tasks: dict[str, str]) -> list[dict]:
    """Read a responses JSONL, checking every line against the fields above; tasks: each benchmark's grader."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"responses file not found: {path}")
    records, seen = [], {}
    for where, rec in jsonl_rows(path):
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        for key, typ in _REQUIRED.items():
            if key not in rec:
                raise DataError(f"{where}: missing field {key!r}")
            if not isinstance(rec[key], typ) or (typ is not bool and isinstance(rec[key], bool)):
                raise DataError(f"{where}: field {key!r} must be {typ.__name__}, got {type(rec[key]).__name__}")
        if rec["benchmark"] not in tasks:
            raise DataError(f"{where}: unknown benchmark {rec['benchmark']!r}; known: {', '.join(tasks)}")
        if tasks[rec["benchmark"]] != "code" and not isinstance(rec.get("gold"), str):
            raise DataError(f"{where}: field 'gold' must be a string for {rec['benchmark']}")
        if rec["num_tool_calls"] < 0 or not 0 <= rec["num_tool_errors"] <= rec["num_tool_calls"]:
            raise DataError(f"{where}: need 0 <= num_tool_errors <= num_tool_calls")
        key = (rec["benchmark"], rec["problem_id"], rec["sample_idx"], rec["saar"])  # --saar both: two of each
        if key in seen:
            raise DataError(f"{where}: duplicate sample {key} (first at {seen[key]})")
        seen[key] = where
        rec.setdefault("meta", {})
        records.append(rec)
    if not records:
        raise DataError(f"{path}: no records")
    return records


def write_records(records: list[dict], path: str | Path) -> None:
    """The records, RECORD_FIELDS of each, as JSONL (the folder made if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({k: rec.get(k) for k in RECORD_FIELDS}, ensure_ascii=False) + "\n" for rec in records)
