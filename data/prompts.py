"""data/prompts.py: what the model is asked (rollout.make_prompt fills these in), and a user's own wording.

The task prompts are ours, in the paper's spirit: solve step by step, use the offered tools (their sentences come
from tools.py), stop calling them when sure, and give the answer in the form the grader reads (reward.py).
`--prompt-template FILE` replaces them (e.g. with the official prompts, which `data/download.py --templates`
writes). What the model reads from a tool is the tool's (tools.py); from SAAR, saar.py's.
"""
from __future__ import annotations

import json

# {tool}: how to call the offered tools, each tool's sentence for the format (tools.py: Tool.sentence); {it} and
# {the_tool} in their number
PROMPTS = {
    "math": ("Solve the following math problem step by step.\n\n{problem}\n\n"
             "{tool}Use {it} for exact calculation and to check your work before you answer. "
             "When you are sure, stop calling {the_tool} and give the final answer as \\boxed{{answer}}."),
    "code": ("Solve the following programming problem.\n\n{problem}\n\n"
             "{tool}Use {it} to test your solution. When you are sure it is correct, stop calling {the_tool} and "
             "give your final solution in one ```python block."),
    "gpqa": ("Answer the following multiple-choice question step by step.\n\n{problem}\n\n"
             "{tool}Use {it} for exact calculation. Give the letter of the final answer as \\boxed{{X}}."),
}
# --tool-format none (the no-tool baseline): the same tasks, with no tool to mention
NO_TOOL_PROMPTS = {
    "math": ("Solve the following math problem step by step.\n\n{problem}\n\n"
             "Give the final answer as \\boxed{{answer}}."),
    "code": ("Solve the following programming problem.\n\n{problem}\n\n"
             "Give your final solution in one ```python block."),
    "gpqa": ("Answer the following multiple-choice question step by step.\n\n{problem}\n\n"
             "Give the letter of the final answer as \\boxed{{X}}."),
}


def load_prompt_template(path: str) -> dict:
    """A prompt template file (--prompt-template): JSON {"math": ..., "code": ..., "gpqa": ..., "system": ...}, each
    optional; a task's template holds {problem}, and may hold {tool} (the tool sentence) and {name} for a text
    field of the problem's meta (e.g. {domain}, GPQA's). For users who want other wording, e.g. the official
    prompts, which the project does not carry (`data/download.py --templates` writes them)."""
    try:
        with open(path, encoding="utf-8") as f:
            t = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"--prompt-template {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--prompt-template {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
        raise ValueError(f"--prompt-template {path}: expected a JSON object of strings")
    unknown = set(t) - set(PROMPTS) - {"system"}
    if unknown:
        raise ValueError(f"--prompt-template {path}: unknown keys {sorted(unknown)}; "
                         f"known: {sorted(PROMPTS)} and system")
    for task, text in t.items():
        if task != "system" and "{problem}" not in text:
            raise ValueError(f"--prompt-template {path}: the {task!r} template has no {{problem}}")
    return t
