"""SGLangEngine against the source of the pinned SGLang release: only what a CPU cannot run.

tests/test_sglang.py runs the adapter through the real SGLang (its CPU engine in CI), which covers every call a
CPU run makes. What stays unexercised there is GPU-only: the memory saver (enable_memory_saver, and with it
release/resume_memory_occupation in-process and over HTTP) and base_gpu_id (a torchrun rank's engine on its own
GPU). For those we download the pinned wheel (no dependencies), read SGLang's own source with `ast`, and check
that each name the adapter uses exists; the adapter's side is itself read from sglang_engine.py with `ast`, so a
renamed call is caught too (the negative controls at the end).
"""
import ast
import functools
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from machinery import engine, sglang_engine
from data.models import cache_dir

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "machinery" / "sglang_engine.py"
VERSION = sglang_engine.SGLANG_VERSION
# The wheel's Python source is the same on every platform; pin one so every machine reads the same file.
PLATFORM = ["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11", "--implementation", "cp"]


# --------------------------------------------------------------------------- SGLang's side

@pytest.fixture(scope="module")
def sglang_src() -> dict[str, str]:
    """{path inside the wheel: source} for sglang/**/*.py of the pinned release."""
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob(f"sglang-{VERSION}-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PLATFORM,
                            f"sglang=={VERSION}", "-d", str(folder), "-q"], capture_output=True, text=True, timeout=900)
        wheels = sorted(folder.glob(f"sglang-{VERSION}-*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            pytest.skip(f"cannot download sglang=={VERSION} from PyPI (no network?): {last}")
    with zipfile.ZipFile(wheels[-1]) as z:
        return {n: z.read(n).decode() for n in z.namelist() if n.startswith("sglang/") and n.endswith(".py")}


@functools.lru_cache(maxsize=None)
def _parse(path: str, text: str) -> ast.Module:  # SGLang's files are parsed once per session
    return ast.parse(text, filename=path)


def _classes(sources: dict[str, str], prefix: str) -> dict[str, ast.ClassDef]:
    out = {}
    for path, text in sources.items():
        if path.startswith(prefix):
            for node in ast.walk(_parse(path, text)):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, node)
    return out


def _methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, ast.FunctionDef]:
    """Methods of a class and of its bases that are defined in the same sources."""
    out = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
            out.update(_methods(classes[base.id], classes))
    out.update({f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))})
    return out


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    """Annotated class-level names (dataclass / msgspec.Struct fields), bases included."""
    out = set()
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
            out |= _fields(classes[base.id], classes)
    return out | {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _params(f: ast.FunctionDef) -> tuple[list[str], bool]:
    a = f.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return names[1:] if names and names[0] == "self" else names, a.kwarg is not None


def _routes(http_tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """'/route' -> handler, from @app.post("/x") / @app.api_route("/x", ...) decorators."""
    out = {}
    for node in ast.walk(http_tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args
                        and d.func.attr in ("post", "get", "put", "api_route")
                        and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
                    out[d.args[0].value] = node
    return out


# --------------------------------------------------------------------------- our side

GPU_ONLY = {"methods": {"release_memory_occupation", "resume_memory_occupation"},
            "server_args": {"enable_memory_saver", "base_gpu_id"},
            "routes": {"/release_memory_occupation", "/resume_memory_occupation"}}


def adapter_facts(src: str) -> dict:
    """The GPU-only names SGLangEngine uses, read from sglang_engine.py's syntax tree: sglang.Engine methods, keyword
    arguments of sglang.Engine (and keys of the engine_kwargs dicts that feed it), HTTP routes."""
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SGLangEngine")
    facts = {"methods": set(), "server_args": set(), "routes": set()}
    for node in ast.walk(cls):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"/\w+", node.value):
            facts["routes"].add(node.value)
        elif isinstance(node, ast.Dict):  # engine_kwargs = {"base_gpu_id": ..., **engine_kwargs}
            facts["server_args"] |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "Engine":
                facts["server_args"] |= {k.arg for k in node.keywords if k.arg}
            elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "_engine"):
                facts["methods"].add(f.attr)
    return {k: facts[k] & GPU_ONLY[k] for k in facts}


def contract_errors(src: str, sg: dict[str, str]) -> list[str]:
    """Every way in which the adapter source `src` asks for a GPU-only name SGLang does not have."""
    facts = adapter_facts(src)
    errors = [f"sglang_engine.py no longer uses {name!r}" for k in GPU_ONLY for name in sorted(GPU_ONLY[k] - facts[k])]
    ep = _classes(sg, "sglang/srt/entrypoints/")
    methods = _methods(ep["Engine"], ep)
    for name in sorted(facts["methods"]):
        f = methods.get(name)
        if f is None:
            errors.append(f"sglang.Engine has no method {name!r}")
        elif not any(isinstance(n, ast.Attribute) and n.attr == "run_until_complete"
                     and ast.unparse(n.value) == "self.loop" for n in ast.walk(f)):  # driven through _LoopProxy
            errors.append(f"sglang.Engine.{name}() no longer runs via self.loop.run_until_complete")
    server_fields = set()
    for cls in _classes(sg, "sglang/srt/arg_groups/fields/").values():
        server_fields |= _fields(cls, {})
    errors += [f"ServerArgs has no field {k!r} (passed to sglang.Engine)"
               for k in sorted(facts["server_args"] - server_fields)]
    http = "sglang/srt/entrypoints/http_server.py"
    routes = _routes(_parse(http, sg[http]))
    errors += [f"the SGLang HTTP server has no route {r!r}" for r in sorted(facts["routes"] - set(routes))]
    return errors


# --------------------------------------------------------------------------- tests

def test_adapter_facts_are_read_from_our_source():
    assert adapter_facts(ADAPTER.read_text()) == GPU_ONLY


def test_adapter_gpu_calls_exist_in_the_pinned_sglang(sglang_src):
    assert contract_errors(ADAPTER.read_text(), sglang_src) == []


@pytest.mark.parametrize("old,new,expect", [
    ("self._engine.release_memory_occupation()", "self._engine.release_memory()", "'release_memory_occupation'"),
    ("enable_memory_saver=self.frees_memory", "memory_saver=self.frees_memory", "'enable_memory_saver'"),
    ('{"base_gpu_id": dev.index', '{"gpu_id": dev.index', "'base_gpu_id'"),
    ('"/resume_memory_occupation"', '"/resume_memory"', "'/resume_memory_occupation'"),
])
def test_a_renamed_adapter_call_fails_the_check(sglang_src, old, new, expect):
    src = ADAPTER.read_text()
    assert old in src, f"the mutation target {old!r} is gone from engine.py; update this test"
    errors = contract_errors(src.replace(old, new, 1), sglang_src)
    assert any("engine.py no longer uses " + expect in e for e in errors), errors


@pytest.mark.parametrize("old,new,expect", [
    ("def release_memory_occupation(", "def release_memory(", "no method 'release_memory_occupation'"),
    ('"/resume_memory_occupation"', '"/resume"', "no route '/resume_memory_occupation'"),
    ("    base_gpu_id:", "    first_gpu_id:", "no field 'base_gpu_id'"),
])
def test_a_renamed_sglang_name_fails_the_check(sglang_src, old, new, expect):
    mutated = {p: text.replace(old, new) for p, text in sglang_src.items()}
    assert mutated != sglang_src, f"{old!r} is gone from SGLang's source; update this test"
    errors = contract_errors(ADAPTER.read_text(), mutated)
    assert any(expect in e for e in errors), errors


def test_output_parsing_follows_sglang_meta_info():
    # shapes as SGLang's TokenizerManager builds them: (logprob, token_id, text) per token
    out = {"output_ids": [5, 7, 2], "meta_info": {"finish_reason": {"type": "stop", "matched": 2},
                                                  "output_token_logprobs": [(-0.5, 5, None), (-1.0, 7, None), (-0.1, 2, None)]}}
    assert sglang_engine.sglang_gen_output(out) == engine.GenOutput([5, 7, 2], [-0.5, -1.0, -0.1], "stop")
    out["meta_info"]["finish_reason"] = {"type": "abort", "message": "oom"}
    with pytest.raises(RuntimeError, match="abort"):
        sglang_engine.sglang_gen_output(out)
    out = {"meta_info": {"input_token_logprobs": [(None, 3, None), (-2.0, 4, None), (-3.0, 9, None)]}}
    assert sglang_engine.sglang_scores(out, [1, 3, 4, 9], 2) == [-2.0, -3.0]
    with pytest.raises(RuntimeError, match="do not cover"):
        sglang_engine.sglang_scores(out, [1, 3, 4, 9], 1)
    d = sglang_engine.sglang_sampling_params(engine.SamplingParams(temperature=0, stop=["</tool_call>"], seed=7), [2])
    assert d["stop"] == ["</tool_call>"] and d["stop_token_ids"] == [2] and d["no_stop_trim"] is True
    assert d["sampling_seed"] == 7 and "stop_token_ids" not in sglang_engine.sglang_sampling_params(
        engine.SamplingParams())
