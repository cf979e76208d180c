"""SGLangEngine against the real source of the pinned SGLang release.

sglang needs CUDA and is not installed on CPU machines, so the adapter cannot be run
here. Instead we download the pinned wheel (no dependencies), read SGLang's own source
from it with `ast`, and check every call our adapter makes: Engine methods and their
keyword arguments, Engine(**server_args) names, sampling-parameter keys (Python class and
the HTTP JSON schema), HTTP routes and their body fields, and the meta_info keys we read.
What the adapter calls is itself read from engine.py with `ast`, so renaming a call in the
adapter is caught too. An end-to-end test runs where sglang and a GPU exist.
"""
import ast
import asyncio
import functools
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import engine
from data.models import cache_dir

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "engine.py"
VERSION = engine.SGLANG_VERSION
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


def _body_class(handler: ast.FunctionDef) -> str | None:
    """The request class of a route handler's `obj` parameter (plain or Annotated[X, Body()])."""
    for a in handler.args.args:
        if a.arg == "obj" and a.annotation is not None:
            ann = a.annotation
            if isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple):
                ann = ann.slice.elts[0]
            if isinstance(ann, ast.Name):
                return ann.id
    return None


# --------------------------------------------------------------------------- our side

def adapter_facts(src: str) -> dict:
    """Everything SGLangEngine asks of SGLang, read from engine.py's syntax tree."""
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SGLangEngine")
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    facts = {"engine_calls": [], "engine_ctor": set(), "sampling_keys": set(), "routes": set(),
             "post_bodies": [], "generate_keys": set(), "meta_keys": set(), "serializer_kwargs": set()}

    def is_self_attr(node, attr):
        return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
                and node.value.id == "self")

    for node in ast.walk(cls):
        if not isinstance(node, ast.Call):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"/\w+", node.value):
                facts["routes"].add(node.value)
            continue
        f = node.func
        kws = {k.arg for k in node.keywords if k.arg}
        if isinstance(f, ast.Attribute) and is_self_attr(f.value, "_engine"):
            facts["engine_calls"].append((f.attr, kws, len(node.args)))
        elif isinstance(f, ast.Attribute) and f.attr == "Engine":
            facts["engine_ctor"] |= kws
        elif is_self_attr(f, "_agenerate"):
            facts["generate_keys"] |= kws
        elif is_self_attr(f, "_post") and len(node.args) == 2 and isinstance(node.args[1], ast.Dict):
            keys = {k.value for k in node.args[1].keys if isinstance(k, ast.Constant)}
            facts["post_bodies"].append((node.args[0].value, keys))
        elif isinstance(f, ast.Attribute) and f.attr == "serialize":
            facts["serializer_kwargs"] |= kws
        for k in node.keywords:  # inline sampling_params={...} (score)
            if k.arg == "sampling_params" and isinstance(k.value, ast.Dict):
                facts["sampling_keys"] |= {x.value for x in k.value.keys if isinstance(x, ast.Constant)}

    for node in ast.walk(funcs["sglang_sampling_params"]):
        if isinstance(node, ast.Dict):
            facts["sampling_keys"] |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant):
            facts["sampling_keys"].add(node.slice.value)
    for name in ("sglang_gen_output", "sglang_scores"):
        for node in ast.walk(funcs[name]):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                facts["meta_keys"].add(node.slice.value)
    return facts


def contract_errors(src: str, sg: dict[str, str]) -> list[str]:
    """Every way in which the adapter source `src` asks for something SGLang does not have."""
    facts, errors = adapter_facts(src), []
    ep = _classes(sg, "sglang/srt/entrypoints/")
    methods = _methods(ep["Engine"], ep)
    sync_uses_loop = set()
    for name, f in methods.items():
        if any(isinstance(n, ast.Attribute) and n.attr == "run_until_complete" and ast.unparse(n.value) == "self.loop"
               for n in ast.walk(f)):
            sync_uses_loop.add(name)
    for name, kws, npos in facts["engine_calls"]:
        if name not in methods:
            errors.append(f"sglang.Engine has no method {name!r}")
            continue
        params, var_kw = _params(methods[name])
        errors += [f"sglang.Engine.{name}() has no keyword {k!r}" for k in sorted(kws) if k not in params and not var_kw]
        if npos > len(params):
            errors.append(f"sglang.Engine.{name}() takes {len(params)} arguments, the adapter passes {npos}")
        # the adapter drives sync methods through _LoopProxy: they must go through self.loop
        if not isinstance(methods[name], ast.AsyncFunctionDef) and name != "shutdown" and name not in sync_uses_loop:
            errors.append(f"sglang.Engine.{name}() no longer runs via self.loop.run_until_complete")
    if "async_generate" in methods and not isinstance(methods["async_generate"], ast.AsyncFunctionDef):
        errors.append("sglang.Engine.async_generate is no longer a coroutine")

    init = _parse("sglang/__init__.py", sg["sglang/__init__.py"])
    exported = {t.id for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    exported |= {a.asname or a.name for n in ast.walk(init) if isinstance(n, ast.ImportFrom) for a in n.names}
    if facts["engine_ctor"] and "Engine" not in exported:
        errors.append("the sglang package no longer exports Engine")

    server_fields = set()
    for cls in _classes(sg, "sglang/srt/arg_groups/fields/").values():
        server_fields |= _fields(cls, {})
    errors += [f"ServerArgs has no field {k!r} (passed to sglang.Engine)" for k in sorted(facts["engine_ctor"] - server_fields)]

    sp = _fields(_classes(sg, "sglang/srt/sampling/")["SamplingParams"], {})
    sp_json = _fields(_classes(sg, "sglang/api/")["SamplingParams"], {})
    for k in sorted(facts["sampling_keys"]):
        if k not in sp:
            errors.append(f"sglang SamplingParams has no field {k!r}")
        if k not in sp_json:
            errors.append(f"the /generate JSON schema's SamplingParams rejects {k!r}")

    io = _classes(sg, "sglang/srt/managers/io_struct.py")
    http = "sglang/srt/entrypoints/http_server.py"
    routes = _routes(_parse(http, sg[http]))
    errors += [f"the SGLang HTTP server has no route {r!r}" for r in sorted(facts["routes"] - set(routes))]
    bodies = facts["post_bodies"] + [("/generate", facts["generate_keys"])]
    for route, keys in bodies:
        if route not in routes:
            continue
        body_cls = _body_class(routes[route])
        fields = _fields(io[body_cls], io) if body_cls in io else set()
        errors += [f"{route}: {body_cls or 'the handler'} has no field {k!r}" for k in sorted(keys - fields)]
    gen_json = _fields(_classes(sg, "sglang/api/")["GenerateRequest"], {})
    errors += [f"the /generate JSON schema has no field {k!r}" for k in sorted(facts["generate_keys"] - gen_json)]
    if "async_generate" in methods:
        params, _ = _params(methods["async_generate"])
        errors += [f"sglang.Engine.async_generate() has no keyword {k!r}"
                   for k in sorted(facts["generate_keys"] - set(params) - {"return_logprob"})]

    tm = "sglang/srt/managers/tokenizer_manager.py"
    consts = {n.value for n in ast.walk(_parse(tm, sg[tm])) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    errors += [f"SGLang's TokenizerManager never produces the key {k!r}" for k in sorted(facts["meta_keys"] - consts)]

    ser = _classes(sg, "sglang/srt/utils/common.py")["MultiprocessingSerializer"]
    params, _ = _params(_methods(ser, {})["serialize"])
    errors += [f"MultiprocessingSerializer.serialize() has no keyword {k!r}" for k in sorted(facts["serializer_kwargs"] - set(params))]
    return errors


# --------------------------------------------------------------------------- tests

def test_adapter_facts_are_read_from_our_source():
    facts = adapter_facts(ADAPTER.read_text())
    called = {m for m, _, _ in facts["engine_calls"]}
    assert {"async_generate", "update_weights_from_tensor", "flush_cache", "release_memory_occupation",
            "resume_memory_occupation", "shutdown"} <= called
    kw = {m: k for m, k, _ in facts["engine_calls"]}
    assert {"input_ids", "sampling_params", "return_logprob", "logprob_start_len"} <= kw["async_generate"]
    assert {"named_tensors", "flush_cache"} <= kw["update_weights_from_tensor"]
    assert {"model_path", "enable_deterministic_inference", "mem_fraction_static"} <= facts["engine_ctor"]
    assert {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "no_stop_trim",
            "sampling_seed"} <= facts["sampling_keys"]
    assert {"/generate", "/flush_cache", "/update_weights_from_tensor"} <= facts["routes"]
    assert {"output_token_logprobs", "input_token_logprobs", "finish_reason", "meta_info"} <= facts["meta_keys"]


def test_adapter_calls_exist_in_the_pinned_sglang(sglang_src):
    assert contract_errors(ADAPTER.read_text(), sglang_src) == []


@pytest.mark.parametrize("old,new,expect", [
    ("self._engine.flush_cache()", "self._engine.flush_kache()", "no method 'flush_kache'"),
    ("logprob_start_len=kw.get", "logprob_start=kw.get", "no keyword 'logprob_start'"),
    ("flush_cache=False)\n        else:", "flush=False)\n        else:", "update_weights_from_tensor() has no keyword 'flush'"),
    ('"no_stop_trim": True', '"keep_stop": True', "no field 'keep_stop'"),
    ('d["sampling_seed"]', 'd["seed"]', "no field 'seed'"),
    ("enable_memory_saver=enable_memory_saver,", "memory_saver=enable_memory_saver,", "no field 'memory_saver'"),
    ('"/flush_cache"', '"/flush_the_cache"', "no route '/flush_the_cache'"),
    ('meta["output_token_logprobs"]', 'meta["output_logprobs"]', "never produces the key 'output_logprobs'"),
])
def test_a_renamed_adapter_call_fails_the_check(sglang_src, old, new, expect):
    src = ADAPTER.read_text()
    assert old in src, f"the mutation target {old!r} is gone from engine.py; update this test"
    errors = contract_errors(src.replace(old, new, 1), sglang_src)
    assert any(expect in e for e in errors), errors


def test_requirements_pin_matches_the_adapter():
    req = ROOT / "requirements-gpu.txt"
    if not req.exists():
        pytest.skip("requirements-gpu.txt not written yet")
    pins = re.findall(r"^sglang(?:\[[^\]]*\])?==([\w.]+)", req.read_text(), re.M)
    assert pins == [VERSION]


def test_output_parsing_follows_sglang_meta_info():
    # shapes as SGLang's TokenizerManager builds them: (logprob, token_id, text) per token
    out = {"output_ids": [5, 7, 2], "meta_info": {"finish_reason": {"type": "stop", "matched": 2},
                                                  "output_token_logprobs": [(-0.5, 5, None), (-1.0, 7, None), (-0.1, 2, None)]}}
    assert engine.sglang_gen_output(out) == engine.GenOutput([5, 7, 2], [-0.5, -1.0, -0.1], "stop")
    out["meta_info"]["finish_reason"] = {"type": "abort", "message": "oom"}
    with pytest.raises(RuntimeError, match="abort"):
        engine.sglang_gen_output(out)
    out = {"meta_info": {"input_token_logprobs": [(None, 3, None), (-2.0, 4, None), (-3.0, 9, None)]}}
    assert engine.sglang_scores(out, [1, 3, 4, 9], 2) == [-2.0, -3.0]
    with pytest.raises(RuntimeError, match="do not cover"):
        engine.sglang_scores(out, [1, 3, 4, 9], 1)
    d = engine.sglang_sampling_params(engine.SamplingParams(temperature=0, stop=["</tool_call>"], seed=7), [2])
    assert d["stop"] == ["</tool_call>"] and d["stop_token_ids"] == [2] and d["no_stop_trim"] is True
    assert d["sampling_seed"] == 7 and "stop_token_ids" not in engine.sglang_sampling_params(engine.SamplingParams())


def _cuda_sglang():
    try:
        import sglang  # noqa: F401
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_sglang(), reason="needs sglang installed and a CUDA GPU")
def test_sglang_engine_end_to_end():
    import torch

    from data.models import load_model, load_tokenizer, resolve
    name = "smollm2-135m"  # real weights: greedy tokens are stable across bf16 / fp32
    tok = load_tokenizer(name)
    ref = load_model(name, dtype=torch.float32).cuda().eval()
    # triton attention: no head-dim / GQA-group restrictions for odd small models
    eng = engine.SGLangEngine(resolve(name), dtype="bfloat16", mem_fraction_static=0.3, attention_backend="triton")
    try:
        prompt = tok.encode("The capital of France is")
        greedy = engine.SamplingParams(temperature=0, max_new_tokens=8)

        async def go():
            outs = await asyncio.gather(*[eng.generate(prompt, greedy) for _ in range(3)])
            sampled = await eng.generate(prompt, engine.SamplingParams(temperature=0.8, max_new_tokens=8))
            stop_at = outs[0].token_ids[3]
            stopped = await eng.generate(prompt, engine.SamplingParams(temperature=0, max_new_tokens=8,
                                                                       stop_token_ids=[stop_at]))
            text = tok.decode(outs[0].token_ids[2:4])
            by_str = await eng.generate(prompt, engine.SamplingParams(temperature=0, max_new_tokens=8, stop=[text]))
            scored = await eng.score(prompt + outs[0].token_ids, len(prompt))
            return outs, sampled, stopped, by_str, text, scored
        outs, sampled, stopped, by_str, text, scored = asyncio.run(go())
        o = outs[0]
        assert all(x.token_ids == o.token_ids for x in outs) and len(o.token_ids) == len(o.logprobs)
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + o.token_ids], device="cuda")).logits[0, len(prompt) - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(o.token_ids, device="cuda")[:, None])[:, 0].cpu()
        assert o.token_ids[0] == int(logits[0].argmax())
        torch.testing.assert_close(torch.tensor(o.logprobs), lp, atol=0.15, rtol=0)   # bf16 engine vs fp32 HF
        torch.testing.assert_close(torch.tensor(scored), torch.tensor(o.logprobs), atol=0.05, rtol=0)
        assert len(sampled.token_ids) == len(sampled.logprobs) > 0
        first = o.token_ids.index(o.token_ids[3])
        assert stopped.token_ids == o.token_ids[:first + 1] and stopped.finish_reason == "stop"
        assert by_str.finish_reason == "stop" and text in tok.decode(by_str.token_ids)  # not trimmed
        assert o.token_ids[:len(by_str.token_ids)] == by_str.token_ids

        with torch.no_grad():
            for p in ref.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        eng.update_weights(ref.named_parameters())
        new = asyncio.run(eng.generate(prompt, greedy))
        assert new.token_ids != o.token_ids
        eng.release_memory()
        eng.resume_memory()
        eng.update_weights(ref.named_parameters())  # weights are not backed up across a release
        assert asyncio.run(eng.generate(prompt, greedy)).token_ids == new.token_ids
    finally:
        eng.shutdown()
