"""Download the public training and evaluation sets and convert them to our JSONL format.

Paper: CLEANER trains on the Open-AgentRL-30K mix (Gen-Verse/Open-AgentRL-30K: DAPO-Math,
MegaScience and Skywork-OR1 math/code rows) and evaluates on AIME24/25, GPQA-Diamond and
LiveCodeBench v6. This script fetches those, plus MATH levels 3-5 and DAPO-Math-17k on their own,
and writes one file per set in the format data/problems.py reads (file names from problems.FILES).
Departures: the official code (verl) keeps parquet files with chat prompts baked in; we strip
prompt templates (rollout.py owns prompts) and turn every kind of code test into the normalised
test shapes of problems.py. LiveCodeBench v6: problems of release v6's file (test6.jsonl) with
contest dates 2025-02..2025-05, the window eval.py uses; change with --lcb-files/--lcb-start/--lcb-end.
The raw LiveCodeBench files are also copied to <out>/livecodebench/, the folder eval.py's --lcb-dir
wants. GPQA-Diamond and LiveCodeBench rows are converted by data/benchmarks.py, the converters eval.py
uses, so ids, problem texts and gold letters are the same either way.

    python data/download.py --sets aime24,aime25,math --out DIR
    python data/download.py --sets gpqa --gpqa-file gpqa_diamond.csv --out DIR
    python data/download.py --templates --out DIR   # the official prompts, as DIR/prompts/official_*.json

Needs network access, and `pip install datasets` for the parquet-backed sets (imported lazily).
The download step is kept thin; all conversion lives in pure `convert_<name>(rows)` functions that
tests run on small fixture rows. Rows a converter cannot use are dropped with one warning giving
counts and row indices only.

GPQA-Diamond: its authors ask that the questions never appear in plain text online. We read a CSV
the user provides or the gated hub set (Idavidrein/gpqa, needs a token), never print question
text, and refuse to write the file inside this repository unless git ignores that folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as `python data/download.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.problems import FILES, REPO_ROOT, DataError, problem_from_row  # noqa: E402
from data.benchmarks import gpqa_problem, lcb_in_window, lcb_problem, read_gpqa_rows  # noqa: E402

# CLI set name -> load_named() name (and so the output file name)
SETS = {
    "aime24": "aime24",
    "aime25": "aime25",
    "math": "math_train",
    "dapo": "dapo_math",
    "open_agentrl": "open_agentrl",
    "livecodebench": "livecodebench",
    "gpqa": "gpqa_diamond",
}
AIME24_REPO = "Maxwell-Jia/AIME_2024"  # columns ID, Problem, Solution, Answer (as Open-AgentRL's eval)
AIME25_REPO = "yentinglin/aime_2025"  # columns id, problem, solution, answer, url, year
MATH_REPO = "EleutherAI/hendrycks_math"  # one config per subject; problem, level, type, solution
MATH_CONFIGS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus")
DAPO_REPO = "BytedTsinghua-SIA/DAPO-Math-17k"  # verl rows: data_source, prompt, ability, reward_model, extra_info
OPEN_AGENTRL_REPO = "Gen-Verse/Open-AgentRL-30K"  # verl rows, math and code mixed
LCB_REPO = "livecodebench/code_generation_lite"  # test.jsonl ... test6.jsonl, one per release
GPQA_REPO, GPQA_FILE = "Idavidrein/gpqa", "gpqa_diamond.csv"


# ---------------------------------------------------------------------------------------------
# small pure helpers


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or `\\boxed 5`) in text, braces balanced."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    if text.startswith("\\boxed ", i):
        return text[i + len("\\boxed "):].split("$")[0].strip() or None
    j = text.find("{", i)
    if j < 0 or text[i:j].strip() not in ("\\boxed", "\\fbox"):
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k].strip() or None
    return None


def _get(row: dict, *keys):
    """The first of keys present in row (hub copies of a set disagree on capitalisation)."""
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    raise KeyError(f"none of the columns {keys} present (have {sorted(row)})")


def _json_or_value(v):
    # verl parquet columns are sometimes dicts and sometimes the same dict as a JSON string
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def normalize_aime_answer(ans) -> str:
    s = str(ans).strip().strip("$")
    for deg in ("^\\circ", "^{\\circ}", "°"):
        s = s.replace(deg, "")
    n = int(s)  # ValueError on non-integers, which the caller reports
    if not 0 <= n <= 999:
        raise ValueError(f"AIME answer {n} outside 0..999")
    return str(n)


_DAPO_HEAD = "Solve the following math problem step by step."
_DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'
_BOXED_TAILS = ("Let's think step by step and output the final answer within \\boxed{}.",
                "Please reason step by step, and put your final answer within \\boxed{}.")


def strip_math_template(text: str) -> str:
    """Problem text without the DAPO answer-format wrapper or a trailing 'put it in \\boxed{}' line."""
    t = text.strip()
    if t.startswith(_DAPO_HEAD) and "\n\n" in t:
        t = t.split("\n\n", 1)[1]
    t = t.split(_DAPO_TAIL.strip(), 1)[0]
    for tail in _BOXED_TAILS:
        if t.rstrip().endswith(tail):
            t = t.rstrip()[: -len(tail)]
    return t.strip()


def _user_text(prompt) -> str:
    prompt = _json_or_value(prompt)
    if isinstance(prompt, str):
        return prompt
    for m in prompt:
        if m.get("role") == "user":
            return m["content"]
    raise ValueError("prompt has no user message")


def call_cases(arg_lists: list, outputs: list) -> list[dict]:
    """Function-call test cases in the {"call", "cases"} shape: input = one JSON value per line."""
    return [{"input": "\n".join(json.dumps(a) for a in args), "output": json.dumps(want)}
            for args, want in zip(arg_lists, outputs)]


def _lines(v) -> str:
    return "\n".join(map(str, v)) if isinstance(v, list) else str(v)


def tests_from_ground_truth(gt) -> dict | list:
    """Open-AgentRL / Skywork-OR1 / TACO code ground truth -> normalised tests. Handles
    {"import_prefix", "test_code", "entry_point"} (check(candidate) asserts -> "functional"),
    {"inputs", "outputs", "fn_name"} (call-based -> "call"), {"inputs", "outputs"} (stdin/stdout
    pairs), and a list of {"input", "output"}."""
    gt = _json_or_value(gt)
    if isinstance(gt, dict) and "test_code" in gt:
        src = gt.get("import_prefix", "") + gt["test_code"].rstrip() + f"\n\n\ncheck({gt['entry_point']})\n"
        return {"functional": src}
    if isinstance(gt, dict) and "inputs" in gt and "outputs" in gt:
        ins, outs = gt["inputs"], gt["outputs"]
        if len(ins) != len(outs) or not ins:
            raise ValueError(f"{len(ins)} inputs but {len(outs)} outputs")
        if gt.get("fn_name"):
            args = [a if isinstance(a, list) else [a] for a in ins]
            # TACO/APPS wrap each expected return value in a one-element list (their grader also
            # accepts the unwrapped value); unwrap when every output of the problem is so wrapped
            if all(isinstance(w, list) and len(w) == 1 for w in outs):
                outs = [w[0] for w in outs]
            return {"call": gt["fn_name"], "cases": call_cases(args, outs)}
        return [{"input": _lines(a), "output": _lines(w)} for a, w in zip(ins, outs)]
    if isinstance(gt, list) and gt and all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in gt):
        return [{"input": str(t["input"]), "output": str(t["output"])} for t in gt]
    raise ValueError(f"unrecognised code ground truth ({type(gt).__name__})")


def _math_answers(gt) -> list[str]:
    # Skywork-style ground truth is a JSON list of accepted strings ('["72"]'); anything else is the
    # answer itself ("1.50" and "[1, 2]" must stay as written, so no general JSON decoding)
    if isinstance(gt, str):
        try:
            parsed = json.loads(gt)
        except json.JSONDecodeError:
            parsed = None
        ok = isinstance(parsed, list) and parsed and all(isinstance(a, str) for a in parsed)
        return parsed if ok else [gt]
    if isinstance(gt, list) and gt:
        return [str(a) for a in gt]
    return [str(gt)]


def _warn_skipped(name: str, skipped: list[str]) -> None:
    if skipped:
        shown = "; ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(f"{name}: dropped {len(skipped)} row(s): {shown}", stacklevel=3)


# ---------------------------------------------------------------------------------------------
# converters: hub rows (list of dicts, real column names) -> our JSONL rows


def convert_aime(rows: list[dict], prefix: str) -> list[dict]:
    """AIME rows (ID/Problem/Answer or id/problem/answer) -> {id: "<prefix>-<i>", problem, answer}."""
    out, skipped = [], []
    for i, r in enumerate(rows):
        try:
            row = {"id": f"{prefix}-{i}", "problem": str(_get(r, "problem", "Problem", "question")).strip(),
                   "answer": normalize_aime_answer(_get(r, "answer", "Answer"))}
        except (KeyError, ValueError) as e:
            skipped.append(f"row {i}: {e}")
            continue
        if "ID" in r or "id" in r:
            row["source_id"] = str(r.get("ID", r.get("id")))
        out.append(row)
    _warn_skipped(prefix, skipped)
    return out


def convert_math(rows: list[dict], levels=(3, 4, 5)) -> list[dict]:
    """MATH rows (problem, level "Level 5", type, solution) -> {id, problem, answer, level, subject};
    answer = last \\boxed{} of the solution; rows outside `levels` are left out."""
    out, skipped = [], []
    for i, r in enumerate(rows):
        try:
            level = int(str(r["level"]).replace("Level", "").strip())
        except ValueError:
            skipped.append(f"row {i}: level {r['level']!r}")
            continue
        if level not in levels:
            continue
        answer = last_boxed(r["solution"])
        if answer is None:
            skipped.append(f"row {i}: no \\boxed answer in solution")
            continue
        out.append({"id": f"math35-{len(out)}", "problem": r["problem"].strip(), "answer": answer,
                    "level": level, "subject": r["type"]})
    _warn_skipped("math", skipped)
    return out


def convert_dapo(rows: list[dict]) -> list[dict]:
    """DAPO-Math-17k verl rows -> {id, problem, answer, data_source}. The hub copy repeats each
    problem many times; duplicates (same text) are dropped, keeping the first."""
    out, skipped, seen = [], [], set()
    for i, r in enumerate(rows):
        try:
            text = strip_math_template(_user_text(r["prompt"]))
            answer = str(_json_or_value(r["reward_model"])["ground_truth"]).strip()
        except (KeyError, TypeError, ValueError) as e:
            skipped.append(f"row {i}: {e!r}")
            continue
        if text in seen:
            continue
        seen.add(text)
        idx = (_json_or_value(r.get("extra_info")) or {}).get("index")
        out.append({"id": f"dapo-{idx}" if idx is not None else f"dapo-{i}", "problem": text, "answer": answer,
                    "data_source": r.get("data_source", "math_dapo")})
    _warn_skipped("dapo", skipped)
    return out


def convert_open_agentrl(rows: list[dict]) -> list[dict]:
    """Open-AgentRL-30K verl rows -> math rows {id, problem, answer} and code rows {id, problem, tests}.
    Like the official reward function, a row is code iff its data_source contains "code"."""
    out, skipped = [], []
    for i, r in enumerate(rows):
        source = str(r.get("data_source", ""))
        try:
            text = _user_text(r["prompt"])
            gt = _json_or_value(r["reward_model"])["ground_truth"]
            row = {"id": f"oarl-{i}", "data_source": source}
            if "code" in source.lower():
                row.update(problem=text.strip(), tests=tests_from_ground_truth(gt))
            else:
                answers = _math_answers(gt)
                row.update(problem=strip_math_template(text), answer=answers[0].strip())
                if len(answers) > 1:
                    row["answers"] = answers  # several accepted forms; graders may try each
            if r.get("ability"):
                row["ability"] = r["ability"]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            skipped.append(f"row {i} ({source}): {e!r}")
            continue
        out.append(row)
    _warn_skipped("open_agentrl", skipped)
    return out


def _problem_row(p) -> dict:
    """A Problem as a JSONL row data/problems.py reads back: id, problem, answer, tests, then its meta."""
    row = {"id": p.id, "problem": p.problem, "answer": p.answer}
    if p.tests is not None:
        row["tests"] = p.tests
    return {**row, **p.meta}


def convert_livecodebench(rows: list[dict], start: str | None = None, end: str | None = None) -> list[dict]:
    """code_generation_lite rows -> problem rows, as eval.py reads them (data/benchmarks.py): all
    tests kept, LeetCode problems as {"call": func_name, "cases"}, the others as stdin/stdout pairs.
    start/end: inclusive bounds on the contest date, as YYYY-MM or YYYY-MM-DD. Bad rows are skipped
    with a warning naming them."""
    out, skipped = [], []
    for i, r in enumerate(rows):
        if not lcb_in_window(r, start, end):
            continue
        try:
            out.append(_problem_row(lcb_problem(r)))
        except DataError as e:
            skipped.append(f"row {i} ({r.get('question_id', '?')}): {e}")
    _warn_skipped("livecodebench", skipped)
    return out


def convert_gpqa(rows: list[dict], seed: int = 0) -> list[dict]:
    """GPQA rows (Question, Correct Answer, Incorrect Answer 1-3, Record ID, ...) -> problem rows with
    the choices shuffled and a gold letter, exactly as eval.py shuffles them (data/benchmarks.py).
    Messages never quote question text."""
    out, skipped = [], []
    for i, r in enumerate(rows, start=1):
        try:
            out.append(_problem_row(gpqa_problem(r, seed, index=i)))
        except DataError as e:
            skipped.append(f"row {i} (record {r.get('Record ID', '?')}): {e}")
    _warn_skipped("gpqa", skipped)
    return out


# The official prompts are built in the official recipe's dataset code, which --templates reads at a pinned
# commit (never run) and turns into --prompt-template files; the project itself does not carry them.
OFFICIAL_REPO, OFFICIAL_COMMIT = "Tianshi-Xu/Open-CLEANER", "91e40ad70b48320ea8db5716bb86292b4e187f4c"
OFFICIAL_PROMPT_FILE = "recipe/cleaner/reward.py"
# (dataset class, method, branch of its if) -> (our template file, task). The tool classes' prompts, and the
# no-tool baseline's (CustomRLHFDataset_notool); "eval" builds AIME, GPQA and LiveCodeBench prompts, "train"
# the training mix's (its Skywork-style rows: code when the source is code, else math)
OFFICIAL_PROMPT_ROLES = {
    (cls, "map_fn", None): (f"eval{tag}", "math") for cls, tag in
    (("CustomRLHFDataset", ""), ("CustomRLHFDataset_notool", "_notool"))} | {
    (cls, method, branch): (f"{file}{tag}", task)
    for cls, tag in (("CustomRLHFDataset", ""), ("CustomRLHFDataset_notool", "_notool"))
    for method, branch, file, task in (("map_fn_gpqa", None, "eval", "gpqa"), ("map_lcb", None, "eval", "code"),
                                       ("map_fn_skywork", "else", "train", "math"),
                                       ("map_fn_skywork", "if", "train", "code"))}
# names in the official expressions: the problem text, and GPQA's domain (a field of our problem's meta)
OFFICIAL_PLACEHOLDERS = {"problem": "{problem}", "content": "{problem}", "domain": "{domain}"}
# per-problem parts built from the official data, left out: LiveCodeBench's examples (our problem text, the
# statement, carries them)
OFFICIAL_LEFT_OUT = {"public_examples"}


def _render(node, names: dict[str, str]) -> str:
    """The text a string expression of the official code builds: literals, f-strings and + of named strings."""
    import ast
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _render(node.left, names) + _render(node.right, names)
    if isinstance(node, ast.JoinedStr):
        return "".join(_render(v.value if isinstance(v, ast.FormattedValue) else v, names) for v in node.values)
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        if node.id in OFFICIAL_PLACEHOLDERS:
            return OFFICIAL_PLACEHOLDERS[node.id]
        if node.id in OFFICIAL_LEFT_OUT:
            return ""
        raise ValueError(f"unknown name {node.id!r}")
    raise ValueError(f"not a string expression: {ast.dump(node)[:60]}")


def _prompt_assigned(stmts: list, names: dict[str, str]) -> str | None:
    """The last prompt text a block assigns (to `prompt` or to row["prompt"][0]["content"]), its local strings
    tracked; None when it assigns none."""
    import ast
    names, found = dict(names), None
    for st in stmts:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            continue
        target = st.targets[0]
        if isinstance(target, ast.Name) and target.id != "prompt":
            try:
                names[target.id] = _render(st.value, names)
            except ValueError:
                pass  # not a string (row fields, parsed JSON)
        elif isinstance(target, ast.Name) or "prompt" in ast.unparse(target):
            found = _render(st.value, names)
    return found


def official_templates(source: str) -> dict[str, dict[str, str]]:
    """The official prompts as --prompt-template files, from the source of the official recipe's dataset code
    (OFFICIAL_PROMPT_FILE), read with `ast` and never run. Pure. Returns {file: {task: template}} for the
    files eval, train, eval_notool and train_notool (OFFICIAL_PROMPT_ROLES): each template is the official
    text with {problem} where the problem goes and {domain} where GPQA's domain goes (rollout.make_prompt fills
    both). Departures: LiveCodeBench's list of examples, which the official code builds from its data, is left
    out (our problem text, the statement, carries them), and a training row's own prompt, which the official
    code extends, is our problem text (download strips the rows' templates). A changed official file raises
    ValueError naming what it could not read."""
    import ast
    tree = ast.parse(source)
    names = {}
    for st in tree.body:  # the module's named strings
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            try:
                names[st.targets[0].id] = _render(st.value, names)
            except ValueError:
                pass
    methods = {(c.name, f.name): f for c in tree.body if isinstance(c, ast.ClassDef)
               for f in c.body if isinstance(f, ast.FunctionDef)}
    out: dict[str, dict[str, str]] = {}
    for (cls, method, branch), (file, task) in OFFICIAL_PROMPT_ROLES.items():
        f = methods.get((cls, method))
        if f is None:
            raise ValueError(f"{OFFICIAL_PROMPT_FILE}: no {cls}.{method}")
        try:
            if branch is None:
                text = _prompt_assigned(f.body, names)
            else:
                test = next(st for st in f.body if isinstance(st, ast.If))
                text = _prompt_assigned(test.body if branch == "if" else test.orelse, names)
        except (ValueError, StopIteration) as e:
            raise ValueError(f"{OFFICIAL_PROMPT_FILE}: {cls}.{method}: {e or 'no if'}") from None
        if text is None or "{problem}" not in text:
            raise ValueError(f"{OFFICIAL_PROMPT_FILE}: {cls}.{method} builds no prompt around the problem")
        out.setdefault(file, {})[task] = text
    return out


# ---------------------------------------------------------------------------------------------
# thin download layer (network; lazy imports)


def _hub_rows(repo: str, config: str | None = None, split: str = "train") -> list[dict]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise SystemExit("this set needs the `datasets` package: pip install datasets") from None
    return [dict(r) for r in load_dataset(repo, config, split=split)]


def _hub_file(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset"))


def _read_jsonl_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _git_ignored(path: Path) -> bool:
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", str(path)], capture_output=True)
    except OSError:
        return False
    return r.returncode == 0


def check_gpqa_destination(path: Path) -> None:
    """GPQA text must never be committed: refuse an output file inside the repo that git would track."""
    path = Path(path).resolve()
    if path.is_relative_to(REPO_ROOT) and not _git_ignored(path):
        raise SystemExit(f"refusing to write GPQA questions to {path}: it is inside the repository and not "
                         "git-ignored. Use an --out folder outside the repo (or one listed in .gitignore).")


def write_jsonl(rows: list[dict], path: Path) -> None:
    """Validate every row with the loader's own checks, then write atomically."""
    seen = set()
    for i, row in enumerate(rows):
        try:
            p = problem_from_row(row)
        except DataError as e:
            raise DataError(f"{path.name}: converted row {i}: {e}") from None
        if p.id in seen:
            raise DataError(f"{path.name}: converted row {i}: duplicate id {p.id!r}")
        seen.add(p.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def download_templates(out_dir: str | Path) -> list[Path]:
    """Fetch the official prompt code at OFFICIAL_COMMIT and write <out_dir>/prompts/official_<file>.json, one
    --prompt-template file each (official_templates). Returns the paths."""
    import urllib.request
    url = f"https://raw.githubusercontent.com/{OFFICIAL_REPO}/{OFFICIAL_COMMIT}/{OFFICIAL_PROMPT_FILE}"
    with urllib.request.urlopen(url, timeout=60) as r:
        source = r.read().decode("utf-8")
    paths = []
    for file, templates in official_templates(source).items():
        path = Path(out_dir) / "prompts" / f"official_{file}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(templates, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def download(name: str, out_dir: str | Path, *, gpqa_file: str | None = None, lcb_files=("test6.jsonl",),
             lcb_dir: str | None = None, lcb_start: str | None = "2025-02", lcb_end: str | None = "2025-05",
             math_levels=(3, 4, 5), seed: int = 0) -> Path:
    """Fetch one set (a key of SETS), convert it and write <out_dir>/<FILES[...]>. Returns the path."""
    if name not in SETS:
        raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")
    out_dir = Path(out_dir)
    path = out_dir / FILES[SETS[name]]
    if name == "aime24":
        rows = convert_aime(_hub_rows(AIME24_REPO), "aime24")
    elif name == "aime25":
        rows = convert_aime(_hub_rows(AIME25_REPO), "aime25")
    elif name == "math":
        rows = convert_math([r for c in MATH_CONFIGS for r in _hub_rows(MATH_REPO, c)], levels=math_levels)
    elif name == "dapo":
        rows = convert_dapo(_hub_rows(DAPO_REPO))
    elif name == "open_agentrl":
        rows = convert_open_agentrl(_hub_rows(OPEN_AGENTRL_REPO))
    elif name == "livecodebench":
        files = [Path(lcb_dir) / f for f in lcb_files] if lcb_dir else [_hub_file(LCB_REPO, f) for f in lcb_files]
        rows = convert_livecodebench([r for f in files for r in _read_jsonl_rows(f)], lcb_start, lcb_end)
        raw_dir = out_dir / "livecodebench"
        if not lcb_dir or Path(lcb_dir).resolve() != raw_dir.resolve():
            raw_dir.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, raw_dir / f.name)
    else:  # gpqa
        check_gpqa_destination(path)
        raw = read_gpqa_rows(gpqa_file or _hub_file(GPQA_REPO, GPQA_FILE))
        rows = convert_gpqa(raw, seed=seed)
    if not rows:
        raise SystemExit(f"{name}: no usable rows after conversion; nothing written")
    write_jsonl(rows, path)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Download public problem sets into our JSONL format.")
    ap.add_argument("--sets", default="", help=f"comma-separated, from: {','.join(SETS)}")
    ap.add_argument("--templates", action="store_true",
                    help="also write the official prompts as --prompt-template files to <out>/prompts/ (from "
                         f"{OFFICIAL_REPO}@{OFFICIAL_COMMIT[:7]})")
    ap.add_argument("--out", default=None, help="output folder (default: $CLEANER_DATA, else ./data_cache)")
    ap.add_argument("--gpqa-file", default=None, help="local GPQA-Diamond CSV/JSONL instead of the gated hub set")
    ap.add_argument("--lcb-files", default="test6.jsonl", help="LiveCodeBench release files (comma-separated)")
    ap.add_argument("--lcb-dir", default=None, help="read the LiveCodeBench files from this local folder")
    ap.add_argument("--lcb-start", default="2025-02", help="first LiveCodeBench contest month/day kept (YYYY-MM[-DD])")
    ap.add_argument("--lcb-end", default="2025-05", help="last LiveCodeBench contest month/day kept (YYYY-MM[-DD])")
    ap.add_argument("--math-levels", default="3,4,5")
    ap.add_argument("--seed", type=int, default=0, help="GPQA choice-shuffle seed")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    bad = [s for s in names if s not in SETS]
    if bad or not (names or args.templates):
        ap.error(f"unknown set(s) {bad}; choose from {', '.join(SETS)} (or pass --templates)")
    out = Path(args.out) if args.out else Path(os.environ.get("CLEANER_DATA") or "data_cache")
    if args.templates:
        for path in download_templates(out):
            print(f"templates: wrote {path} (use it as --prompt-template)")
    for name in names:
        path = download(name, out, gpqa_file=args.gpqa_file, lcb_files=tuple(args.lcb_files.split(",")),
                        lcb_dir=args.lcb_dir, lcb_start=args.lcb_start, lcb_end=args.lcb_end,
                        math_levels=tuple(int(x) for x in args.math_levels.split(",")), seed=args.seed)
        with open(path, encoding="utf-8") as f:
            n = sum(1 for line in f if line.strip())
        print(f"{name}: wrote {n} problems to {path}")  # counts only: never problem text (GPQA)


if __name__ == "__main__":
    main()
