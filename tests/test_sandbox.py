"""Adversarial tests of sandbox.py: every hostile snippet must end with the right kind, a useful
model-facing text, no process left behind and the host unchanged. Runs against real zygotes in
three containment modes: all layers (bwrap), root without bwrap (network and mount namespaces, uid), and a
bare mode (seccomp only, what a non-root user without bwrap gets)."""

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools import NO_OUTPUT, tool_text  # noqa: E402  (what the model reads of a result)
from sandbox import ERROR_KINDS, FRAME_LINES_MAX, MAX_FRAMES, TEXT_MAX, ExecResult, Sandbox  # noqa: E402

SECRET = "cleaner-test-secret-7f3a9c"
MODES = {
    "bwrap": {},
    "fallback": {"use_bwrap": False},
    "bare": {"use_bwrap": False, "use_netns": False, "use_uid": False},
}
SHORT = 1.0  # timeout for snippets that must time out
LONG = 20.0  # timeout for snippets that must not: generous for a loaded 2-core CI box


# ---- host-side observers (independent of sandbox.py's own helpers)

def _ppids() -> dict:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                data = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            rest = data[data.rfind(b")") + 2:].split()
            table[int(name)] = (int(rest[1]), rest[0])
    return table


def live_descendants() -> int:
    """Non-zombie processes below this test process: the zygotes, bwrap, session holders."""
    table, todo, n = _ppids(), [os.getpid()], 0
    while todo:
        parent = todo.pop()
        for pid, (ppid, state) in table.items():
            if ppid == parent:
                todo.append(pid)
                n += state != b"Z"
    return n


def settled_count(expected: int | None = None, timeout_s: float = 5.0) -> int:
    """The number of live processes below us once it has held still for 0.1 s (and equals
    `expected`, if given), or the last count after timeout_s. Transients are expected: SIGKILLed
    processes take a few ms to go, and the sandbox forks its next child right after answering."""
    last, same, deadline = None, 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = live_descendants()
        same = same + 1 if n == last else 0
        last = n
        if same >= 10 and expected in (None, n):
            break
        time.sleep(0.01)
    return last


def settles_to(expected: int) -> bool:
    return settled_count(expected) == expected


def processes_with(marker: str) -> list:
    hits = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    hits.append(int(name))
            except OSError:
                pass
    return hits


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---- fixtures

@pytest.fixture(scope="module")
def victim():
    """A root-owned folder outside any scratch dir, visible in every mode: not under /tmp, nor /var/tmp
    (bwrap and the fallback's mount namespace put an empty tmpfs over both)."""
    base = next((d for d in ("/var/lib", "/var/cache", "/srv") if os.access(d, os.W_OK)), os.path.expanduser("~"))
    folder = Path(tempfile.mkdtemp(prefix="cleaner-victim-", dir=base))
    folder.chmod(0o755)
    (folder / "keep.txt").write_text("precious")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _make(mode: str) -> Sandbox:
    os.environ["CLEANER_SANDBOX_TEST_SECRET"] = SECRET  # must not reach the code
    try:
        sb = Sandbox(slots=2, timeout_s=LONG, **MODES[mode])
    finally:
        del os.environ["CLEANER_SANDBOX_TEST_SECRET"]
    if mode == "bwrap" and "bwrap" not in sb.layers:
        sb.close()
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    return sb


@pytest.fixture(scope="module", params=["bwrap", "fallback"])
def sb(request):
    sb = _make(request.param)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def bare():
    sb = _make("bare")
    yield sb
    sb.close()


@pytest.fixture
def contained(victim):
    """After the test: no process left below us, no escapee anywhere, the victim folder unchanged."""
    before, files = settled_count(), snapshot(victim)
    yield
    assert settles_to(before), f"{live_descendants()} processes below the test, expected {before}"
    assert processes_with("1000.123") == [] and processes_with("1000.456") == []
    assert snapshot(victim) == files


def private_shm(box: Sandbox) -> bool:
    """/dev/shm is the sandbox's own tmpfs, wiped after every execution (bwrap, or root's mount namespace)."""
    return bool({"bwrap", "mountns"} & set(box.layers))


def expect(r: ExecResult, kind: str, *in_text: str) -> None:
    assert r.error_kind in ERROR_KINDS
    assert r.error_kind == kind, (r.error_kind, tool_text(r))
    assert r.ok == (kind == "none")
    for s in in_text:
        assert s in tool_text(r), (s, tool_text(r))
    assert not re.search(r"sandbox(_pool)?\.py|zygote\w*\.py", tool_text(r))  # our own frames never reach the model


# ---- runaway code

@pytest.mark.parametrize("code", [
    "print('started')\nwhile True:\n    pass",
    "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.alarm(1)\nprint('started')\nwhile True:\n    pass",
    "print('started')\nsum(range(10**11))",  # a loop in C: no Python signal handler ever runs
], ids=["loop", "ignores-signals", "c-loop"])
def test_timeouts(sb, contained, code):
    r = sb.run(code, timeout_s=SHORT)
    expect(r, "timeout", "TimeoutError: the code ran longer than the 1 s time limit")
    assert tool_text(r).startswith("started\n")  # output before the kill is kept
    assert r.exception_type is None


def test_memory_limit(sb, contained):
    r = sb.run("print('before')\nx = bytearray(10**11)")
    expect(r, "memory", "before\n", "MemoryError", "line 2", f"{sb.memory_mb} MB")
    assert tool_text(r, "last_line") == tool_text(r) and len(tool_text(r).splitlines()) == 2  # the error is one line
    assert r.line == 2 and r.message == "" and r.memory_mb == sb.memory_mb
    # numpy (and a 200 MB array) still work under the limit
    expect(sb.run("import numpy as np\nprint(np.ones(25 * 10**6).sum())"), "none", "25000000.0")


def test_fork_bomb(sb, contained):
    if "uid" not in sb.layers:
        pytest.skip("fork bombs are only contained with a per-slot uid (RLIMIT_NPROC is not enforced for root)")
    r = sb.run("import os\nwhile True:\n    os.fork()", timeout_s=SHORT)
    # Which comes first depends on scheduling: the refused fork, or the timeout while 128
    # copies share 2 cores. Either way nothing survives (checked by `contained`).
    assert r.error_kind in ("exception", "timeout"), tool_text(r)
    if r.error_kind == "exception":
        expect(r, "exception", "BlockingIOError")
    assert tool_text(sb.run("print('alive')")) == "alive\n"


def test_setsid_and_double_fork_escapees(sb, contained):
    r = sb.run("import subprocess\nsubprocess.Popen(['sleep', '1000.123'], start_new_session=True)\nprint('spawned')")
    expect(r, "none", "spawned")
    code = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        os.execv('/bin/sleep', ['sleep', '1000.456'])\n    os._exit(0)\nos.wait()\nprint('parent done')")
    expect(sb.run(code), "none", "parent done")


# ---- output

def test_output_flood(sb, contained):
    r = sb.run("print('x' * 100_000_000)")
    expect(r, "output_limit", "OutputLimitError")
    assert r.bytes_cut > 0 and "bytes cut]" in r.stdout
    assert len(tool_text(r)) < 2 * sb.max_output_bytes + 1000


def test_a_forged_result_frame_is_cut(sb, contained):
    # The result frame comes from the code's own process (fd 3), so code can write one itself.
    # Its fields are checked and bounded by the zygote: texts, frames (how many, their lines), types.
    code = ("import os, json, struct\nd = json.dumps({'kind': 'exception', 'exception_type': 'E',"
            " 'exception_text': 'x' * 1_000_000 + '\\nE: forged', 'frames': [[1, 2, 3, 4, 5], ['a', 'b', 'c', 'd', 0],"
            " ['a', True, 'c', 'd', 0], ['a', 1, 'c', 'd', -1], 'junk'] + [['<cell>', 1, 'f', 'y' * 10_000, 0]] * 200,"
            " 'frames_omitted': -5, 'exception_cut': 'many', 'line': True, 'stdout': 'forged', 'signal': 9}).encode()\n"
            "os.write(3, struct.pack('>I', len(d)) + d)\nos._exit(0)")
    r = sb.run(code)
    expect(r, "exception", "chars cut]")
    assert len(tool_text(r)) < 2 * sb.max_output_bytes + 1000 and tool_text(r, "last_line") == "E: forged"
    assert len(r.exception_text) <= TEXT_MAX and r.exception_cut == 1_000_010 - TEXT_MAX
    assert len(r.frames) == MAX_FRAMES - 5 and sum(len(f.line) for f in r.frames) <= FRAME_LINES_MAX  # 5 malformed
    assert all(f == r.frames[0] for f in r.frames) and r.frames[0][:3] == ("<cell>", 1, "f")
    assert (r.frames_omitted, r.line, r.stdout, r.signal) == (0, None, "", None)


def test_code_cannot_pass_its_own_failure_off_as_the_sandboxs(sb, contained):
    """Each of these once ended as sandbox_internal, with the code run a second time and a traceback on the
    trainer's stderr; the third also skipped the wipe, so the next run saw this run's files."""
    expect(sb.run("import os\nos.kill(os.getpid(), 40)"), "crash", "signal 40")  # signal.Signals(40) raises
    nested = "import os, struct\nopen('left', 'w').write('x')\nd = b'[' * 200_000\n" \
             "os.write(3, struct.pack('>I', len(d)) + d)\nos._exit(3)"
    expect(sb.run(nested), "crash")  # json's RecursionError on the frame: a garbled frame, the code's failure
    for _ in range(4):  # both slots: the wipe ran
        assert tool_text(sb.run("import os\nprint(os.listdir('.'))")) == "[]\n"
    forged = "import json, os, struct, time\ntime.sleep(1)\n" \
             "d = json.dumps({'kind': 'sandbox_internal', 'detail': 'forged'}).encode()\n" \
             "os.write(3, struct.pack('>I', len(d)) + d)\nos._exit(121)"
    t0 = time.monotonic()
    r = sb.run(forged)
    assert r.error_kind == "sandbox_internal" and time.monotonic() - t0 < 1.9  # reported once, not run again


def test_large_output_is_not_a_timeout(sb, contained):
    # More than a pipe buffer: if nobody drained it the child would block until the timeout.
    r = sb.run("print('y' * 300_000)\nfor i in range(20_000):\n    print(i)\nprint('end')", timeout_s=10)
    expect(r, "none", "bytes cut]")
    assert r.stdout.endswith("19999\nend\n") and r.stdout.startswith("yyy")
    assert r.bytes_cut == 300_001 + sum(len(str(i)) + 1 for i in range(20_000)) + 4 - (sb.max_output_bytes // 2) * 2


def test_invalid_utf8(sb, contained):
    r = sb.run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\n')\nsys.stderr.buffer.write(b'err \\xc3\\x28\\n')")
    expect(r, "none", "ok \ufffd\ufffd", "err \ufffd(")
    assert r.stderr == "err \ufffd(\n"


# ---- filesystem, network, environment

def test_a_flood_of_files_does_not_delay_the_answer(sb, contained):
    """The scratch dir is wiped after the answer is sent, not before: a call that leaves 150,000 files gets its
    answer as soon as its code ends (the wipe took over a second before issue 44), and the next call still
    finds the scratch dir empty."""
    code = ("import os, time\n"
            "t = time.monotonic()\n"
            "for i in range(150_000):\n"
            "    open(f'f{i}', 'w').close()\n"
            "print(len(os.listdir('.')), time.monotonic() - t)")
    t0 = time.monotonic()
    r = sb.run(code)
    wall = time.monotonic() - t0
    assert r.ok, tool_text(r)
    n, inner = r.stdout.split()
    assert int(n) >= 150_000
    assert wall - float(inner) < 0.5, (wall, inner)  # the process start and the answer, no wipe
    r = sb.run("import os; print(os.listdir('.'))")
    assert r.ok and r.stdout.strip() == "[]", tool_text(r)


def test_rm_rf_outside_scratch(sb, contained, victim):
    if not {"bwrap", "uid"} & set(sb.layers):
        pytest.skip("without bwrap or a separate uid the code owns what the trainer owns")
    r = sb.run(f"import subprocess, os\nprint(os.path.exists({str(victim)!r}))\nr = subprocess.run(['rm', '-rf', {str(victim)!r}])\nprint('rc', r.returncode)")
    expect(r, "none", "True\n", "rc 1", "rm: cannot remove")


def test_writing_outside_scratch(sb, contained, victim):
    if not {"bwrap", "uid"} & set(sb.layers):
        pytest.skip("without bwrap or a separate uid the code owns what the trainer owns")
    refused = ("PermissionError: [Errno 13] Permission denied", "OSError: [Errno 30] Read-only file system")
    r = sb.run(f"open({str(victim / 'new.txt')!r}, 'w').write('pwned')")
    expect(r, "exception")
    assert any(s in tool_text(r) for s in refused), tool_text(r)
    if private_shm(sb):  # the private /tmp is not the host's, and only scratch is writable in it
        r = sb.run("open('/tmp/cleaner-pwned.txt', 'w').write('x')")
        expect(r, "exception")
        assert any(s in tool_text(r) for s in refused), tool_text(r)
        assert not os.path.exists("/tmp/cleaner-pwned.txt")
    # the scratch dir is writable, and empty again for the next call
    expect(sb.run("open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())"), "none", "hi")
    expect(sb.run("import os\nprint(os.listdir('.'))"), "none", "[]")


def _network(box, contained_listener):
    lst, port = contained_listener
    r = box.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')")
    assert r.error_kind == "exception", tool_text(r)
    assert r.exception_type in ("ConnectionRefusedError", "PermissionError", "OSError"), tool_text(r)
    assert "connected" not in r.stdout
    with pytest.raises(BlockingIOError):
        lst.accept()


@pytest.fixture
def listener():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    lst.setblocking(False)
    yield lst, lst.getsockname()[1]
    lst.close()


def test_network(sb, contained, listener):
    _network(sb, listener)


def test_secret_in_parent_environment(sb, contained):
    code = ("import os, glob\nhits = [k for k, v in os.environ.items() if %r in v]\n"
            "for p in glob.glob('/proc/*/environ'):\n    try:\n        hits += [p] if %r.encode() in open(p, 'rb').read() else []\n"
            "    except OSError:\n        pass\nprint('hits', hits)") % (SECRET, SECRET)
    expect(sb.run(code), "none", "hits []")


# ---- exits and crashes

@pytest.mark.parametrize("code,kind,text", [
    ("import sys\nprint('a')\nsys.exit(0)", "none", "a\n"),
    ("import sys\nsys.exit(3)", "exception", "SystemExit: 3"),
    ("import os\nos._exit(5)", "crash", "Crash: the process exited with status 5"),
    ("import ctypes\nctypes.string_at(0)", "crash", "SIGSEGV (segmentation fault)"),
    ("import os\nos.abort()", "crash", "SIGABRT"),
    ("x = input()", "exception", "EOFError: EOF when reading a line"),
], ids=["sys.exit0", "sys.exit3", "os._exit", "segfault", "abort", "input"])
def test_exits_and_crashes(sb, contained, code, kind, text):
    expect(sb.run(code), kind, text)


def test_deep_recursion_is_compact(sb, contained):
    r = sb.run("def f(n):\n    return f(n + 1)\nf(0)")
    expect(r, "exception", 'File "<cell>", line 2, in f', "[Previous line repeated", "RecursionError")
    assert len(tool_text(r).splitlines()) <= 20
    assert tool_text(r, "last_line") == "RecursionError: maximum recursion depth exceeded"
    assert r.frames[-1].repeats > 900 and r.frames_omitted == 0  # the facts: one frame, repeated


def test_echo_of_a_final_expression_only_when_asked(sb, contained):
    """The official tool prints the repr of a last bare expression (not None); ours is a script unless echo."""
    assert tool_text(sb.run("x = 2 + 3\nx", echo=True)) == "5\n"
    assert tool_text(sb.run("x = 2 + 3\nx")) == NO_OUTPUT
    assert tool_text(sb.run("'a' * 2", echo=True)) == "'aa'\n"
    assert tool_text(sb.run("print(1)", echo=True)) == "1\n"  # print returns None: nothing more
    assert tool_text(sb.run("x = 1", echo=True)) == NO_OUTPUT


def test_a_deep_directory_tree_does_not_break_a_worker(sb, contained):
    """mkdir + chdir 1500 levels deep: shutil.rmtree's recursion would fail on it and leave the worker answering
    every later call with an internal error (and run() would execute the code twice). Each slot takes it."""
    where = ["."] + (["/dev/shm"] if private_shm(sb) else [])  # then /dev/shm is the sandbox's own
    for base in where:
        code = f"import os\nos.chdir({base!r})\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
        for _ in range(4):  # two slots, each more than once
            r = sb.run(code)
            assert r.ok and tool_text(r) == "deep\n", tool_text(r)
    r = sb.run("import os\nprint(sorted(os.listdir('.')), [n for n in os.listdir('/dev/shm') if n == 'd'])")
    assert r.ok and tool_text(r) == "[] []\n", tool_text(r)


@pytest.mark.parametrize("mode,layer", [("bwrap", "bwrap"), ("fallback", "mountns")])
def test_answers_graders_and_runs_are_hidden_from_the_code(tmp_path, contained, mode, layer):
    """A policy that reads the answer key would be rewarded for it: with bwrap, and on the fallback with a mount
    namespace of its own (root), the checkout (reward.py, tests, run folders), the problem sets beside it (an
    answer of aime24.jsonl), the caches and the caller's folders are empty to the code, while the interpreter
    and its libraries (a venv inside the checkout too) still work. Nothing the code holds names the checkout:
    its argv, sys.path, environment, mapped libraries, nor a listing of the folder that holds the checkout
    (which is itself hidden when it is a top-level folder such as CI's /check)."""
    run_dir = tmp_path / "out"
    (run_dir / "rollouts").mkdir(parents=True)
    (run_dir / "rollouts" / "step_1.jsonl").write_text('{"answer": "42"}')
    repo = Path(__file__).resolve().parents[1]
    shared = repo.parent / "shared"
    answers = shared / "data" / "aime24.jsonl"
    with Sandbox(slots=1, timeout_s=LONG, hide=(str(run_dir),), **MODES[mode]) as sb:
        if layer not in sb.layers:
            pytest.skip(f"no {layer} layer here")
        code = ("import os, numpy, tqdm\n"  # tqdm: a library of the venv that no zygote preloads
                f"for d in {[str(repo), str(repo / 'tests'), str(shared), str(run_dir)]!r}:\n"
                "    print(d, sorted(os.listdir(d)) if os.path.isdir(d) else 'absent')\n"
                f"print(os.path.exists({str(repo / 'reward.py')!r}), int(numpy.ones(3).sum()))\n"
                f"print(os.path.exists({str(answers)!r}))\n"
                "import sys\n"
                "held = [*sys.argv, *sys.path, sys.prefix, sys.executable, os.getcwd(), *os.environ.values(),\n"
                "        numpy.__file__, open('/proc/self/maps').read(), open('/proc/self/cmdline').read()]\n"
                f"print('named:', [h for h in held if {str(repo)!r} in h][:1],\n"
                f"      os.path.isdir({str(repo.parent)!r}) and {repo.name!r} in os.listdir({str(repo.parent)!r}))")
        r = sb.run(code)
    assert r.ok, tool_text(r)
    lines = tool_text(r).splitlines()
    assert lines[6] == "named: [] False", lines[6]
    assert not any(f"'{name}'" in lines[0] for name in ("reward.py", "tests", "train.py")), lines[0]  # only what runs
    assert all(line.endswith(" []") or line.endswith(" absent") for line in lines[1:4]), lines
    assert lines[4] == "False 3" and lines[5] == "False"


def test_the_fallback_runs_with_the_checkout_and_the_venv_under_tmp(tmp_path):
    """The fallback's mount namespace puts an empty tmpfs over /tmp: a venv or a checkout living there must be
    bound back (read-only, as bwrap does), or the zygote cannot import numpy. A real venv in tmp_path with numpy
    and sympy copied in, and the sandbox's files copied beside it, as a fresh clone in /tmp would have them."""
    if os.geteuid() != 0:
        pytest.skip("the fallback's mount namespace needs root")
    assert str(tmp_path).startswith("/tmp/")
    venv, checkout = tmp_path / "venv", tmp_path / "checkout"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = Path(__import__("numpy").__file__).resolve().parents[1]
    for name in ("numpy", "numpy.libs", "sympy", "mpmath"):
        if (here / name).is_dir():
            shutil.copytree(here / name, site / name, symlinks=True)
    checkout.mkdir()
    repo = Path(__file__).resolve().parents[1]
    shutil.copy(repo / "sandbox.py", checkout / "sandbox.py")
    (checkout / "machinery").mkdir()
    machinery = ["__init__.py", "sandbox_pool.py"] + [p.name for p in (repo / "machinery").glob("zygote*.py")]
    for name in machinery:  # the sandbox is these files: sandbox.py and its machinery
        if (repo / "machinery" / name).exists():
            shutil.copy(repo / "machinery" / name, checkout / "machinery" / name)
    (checkout / "reward.py").write_text("ANSWER = 42\n")
    (tmp_path / "go.py").write_text(
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from sandbox import Sandbox\n"
        "with Sandbox(slots=1, timeout_s=20.0, use_bwrap=False) as sb:\n"
        "    r = sb.run(f'import os, numpy, sympy; print(numpy.__file__, sympy.Integer(6) * 7, '\n"
        "               f'os.path.exists({sys.argv[1]!r}))')\n"
        "    print(sb.layers, r.ok, r.stdout, r.error_kind, r.exception_text)\n")
    out = subprocess.run([str(venv / "bin" / "python"), str(tmp_path / "go.py"), str(checkout)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'mountns'" in out.stdout and " True " in out.stdout, out.stdout + out.stderr[-2000:]
    assert f"{site}/numpy/__init__.py 42 False" in out.stdout, out.stdout  # the venv's numpy; no checkout


def test_syntax_error_shows_the_line(sb, contained):
    r = sb.run("x = 1\ny = (x +\nprint(y)")
    expect(r, "syntax", 'File "<cell>", line 2', "y = (x +", "SyntaxError")
    assert r.exception_type == "SyntaxError"


def test_library_frame_has_a_short_path(sb, contained):
    r = sb.run("import numpy as np\nm = np.zeros((2, 2))\nnp.linalg.inv(m)")
    expect(r, "exception", 'File "<cell>", line 3', "np.linalg.inv(m)", 'File "numpy/linalg/', "LinAlgError: Singular matrix")
    assert "site-packages" not in tool_text(r) and sys.prefix not in tool_text(r)
    assert tool_text(r).count('File "') == 2  # the cell frame and the innermost library frame only
    assert [f.filename for f in r.frames][0] == "<cell>" and r.frames[-1].filename.startswith("numpy/linalg/")


def test_killing_the_parent(sb, contained):
    r = sb.run("import os\nos.kill(os.getppid(), 9)\nprint('still here')")
    expect(r, "exception", "PermissionError")  # a slot uid cannot signal its zygote
    expect(sb.run("print('pool alive')"), "none", "pool alive")


def test_stdin_and_timeout_override(sb, contained):
    expect(sb.run("print(int(input()) * 2)", stdin="21\n"), "none", "42")
    r = sb.run("import time\ntime.sleep(0.2)\nprint('slow but fine')", timeout_s=LONG)
    expect(r, "none", "slow but fine")
    assert 0.2 <= r.duration_s < LONG


def test_a_cpu_time_limit_gives_the_same_verdict_on_a_loaded_machine():
    """clock="cpu" (train.py's default) counts the CPU time of the call: time off the CPU, which on a loaded
    machine is the other processes' turns (here a sleep, so that the test does not depend on this machine's
    load), does not count. A call that waits 1.5 s and then computes for 0.5 s passes its 1 s limit; on the wall
    clock (the control) it times out. A loop printing its CPU time stops at 1 s of it, a session's cell too, and
    code that only sleeps stops at the wall-clock backstop (WALL_BACKSTOP x the limit)."""
    code = ("import time\ntime.sleep(1.5)\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n"
            "    pass\nprint('done')")
    spin = ("import time\nwhile True:\n    t = time.process_time()\n    print(round(t, 2), flush=True)\n"
            "    while time.process_time() - t < 0.05:\n        pass")
    with Sandbox(slots=1, timeout_s=SHORT, clock="wall") as box:
        r = box.run(code)
        assert r.error_kind == "timeout", tool_text(r)
    with Sandbox(slots=1, timeout_s=SHORT, clock="cpu") as box:
        expect(box.run(code), "none", "done")
        r = box.run(spin)
        expect(r, "timeout", "the 1 s time limit")
        assert float(r.stdout.split()[-1]) < SHORT + 0.1, r.stdout.split()[-1]
        with box.session() as s:
            r = s.run("x = 1\n" + spin)
            expect(r, "timeout")
            assert float(r.stdout.split()[-1]) < SHORT + 0.1, r.stdout.split()[-1]
        r = box.run("import time\ntime.sleep(30)")
        expect(r, "timeout")
        assert SHORT * 2.5 < r.duration_s < SHORT * 3.5, r.duration_s


def zygote_pids(table: dict | None = None) -> list:
    """The zygotes below us: the topmost `python ... zygote.py --zygote` of each chain (its forks,
    the cells and session holders, share its command line; bwrap wrapping it does not count)."""
    table, found, todo = table or _ppids(), [], [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent:
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"--zygote" in argv and b"bwrap" not in argv[0]:
                    found.append(pid)  # do not descend: below are its forks
                else:
                    todo.append(pid)
    return found


def test_worker_killed_from_outside_is_respawned(sb, contained):
    # A zygote that dies between calls (OOM killer, a bug) is replaced; the caller never sees it.
    old = zygote_pids()
    assert len(old) >= 2
    kill_zygotes_and_wait()
    for i in range(4):
        expect(sb.run(f"print('after respawn', {i})"), "none", f"after respawn {i}")
    assert not set(zygote_pids()) & set(old)


def test_multiprocessing_works_and_leaves_nothing(sb, contained):
    code = ("from multiprocessing import Pool\nimport os\ndef sq(x):\n    return x * x\n"
            "with Pool(2) as p:\n    print(p.map(sq, range(5)))\nopen('/dev/shm/cleaner-left', 'w').write('x')")
    expect(sb.run(code, timeout_s=LONG), "none", "[0, 1, 4, 9, 16]")
    if private_shm(sb):  # the private /dev/shm is wiped between executions
        expect(sb.run("import os\nprint(os.listdir('/dev/shm'))"), "none", "[]")
        assert not os.path.exists("/dev/shm/cleaner-left")  # and not the host's
    else:
        os.unlink("/dev/shm/cleaner-left")


def test_bad_input_is_a_clear_error(sb):
    with pytest.raises(TypeError, match="code must be str"):
        sb.run(b"print(1)")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        sb.run("print(1)", timeout_s=0)


# ---- sessions

def test_session_state_and_rollback(sb, contained):
    with sb.session() as s:
        expect(s.run("x = 41\nimport math"), "none")
        expect(s.run("x + 1"), "none", "42")  # the value of a final expression is shown
        r = s.run("x = 100\n1 / 0")
        expect(r, "exception", 'File "<cell 3>", line 2', "ZeroDivisionError")
        expect(s.run("print(x)"), "none", "41")
        expect(s.run("x = 200\nwhile True:\n    pass", timeout_s=SHORT), "timeout")
        expect(s.run("print(x)"), "none", "41")
        expect(s.run("x = 300\nimport os\nos.abort()"), "crash", "SIGABRT")
        expect(s.run("print(x, math.pi > 3)"), "none", "41 True")
        expect(s.run("def f(n):\n    return 10 / n\ny = f(2)"), "none")
        r = s.run("f(0)")  # the frame of a function from an earlier cell shows its own line
        expect(r, "exception", "return 10 / n", "ZeroDivisionError")
        expect(s.run("print(x, y)"), "none", "41 5.0")


def test_session_keep_partial_effects(sb, contained):
    with sb.session(rollback=False) as s:
        expect(s.run("x = 1\ny = 2\n1 / 0"), "exception", "ZeroDivisionError")
        expect(s.run("print(x, y)"), "none", "1 2")


def test_sessions_are_isolated_and_close_cleanly(sb, victim):
    before = settled_count()
    a, b = sb.session(), sb.session()
    expect(a.run("secret_a = 'alpha'"), "none")
    expect(b.run("print('secret_a' in globals())"), "none", "False")
    if "uid" in sb.layers:  # b cannot touch a's processes either
        r = b.run("import os, signal\nn = 0\nfor p in os.listdir('/proc'):\n"
                  "    if p.isdigit() and os.stat(f'/proc/{p}').st_uid != os.getuid():\n"
                  "        try:\n            os.kill(int(p), signal.SIGKILL); n += 1\n        except OSError:\n            pass\n"
                  "print('killed', n)")
        expect(r, "none", "killed 0")
    expect(a.run("print(secret_a)"), "none", "alpha")
    assert live_descendants() > before  # the two holders
    a.close()
    b.close()
    assert settles_to(before)
    with pytest.raises(RuntimeError, match="closed"):
        a.run("print(1)")


def test_session_crash_of_its_own_holder(sb, contained):
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        # The cell kills the checkpoint it was forked from, then finishes: its state is kept.
        expect(s.run("import os\nx = 2\nos.kill(os.getppid(), 9)\nprint('done')"), "none", "done")
        expect(s.run("print(x)"), "none", "2")


SOCKET_FDS = ("import os, socket, stat\ndef is_socket(fd):\n    try:\n        return stat.S_ISSOCK(os.fstat(fd).st_mode)\n"
              "    except OSError:\n        return False\nsocks = [fd for fd in range(3, 256) if is_socket(fd)]\n")


def test_session_cells_that_meddle_with_the_control_socket(sb, contained):
    # Session processes talk to the zygote over sockets. A cell holds only its runner's, on which the
    # zygote sends and nobody else can: fd 3 is not a socket, and forks of a cell posing as the next
    # runner (on every socket they find) say nothing. A cell that closes that socket loses only its own state.
    before = settled_count()
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        expect(s.run("import os\nos.fstat(3)"), "exception", "OSError: [Errno 9] Bad file descriptor")
        pose = (SOCKET_FDS + "assert socks, 'the runner holds a socket'\nsent = 0\nfor _ in range(3):\n"
                "    if os.fork() == 0:\n        for fd in socks:\n            for msg in (f'runner {os.getpid()} 0', f'status {os.getpid()} 0'):\n"
                "                try:\n                    socket.socket(fileno=os.dup(fd)).send(msg.encode())\n                    sent += 1\n"
                "                except OSError:\n                    pass\n        print('sent', sent, flush=True)\n"
                "        import time; time.sleep(60)\nx = 2\nimport time; time.sleep(0.2)")
        r = s.run(pose)
        expect(r, "none", "sent 0\n")
        assert "sent 1" not in tool_text(r) and "sent 2" not in tool_text(r)
        for i in range(3):
            expect(s.run(f"x += 1\nprint(x)"), "none", str(3 + i))
        expect(s.run("x = 7"), "none")
        expect(s.run("print(x)"), "none", "7")
    for _ in range(8):  # the next cell may come while the dying session's processes exit: a race, tried 8 times
        with sb.session() as s:
            expect(s.run("x = 1"), "none")
            expect(s.run(SOCKET_FDS + "for fd in socks:\n    os.close(fd)\ny = 1"), "none")
            expect(s.run("print(x)"), "exception", "NameError", "state was lost")
            expect(s.run("x = 7\nprint(x)"), "none", "7")
    assert settles_to(before)


def test_session_whose_holder_is_slow_to_fork_its_runner(sb, contained):
    # A thread left by a cell holds the GIL for seconds (a regex in C), so the holder forks its next
    # runner late: the zygote must wait for that runner, not send a second "go" that the runner
    # would take (the cell came back as a false timeout or crash).
    with sb.session() as s:
        expect(s.run("x = 41\nimport threading, re\nt = threading.Thread(target=re.match, "
                     "args=(r'(a+)+$', 'a' * 26 + 'b'), daemon=True)\nt.start()"), "none")
        time.sleep(1.5)
        expect(s.run("x + 1"), "none", "42")
        expect(s.run("x + 2"), "none", "43")


def test_session_leftovers_are_swept(sb, contained):
    # A committed cell leaves a thread that forks whenever its holder runs; those children are not
    # runners and must not survive the next sweep. Nor may a lost session leave files in /dev/shm.
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        before = settled_count()
        expect(s.run("import threading, os, time\ndef bg():\n    while True:\n        time.sleep(0.002)\n"
                     "        if os.fork() == 0:\n            time.sleep(120)\n            os._exit(0)\n"
                     "threading.Thread(target=bg, daemon=True).start()"), "none")
        expect(s.run("1 / 0"), "exception")
        expect(s.run("print(x)"), "none", "1")
        assert settled_count(before) == before
    if private_shm(sb):  # otherwise /dev/shm is the host's, and not the sandbox's to wipe
        with sb.session() as s:
            r = s.run("open('/dev/shm/from_a_session', 'w').write('hi')\nimport os\nos.kill(os.getppid(), 9)\nos._exit(1)")
            expect(r, "crash", "state was lost")
        expect(sb.run("import os\nprint(os.listdir('/dev/shm'))"), "none", "[]")


def test_runs_and_cells_copy_ahead_the_pages_they_write(sb, contained):
    # Code runs in a fork, so each page it writes is first copied, on a fault. A session runner
    # copies ahead the pages the previous cell wrote while it waits, and a stateless spare the
    # pages a probe run wrote (sandbox._copy_ahead). The first cell of a session has nothing to
    # copy ahead: it shows what a sympy solve costs without, and the others must take a fraction.
    if tuple(int(v) for v in os.uname().release.split(".")[:2] if v.isdigit()) < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    code = ("import resource, sympy as sp\nf0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "x = sp.Symbol('x')\nr = sp.solve(x**2 - {}*x + {}, x)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, r)")
    with sb.session() as s:
        first = s.run(code.format(5, 6))
        expect(first, "none", "[2, 3]")
        faults = []
        for i in range(4, 7):
            time.sleep(0.5)  # the model generating: the runner copies meanwhile
            r = s.run(code.format(2 * i + 1, i * (i + 1)))
            expect(r, "none", f"[{i}, {i + 1}]")
            faults.append(int(r.stdout.split()[0]))
        expect(s.run("print(r)"), "none", "[6, 7]")  # the state is the session's, copy or not
    time.sleep(0.5)
    fork = sb.run(code.format(7, 12))
    expect(fork, "none", "[3, 4]")
    cold = int(first.stdout.split()[0])
    assert cold > 200, first.stdout
    assert min(faults) < cold / 4, (faults, cold)
    assert int(fork.stdout.split()[0]) < cold / 4, (fork.stdout, cold)


def kill_zygotes_and_wait() -> None:
    """Kill every zygote below us and wait until they and their bwrap wrappers are gone."""
    table, doomed = _ppids(), set()
    for pid in zygote_pids(table):
        os.kill(pid, 9)
        while pid != os.getpid():  # the zygote and its wrappers up to us
            doomed.add(pid)
            pid = table[pid][0]
    for _ in range(500):
        table = _ppids()
        if all(p not in table or table[p][1] == b"Z" for p in doomed):
            return
        time.sleep(0.01)
    raise AssertionError("killed zygotes did not exit")


def test_session_survives_a_zygote_restart_with_a_clear_note(sb, contained):
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        kill_zygotes_and_wait()
        r = s.run("print(x)")  # the worker is respawned; the state could not survive it
        expect(r, "exception", "NameError", "session state was lost")
        expect(s.run("x = 2"), "none")
        expect(s.run("print(x)"), "none", "2")
    for _ in range(sb.slots):  # revive the other workers too
        expect(sb.run("pass"), "none")


# ---- concurrency

def test_concurrent_callers_never_time_out_in_the_queue(sb, contained):
    # 4x more callers than slots, each needing 0.5 s of a 2 s budget: waiting for a slot must not count.
    async def main():
        sessions = [sb.session() for _ in range(4)]
        calls = [sb.arun(f"import time\ntime.sleep(0.5)\nprint({i})", timeout_s=2.0) for i in range(4)]
        calls += [s.arun(f"import time\ntime.sleep(0.5)\nprint({i})", timeout_s=2.0) for i, s in enumerate(sessions, 4)]
        results = await asyncio.gather(*calls)
        for s in sessions:
            s.close()
        return results
    results = asyncio.run(main())
    for i, r in enumerate(results):
        expect(r, "none", f"{i}\n")


# ---- the bare mode: no bwrap, no network namespace, no uid

def test_bare_mode_layers(bare, contained, listener):
    assert "seccomp" in bare.layers and "uid" not in bare.layers and "bwrap" not in bare.layers
    _network(bare, listener)  # seccomp refuses the socket
    expect(bare.run("print('started')\nwhile True:\n    pass", timeout_s=SHORT), "timeout", "started")
    r = bare.run("import subprocess\nsubprocess.Popen(['sleep', '1000.123'], start_new_session=True)\nprint('spawned')")
    expect(r, "none", "spawned")
    expect(bare.run("x = bytearray(10**11)"), "memory", "MemoryError")


def test_bare_mode_code_that_kills_its_zygote(bare, contained):
    # Without a separate uid the code can kill its own zygote: the pool respawns it, retries once,
    # and blames the code when it happens again.
    r = bare.run("import os\nos.kill(os.getppid(), 9)")
    expect(r, "crash", "the code killed the sandbox process")
    expect(bare.run("print('pool alive')"), "none", "pool alive")


# ---- channels and leftovers between executions, the kernel's surface (issue 16)
#
# Each hostile snippet must end safely, the next call must answer at once, and no process, file or SysV IPC
# object may be left: `contained` checks the first two, `no_ipc_left` the last (in every IPC namespace of the
# sandbox: bwrap gives each zygote its own, the other modes share the host's).

IPC_SCRIPT = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ns_pid, uid = int(sys.argv[1]), int(sys.argv[2])
if ns_pid:
    assert libc.setns(os.open(f"/proc/{ns_pid}/ns/ipc", os.O_RDONLY), 0x08000000) == 0, ctypes.get_errno()
if uid >= 0:  # plant a segment, a semaphore set and a message queue, owned by uid
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    ids = [libc.shmget(0, 4096, 0o1600), libc.semget(0, 1, 0o1600), libc.msgget(0, 0o1600)]
    assert min(ids) >= 0, ctypes.get_errno()
rows = []
for kind in ("shm", "sem", "msg"):
    head, *lines = open(f"/proc/sysvipc/{kind}").read().splitlines()
    col = head.split().index("uid")
    rows += [[kind, int(line.split()[1]), int(line.split()[col])] for line in lines]
print(json.dumps(rows))
"""


def sysv_ipc(ns_pid: int = 0, plant_uid: int = -1) -> list:
    """[kind, id, owner uid] of every SysV IPC object in the IPC namespace of process ns_pid (0: ours), after
    planting one of each kind owned by plant_uid (when >= 0). In a child process: joining a namespace is for good."""
    out = subprocess.run([sys.executable, "-c", IPC_SCRIPT, str(ns_pid), str(plant_uid)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def ipc_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/ipc").st_ino


def all_sandbox_ipc() -> set:
    """(namespace, kind, id) of every SysV IPC object in the IPC namespaces of the zygotes below us."""
    found = set()
    for ns, pid in {ipc_ns(z): z for z in zygote_pids()}.items():
        found |= {(ns, kind, i) for kind, i, _ in sysv_ipc(pid)}
    return found


@pytest.fixture
def no_ipc_left():
    before = all_sandbox_ipc()
    yield
    assert all_sandbox_ipc() <= before


def zygote_of_uid(uid: int, timeout_s: float = 5.0) -> int:
    """The zygote sharing its IPC namespace with a live process of uid (a slot's waiting child, a session's holder)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            try:
                status = Path(f"/proc/{name}/status").read_text() if name.isdigit() else ""
                if f"\nUid:\t{uid}\t" in status and "\nState:\tZ" not in status:
                    return next(z for z in zygote_pids() if ipc_ns(z) == ipc_ns(int(name)))
            except (OSError, StopIteration):
                pass  # it died meanwhile (a run's child being torn down)
        time.sleep(0.02)
    raise AssertionError(f"no live process runs as uid {uid}")


def answers_at_once(box, session=None) -> None:
    """The next call answers, and quickly (a busy or wedged zygote would take seconds)."""
    t0 = time.monotonic()
    r = (session or box).run("print(1)", timeout_s=LONG)
    assert r.ok and r.stdout == "1\n" and time.monotonic() - t0 < 2.0, (tool_text(r), time.monotonic() - t0)


IPC_CALLS = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "def show(name, r):\n    print(name, 'refused' if r == -1 else f'ALLOWED {r}', os.strerror(ctypes.get_errno()) if r == -1 else '')\n"
             "show('shmget', libc.shmget(0, 1 << 20, 0o1666))\nshow('semget', libc.semget(0, 1, 0o1666))\n"
             "show('msgget', libc.msgget(0, 0o1666))\nshow('mq_open', libc.mq_open(b'/cleaner-q', os.O_CREAT | os.O_RDWR, 0o666, None))\n")


def _ipc_refused(box):
    with box.session() as s:
        for r in (box.run(IPC_CALLS), s.run(IPC_CALLS)):
            expect(r, "none")
            text = tool_text(r)
            assert text.count("refused Operation not permitted") == 4 and "ALLOWED" not in text, text
        answers_at_once(box, s)
    answers_at_once(box)


def test_sysv_ipc_and_message_queues_are_refused(sb, contained, no_ipc_left):
    _ipc_refused(sb)


def test_bare_sysv_ipc_and_message_queues_are_refused(bare, contained, no_ipc_left):
    _ipc_refused(bare)


def test_ipc_objects_of_a_uid_are_removed_before_it_runs_again(sb, contained, no_ipc_left):
    """Were one made anyway (an architecture without the filter), what a uid owns is removed after each run,
    when its session closes and before the uid serves again: planted here from outside, with the uid."""
    if "uid" not in sb.layers:
        pytest.skip("needs a uid per slot and per session")
    with sb.session() as s:
        uid = int(s.run("import os\nprint(os.getuid())").stdout)
        zygote = zygote_of_uid(uid)
        sysv_ipc(zygote, uid)
        assert sum(owner == uid for _, _, owner in sysv_ipc(zygote)) == 3
    assert not [row for row in sysv_ipc(zygote) if row[2] == uid]  # the session is closed: its uid's are gone
    slot_uids = {int(sb.run("import os\nprint(os.getuid())").stdout) for _ in range(2 * sb.slots)}
    assert len(slot_uids) == sb.slots
    planted = {u: zygote_of_uid(u) for u in slot_uids}
    for u, z in planted.items():
        sysv_ipc(z, u)
    for _ in range(2 * sb.slots):  # one run on each slot removes its uid's after the run
        answers_at_once(sb)
    for u, z in planted.items():
        assert not [row for row in sysv_ipc(z) if row[2] == u]


def test_fallback_ipc_left_by_a_killed_zygote_is_removed_at_close(contained):
    """Without bwrap the IPC namespace is the host's: what a zygote killed before it could clean up leaves is
    removed by Sandbox.close(), by uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a uid per slot)")
    box = Sandbox(slots=1, timeout_s=LONG, use_bwrap=False)
    try:
        uid = int(box.run("import os\nprint(os.getuid())").stdout)
        sysv_ipc(0, uid)
        os.kill(box._pool.workers[0].proc.pid, 9)  # the zygote itself (no bwrap around it)
        box._pool.workers[0].proc.wait()
    finally:
        box.close()
    assert not [row for row in sysv_ipc(0) if row[2] == uid]


SOCKET_TRIES = (
    "import os, socket\nres = dict()\ndef tr(name, f):\n    try:\n        f()\n        res[name] = 'ALLOWED'\n"
    "    except OSError as e:\n        res[name] = type(e).__name__\n"
    "tr('unix', lambda: socket.socket(socket.AF_UNIX).bind('\\0cleaner-listen'))\n"
    "tr('inet', lambda: socket.socket(socket.AF_INET))\n"
    "tr('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))\n"
    "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "tr('pair-bind', lambda: a.bind('\\0cleaner-pair'))\n"
    "tr('pair-connect', lambda: a.connect({path!r}))\n"
    "tr('pair-sendto-path', lambda: a.sendto(b'x', {dgram!r}))\n"
    "tr('pair-sendto-abstract', lambda: a.sendto(b'x', {abstract!r}))\n"
    "tr('pair-sendmsg', lambda: a.sendmsg([b'x'], [], 0, {dgram!r}))\n"
    "b.close()\n"
    "tr('autobind', lambda: a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1))\n"
    "c, d = socket.socketpair()\nc.send(b'ok')\nprint('pair', d.recv(2))\n"
    "print(sorted(res.items()))\n")


def _sockets(box):
    """Point 7 and the abstract half of point 5: host sockets (a 0777 stream and datagram socket in /var/tmp,
    abstract ones) are out of reach, and no session can make a socket another can reach."""
    where = tempfile.mkdtemp(prefix="cleaner-sock-", dir="/var/tmp")
    os.chmod(where, 0o755)
    path, dgram, abstract = f"{where}/stream", f"{where}/dgram", f"\0cleaner-test-{os.getpid()}"
    lst, dg, alst = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), socket.socket(socket.AF_UNIX)
    try:
        lst.bind(path)
        dg.bind(dgram)
        alst.bind(abstract)
        for s, p in ((lst, path), (dg, dgram)):
            os.chmod(p, 0o777)
        lst.listen()
        alst.listen()
        for s in (lst, dg, alst):
            s.setblocking(False)
        code = SOCKET_TRIES.format(path=path, dgram=dgram, abstract=abstract)
        with box.session() as a, box.session() as b:
            for r in (box.run(code), a.run(code), b.run(code)):
                expect(r, "none", "pair b'ok'")
                text = tool_text(r)
                assert "ALLOWED" not in text and text.count("'PermissionError'") == 9, text
            answers_at_once(box, a)
        for s in (lst, alst):
            with pytest.raises(BlockingIOError):
                s.accept()
        with pytest.raises(BlockingIOError):
            dg.recv(16)
        answers_at_once(box)
    finally:
        for s in (lst, dg, alst):
            s.close()
        shutil.rmtree(where)


def test_sockets_reach_neither_the_host_nor_other_sessions(sb, contained, no_ipc_left):
    _sockets(sb)


def test_bare_sockets_reach_neither_the_host_nor_other_sessions(bare, contained, no_ipc_left):
    _sockets(bare)


def test_bwrap_hides_the_hosts_world_writable_folders_and_sockets(sb, contained):
    if not private_shm(sb):
        pytest.skip("needs bwrap or root's mount namespace")
    r = sb.run("import os\nprint([os.listdir(d) for d in ('/var/tmp', '/run', '/dev/shm') if os.path.isdir(d)])\n"
               "open('/var/tmp/x', 'w')")
    expect(r, "exception", "[[], ['sandbox'], []]")  # /run: only what the zygote runs from (sandbox.PLACED)
    assert r.exception_type in ("PermissionError", "OSError"), tool_text(r)


NAMESPACE_NRS = {  # name: (x86_64, aarch64)
    "unshare": (272, 97), "setns": (308, 268), "clone": (56, 220), "clone3": (435, 435), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "fsopen": (430, 430),
    "open_tree": (428, 428), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "kexec_load": (246, 104), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "memfd_create": (319, 279), "pidfd_getfd": (438, 438),
}
KERNEL_TRIES = """import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {nrs!r}
args = {{  # each call is well formed enough that only the filter stops it (a clone that got through exits at once)
    "unshare": [0x10000000 | 0x20000], "setns": [os.open('/proc/self/ns/net', os.O_RDONLY), 0],
    "clone": [0x10000000 | 17, 0, 0, 0, 0], "clone3": [ctypes.addressof(ctypes.create_string_buffer(88)), 88],
    "ptrace": [16, os.getppid(), 0, 0], "process_vm_readv": [os.getppid(), 0, 0, 0, 0, 0],
    "keyctl": [0, -3, 1], "add_key": [ctypes.c_char_p(b'user'), ctypes.c_char_p(b'k'), ctypes.c_char_p(b'v'), 1, -3],
    "request_key": [ctypes.c_char_p(b'user'), ctypes.c_char_p(b'k'), None, -3],
    "mount": [ctypes.c_char_p(b'none'), ctypes.c_char_p(b'/tmp'), ctypes.c_char_p(b'tmpfs'), 0, None],
    "umount2": [ctypes.c_char_p(b'/proc'), 2], "pivot_root": [ctypes.c_char_p(b'/tmp'), ctypes.c_char_p(b'/tmp')],
    "chroot": [ctypes.c_char_p(b'/')], "fsopen": [ctypes.c_char_p(b'tmpfs'), 0], "open_tree": [-100, ctypes.c_char_p(b'/'), 1],
    "bpf": [0, None, 0], "perf_event_open": [None, 0, -1, -1, 0], "userfaultfd": [0], "io_uring_setup": [1, None],
    "kexec_load": [0, 0, None, 0], "init_module": [None, 0, ctypes.c_char_p(b'')], "finit_module": [0, ctypes.c_char_p(b''), 0],
    "delete_module": [ctypes.c_char_p(b'loop'), 0x800], "memfd_create": [ctypes.c_char_p(b'x'), 0], "pidfd_getfd": [0, 0, 0],
}}
me = os.getpid()
out = []
for name, a in args.items():
    r = libc.syscall(NR[name], *[ctypes.c_long(v) if isinstance(v, int) else v for v in a])
    if os.getpid() != me:
        os._exit(0)
    out.append(f"{{name}}={{'ALLOWED' if r != -1 else errno.errorcode[ctypes.get_errno()]}}")
print(' '.join(out))
import threading, subprocess, concurrent.futures, multiprocessing, numpy, sympy
box = []
t = threading.Thread(target=lambda: box.append(sum(range(10))))
t.start(); t.join()
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    box += list(ex.map(abs, [-1, -2]))
pid = os.fork()
if pid == 0:
    os._exit(7)
box.append(os.waitpid(pid, 0)[1] >> 8)
box.append(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout.strip())
with multiprocessing.Pool(2) as pool:
    box.append(pool.map(abs, [-3, -4]))
box.append(str(sympy.solve(sympy.Symbol('x') ** 2 - 4)))
box.append(int(numpy.arange(5).sum()))
print('works', box)
"""


def _kernel_surface(box):
    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64"):
        pytest.skip("syscall numbers for x86_64 and aarch64 only")
    nrs = {k: v[machine == "aarch64"] for k, v in NAMESPACE_NRS.items()}
    code = KERNEL_TRIES.format(nrs=nrs)
    with box.session() as s:
        for r in (box.run(code), s.run(code)):
            expect(r, "none", "works [45, 1, 2, 7, 'sub', [3, 4], '[-2, 2]', 10]")
            got = dict(kv.split("=") for kv in r.stdout.splitlines()[0].split())
            assert got == {name: "ENOSYS" if name == "clone3" else "EPERM" for name in nrs}, got
        expect(s.run("import numpy as np\nprint(np.ones(3).sum())"), "none", "3.0")  # the session goes on
        answers_at_once(box, s)
    answers_at_once(box)


def test_namespaces_and_kernel_attack_surface_are_refused(sb, contained, no_ipc_left):
    _kernel_surface(sb)


def test_bare_namespaces_and_kernel_attack_surface_are_refused(bare, contained, no_ipc_left):
    _kernel_surface(bare)


def test_other_processes_are_invisible(sb, contained):
    """Point 8: the code sees its own processes only, never the trainer's command lines or another session's."""
    if "bwrap" not in sb.layers and "hidepid" not in sb.layers:
        pytest.skip("needs bwrap or root's /proc with hidepid")
    marker = subprocess.Popen(["sleep", "1000.789"])
    try:
        code = ("import os\nmine, others, hits = [], [], []\nfor p in os.listdir('/proc'):\n    if not p.isdigit():\n        continue\n"
                "    try:\n        (mine if os.stat(f'/proc/{p}').st_uid == os.getuid() else others).append(p)\n"
                "        hits += [p] if b'1000.789' in open(f'/proc/{p}/cmdline', 'rb').read() else []\n    except OSError:\n        pass\n"
                "child = os.fork()\nif child == 0:\n    import time\n    time.sleep(30)\n"
                "print('others', others, 'hits', hits, 'own', str(os.getpid()) in mine, os.path.exists(f'/proc/{child}'))\n"
                "os.kill(child, 9)")
        with sb.session() as a, sb.session() as b:
            for r in (sb.run(code), a.run(code)):
                expect(r, "none", "others [] hits [] own True True")
            a_pid = a.run("import os\nprint(os.getpid())").stdout.strip()
            expect(b.run(f"import os\nprint(os.path.exists('/proc/{a_pid}'))"), "none", "False")
        answers_at_once(sb)
    finally:
        marker.kill()
        marker.wait()


def test_memfd_and_dev_shm_cannot_hold_memory_beyond_the_limits(sb, contained, no_ipc_left):
    """Point 9: a memfd would hold memory outside RLIMIT_AS (refused); /dev/shm is a 64 MB tmpfs, wiped after use."""
    code = ("import os\ntry:\n    os.memfd_create('hog')\nexcept OSError as e:\n    print('memfd', type(e).__name__)\n"
            "n = 0\ntry:\n    with open('/dev/shm/hog', 'wb') as f:\n        for _ in range(200):\n"
            "            f.write(b'x' * (1 << 20))\n            f.flush()\n            n += 1\nexcept OSError as e:\n"
            "    print('shm', n, e.strerror)\n")
    with sb.session() as s:
        for r in (sb.run(code), s.run(code)):
            expect(r, "none", "memfd PermissionError")
            if private_shm(sb):
                assert "No space left on device" in tool_text(r) and int(r.stdout.split()[3]) <= 64, tool_text(r)
        for _ in range(sb.slots):
            expect(sb.run("import os\nprint(os.listdir('/dev/shm'))"), "none", "[]\n")
        answers_at_once(sb, s)
    if not private_shm(sb):
        os.unlink("/dev/shm/hog")


def test_bare_memfd_is_refused(bare, contained):
    expect(bare.run("import os\nos.memfd_create('hog')"), "exception", "PermissionError")
    answers_at_once(bare)


FLOOD = ("import os\nfor _ in range(6):\n    if os.fork() == 0:\n        while True:\n            for fd in range(3, 21):\n"
         "                try:\n                    os.write(fd, b'runner 1 0 status 1 0 ' * 50)\n"
         "                except OSError:\n                    pass\n")


def test_a_cell_flooding_every_fd_returns_at_its_deadline(sb, contained):
    """Point 2: a cell's forks write garbage to every fd 3..20 in a loop; the cell never holds a socket the
    zygote reads (its runner's is receive-only), so the call returns at its deadline and the next one at once."""
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        for _ in range(2):
            t0 = time.monotonic()
            expect(s.run(FLOOD + "import time\ntime.sleep(30)", timeout_s=0.5), "timeout")
            assert time.monotonic() - t0 < 1.5, time.monotonic() - t0
            answers_at_once(sb, s)
        # Forks flooding every socket they hold while their cell commits, and a thread left in the holder
        # flooding every socket it finds whenever the holder runs (the holder's own control socket among
        # them, which the zygote reads a bounded number of messages at a time): the state commits, and
        # later cells answer at once.
        commit = (SOCKET_FDS + "for _ in range(4):\n    if os.fork() == 0:\n        while True:\n            for fd in socks:\n"
                  "                try:\n                    os.write(fd, b'written 1 1')\n                except OSError:\n"
                  "                    pass\nimport threading\ndef flood():\n    while True:\n        for fd in range(3, 64):\n"
                  "            try:\n                if is_socket(fd):\n                    os.write(fd, b'runner 1 0')\n"
                  "            except OSError:\n                pass\n"
                  "threading.Thread(target=flood, daemon=True).start()\nx = 2")
        expect(s.run(commit), "none")
        for i in range(3):
            t0 = time.monotonic()
            expect(s.run(f"x += 1\nprint(x)"), "none", f"{3 + i}\n")
            assert time.monotonic() - t0 < 2.0, time.monotonic() - t0
    t0 = time.monotonic()
    expect(sb.run(FLOOD + "import time\ntime.sleep(30)", timeout_s=0.5), "timeout")
    assert time.monotonic() - t0 < 1.5, time.monotonic() - t0
    answers_at_once(sb)


def _hostile_mix(box, uid_layer: bool):
    """100 hostile calls mixing the snippets above (runs and the cells of two sessions); then a trivial call
    answers at once and every slot still works."""
    shm_fill = ("import os\ntry:\n    os.memfd_create('m')\nexcept OSError:\n    pass\ntry:\n    with open('/dev/shm/fill', 'wb') as f:\n"
                "        for _ in range(80):\n            f.write(b'x' * (1 << 20))\nexcept OSError:\n    pass\n")
    if not private_shm(box):
        shm_fill = "import os\nos.memfd_create('m')"  # the host's /dev/shm is not the sandbox's to fill
    snippets = [  # (code, timeout, kinds it may end with)
        (FLOOD + "import time\ntime.sleep(30)", 0.3, {"timeout"}),
        (IPC_CALLS, LONG, {"none"}),
        (SOCKET_TRIES.format(path="/var/tmp/nothing", dgram="/var/tmp/nothing", abstract="\0nothing"), LONG, {"none"}),
        (KERNEL_TRIES.split("import threading")[0].format(nrs={k: v[os.uname().machine == "aarch64"] for k, v in NAMESPACE_NRS.items()}),
         LONG, {"none"}),
        (shm_fill, LONG, {"none", "exception"}),
        ("import subprocess\nsubprocess.Popen(['sleep', '1000.123'], start_new_session=True)", LONG, {"none"}),
        ("print('x' * 100_000_000)", LONG, {"output_limit"}),
        ("x = bytearray(10**11)", LONG, {"memory"}),
        ("while True:\n    pass", 0.3, {"timeout"}),
        # a run's parent is its zygote (PermissionError); a cell's, its own checkpoint (killed: the cell's state is kept)
        ("import os\nos.kill(os.getppid(), 9)" if uid_layer else "def f():\n    f()\nf()", LONG, {"exception", "none"}),
        ("import os\nwhile True:\n    os.fork()" if uid_layer else "import os\nos.close(3)", 0.3, {"exception", "timeout", "none"}),
    ]
    sessions = [box.session(), box.session()]
    try:
        for i in range(100):
            code, timeout, kinds = snippets[i % len(snippets)]
            where = box if i % 3 == 0 else sessions[i % 2]
            r = where.run(code, timeout_s=timeout)
            assert r.error_kind in kinds, (i, r.error_kind, tool_text(r)[:500])
        for s in sessions:
            expect(s.run("print('session alive')"), "none", "session alive")
    finally:
        for s in sessions:
            s.close()
    answers_at_once(box)
    seen = set()
    for _ in range(2 * box.slots):  # free slots are taken in turn: each answers
        r = box.run("import os\nprint(os.getuid(), os.getppid())")
        expect(r, "none")
        seen.add(r.stdout)
    assert len(seen) == box.slots, seen
    with box.session() as s:
        expect(s.run("x = 1"), "none")
        expect(s.run("print(x + 1)"), "none", "2\n")


def test_a_hundred_hostile_calls_leave_every_slot_working(sb, contained, no_ipc_left):
    _hostile_mix(sb, "uid" in sb.layers)


def test_bare_a_hundred_hostile_calls_leave_every_slot_working(bare, contained, no_ipc_left):
    _hostile_mix(bare, False)
