"""The project's import graph, read with ast (nothing is imported or run): no cycles, machinery/ imports nothing above
it (docs/architecture.md's one rule), and the leaves stay leaves.

Every import counts, including those inside functions (a lazy import still ties the two modules together), so
that saar.py, sandbox.py and the leaves of machinery/ can be read, copied and tested alone."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "machinery")
# import no project module: the standard library and third-party packages only
LEAVES = ("saar", "config", "machinery.precision", "machinery.mismatch", "machinery.engine",
          "machinery.zygote_frame", "machinery.lcb_wire",
          "machinery.mathverify")


def project_modules() -> dict[str, Path]:
    mods = {p.stem: p for p in ROOT.glob("*.py")}
    for pkg in PACKAGES:
        mods.update({f"{pkg}.{p.stem}": p for p in (ROOT / pkg).glob("*.py") if p.stem != "__init__"})
    return mods


def imports_of(path: Path, mods: dict) -> set[str]:
    """The project modules that `path` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative, inside a package
            pkg = path.parent.name
            names = [f"{pkg}.{node.module}" if node.module else f"{pkg}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in mods}
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {m: imports_of(p, mods) - {m} for m, p in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_import_graph_has_no_cycle_and_the_leaves_import_no_project_module():
    g = graph()
    assert {"train", "rollout", "saar", "sandbox", "grpo", "machinery.engine", "reward", "eval", "sft", "data.models",
            "machinery.packing", "machinery.checkpoint", "machinery.zygote"} <= set(g)
    assert g["rollout"] and g["train"]  # the walk sees imports at all
    assert {"machinery.packing", "machinery.precision"} <= g["grpo"]  # and `from machinery import x` as x
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    for leaf in LEAVES:
        assert not g[leaf], f"{leaf}.py imports project modules {sorted(g[leaf])}"
    # the zygote's program (machinery/zygote*.py) runs alone, in the sandbox: it imports nothing of the project but
    # itself; sandbox.py and its machinery are read, copied and tested together: its only project import is the
    # pool, which imports only that program
    for m in [m for m in g if m.startswith("machinery.zygote")] + ["machinery.sandbox_pool"]:
        assert all(n.startswith("machinery.zygote") for n in g[m]), f"{m}.py imports {sorted(g[m])}"
    assert g["sandbox"] == {"machinery.sandbox_pool"}, sorted(g["sandbox"])


def test_the_check_finds_a_cycle_and_a_leaf_import(tmp_path):
    """The negative control: the same checks on a graph that has each fault."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    (tmp_path / "saar.py").write_text("def f():\n    import rollout\n")
    assert imports_of(tmp_path / "saar.py", {"rollout": None, "saar": None}) == {"rollout"}
    (tmp_path / "mismatch.py").write_text("from machinery import packing\nimport machinery.precision as p\n")
    mods = {"machinery.packing": None, "machinery.precision": None, "packing": None}
    assert imports_of(tmp_path / "mismatch.py", mods) == {"machinery.packing", "machinery.precision"}


def test_machinery_imports_nothing_above_it():
    """docs/architecture.md's rule: the root and data/ call down into machinery/, never the other way; what a module
    there must hash or call is handed in by its caller. The sandbox's own program (machinery/zygote*) imports only
    itself, and saar.py no project module at all."""
    g = graph()
    up = {m: sorted(d for d in deps if not d.startswith("machinery.")) for m, deps in g.items()
          if m.startswith("machinery.")}
    assert len(up) >= 10 and not any(up.values()), {m: d for m, d in up.items() if d}
    program = {m: sorted(d for d in deps if not d.startswith("machinery.zygote")) for m, deps in g.items()
               if m.startswith("machinery.zygote")}
    assert program and not any(program.values()), program
    assert not g["saar"]
