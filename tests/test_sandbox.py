"""Adversarial tests of sandbox.py: every hostile snippet must end with the right kind, a useful
model-facing text, no process left behind and the host unchanged. Runs against real zygotes in
three containment modes: all layers (bwrap), root without bwrap (netns + uid), and a bare mode
(seccomp only, what a non-root user without bwrap gets)."""

import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox import ERROR_KINDS, ExecResult, Sandbox  # noqa: E402

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
    """A root-owned folder outside any scratch dir, visible in every mode (not under /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="cleaner-victim-", dir="/var/tmp"))
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


def expect(r: ExecResult, kind: str, *in_text: str) -> None:
    assert r.error_kind in ERROR_KINDS
    assert r.error_kind == kind, (r.error_kind, r.text)
    assert r.ok == (kind == "none")
    for s in in_text:
        assert s in r.text, (s, r.text)
    assert "sandbox.py" not in r.text  # our own frames never reach the model


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
    assert r.text.startswith("started\n")  # output before the kill is kept
    assert r.exception_type is None


def test_memory_limit(sb, contained):
    r = sb.run("print('before')\nx = bytearray(10**11)")
    expect(r, "memory", "before\n", "MemoryError", "line 2", f"{sb.memory_mb} MB")
    assert len(r.error_line.splitlines()) == 1
    # numpy (and a 200 MB array) still work under the limit
    expect(sb.run("import numpy as np\nprint(np.ones(25 * 10**6).sum())"), "none", "25000000.0")


def test_fork_bomb(sb, contained):
    if "uid" not in sb.layers:
        pytest.skip("fork bombs are only contained with a per-slot uid (RLIMIT_NPROC is not enforced for root)")
    r = sb.run("import os\nwhile True:\n    os.fork()", timeout_s=SHORT)
    # Which comes first depends on scheduling: the refused fork, or the timeout while 128
    # copies share 2 cores. Either way nothing survives (checked by `contained`).
    assert r.error_kind in ("exception", "timeout"), r.text
    if r.error_kind == "exception":
        expect(r, "exception", "BlockingIOError")
    assert sb.run("print('alive')").text == "alive\n"


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
    assert len(r.text) < 2 * sb.max_output_bytes + 1000


def test_a_forged_result_frame_is_cut(sb, contained):
    # The result frame comes from the code's own process (fd 3), so code can write one itself.
    code = ("import os, json, struct\nd = json.dumps({'kind': 'exception', 'exception_type': 'E',"
            " 'traceback': 'x' * 1_000_000, 'error_line': 'E: forged'}).encode()\n"
            "os.write(3, struct.pack('>I', len(d)) + d)\nos._exit(0)")
    r = sb.run(code)
    expect(r, "exception", "chars cut]")
    assert len(r.text) < 2 * sb.max_output_bytes + 1000 and r.error_line == "E: forged"


def test_code_cannot_pass_its_own_failure_off_as_the_sandboxs(sb, contained):
    """Each of these once ended as sandbox_internal, with the code run a second time and a traceback on the
    trainer's stderr; the third also skipped the wipe, so the next run saw this run's files."""
    expect(sb.run("import os\nos.kill(os.getpid(), 40)"), "crash", "signal 40")  # signal.Signals(40) raises
    nested = "import os, struct\nopen('left', 'w').write('x')\nd = b'[' * 200_000\n" \
             "os.write(3, struct.pack('>I', len(d)) + d)\nos._exit(3)"
    expect(sb.run(nested), "crash")  # json's RecursionError on the frame: a garbled frame, the code's failure
    for _ in range(4):  # both slots: the wipe ran
        assert sb.run("import os\nprint(os.listdir('.'))").text == "[]\n"
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
    assert any(s in r.text for s in refused), r.text
    if "bwrap" in sb.layers:  # the private /tmp is not the host's, and only scratch is writable in it
        r = sb.run("open('/tmp/cleaner-pwned.txt', 'w').write('x')")
        expect(r, "exception")
        assert any(s in r.text for s in refused), r.text
        assert not os.path.exists("/tmp/cleaner-pwned.txt")
    # the scratch dir is writable, and empty again for the next call
    expect(sb.run("open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())"), "none", "hi")
    expect(sb.run("import os\nprint(os.listdir('.'))"), "none", "[]")


def _network(box, contained_listener):
    lst, port = contained_listener
    r = box.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')")
    assert r.error_kind == "exception" and r.exception_type in ("ConnectionRefusedError", "PermissionError", "OSError"), r.text
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
    assert len(r.text.splitlines()) <= 20
    assert r.error_line == "RecursionError: maximum recursion depth exceeded"
    assert r.short_text == r.error_line


def test_echo_of_a_final_expression_only_when_asked(sb, contained):
    """The official tool prints the repr of a last bare expression (not None); ours is a script unless echo."""
    assert sb.run("x = 2 + 3\nx", echo=True).text == "5\n"
    assert sb.run("x = 2 + 3\nx").text == ""
    assert sb.run("'a' * 2", echo=True).text == "'aa'\n"
    assert sb.run("print(1)", echo=True).text == "1\n"  # print returns None: nothing more
    assert sb.run("x = 1", echo=True).text == ""


def test_a_deep_directory_tree_does_not_break_a_worker(sb, contained):
    """mkdir + chdir 1500 levels deep: shutil.rmtree's recursion would fail on it and leave the worker answering
    every later call with an internal error (and run() would execute the code twice). Each slot takes it."""
    where = ["."] + (["/dev/shm"] if "bwrap" in sb.layers else [])  # bwrap's /dev/shm is the sandbox's own
    for base in where:
        code = f"import os\nos.chdir({base!r})\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
        for _ in range(4):  # two slots, each more than once
            r = sb.run(code)
            assert r.ok and r.text == "deep\n", r.text
    r = sb.run("import os\nprint(sorted(os.listdir('.')), [n for n in os.listdir('/dev/shm') if n == 'd'])")
    assert r.ok and r.text == "[] []\n", r.text


def test_answers_graders_and_runs_are_hidden_from_the_code(tmp_path, contained):
    """A policy that reads the answer key would be rewarded for it: with bwrap, the checkout (reward.py, tests,
    run folders), the problem sets beside it, the caches and the caller's folders are empty to the code, while
    the interpreter and its libraries (a venv inside the checkout too) still work."""
    run_dir = tmp_path / "out"
    (run_dir / "rollouts").mkdir(parents=True)
    (run_dir / "rollouts" / "step_1.jsonl").write_text('{"answer": "42"}')
    with Sandbox(slots=1, timeout_s=LONG, hide=(str(run_dir),)) as sb:
        if "bwrap" not in sb.layers:
            pytest.skip("only bubblewrap can hide folders")
        repo = Path(__file__).resolve().parents[1]
        shared = repo.parent / "shared"
        code = ("import os, numpy\n"
                f"for d in {[str(repo), str(repo / 'tests'), str(shared), str(run_dir)]!r}:\n"
                "    print(d, sorted(os.listdir(d)) if os.path.isdir(d) else 'absent')\n"
                f"print(os.path.exists({str(repo / 'reward.py')!r}), int(numpy.ones(3).sum()))")
        r = sb.run(code)
    assert r.ok, r.text
    lines = r.text.splitlines()
    assert not any(f"'{name}'" in lines[0] for name in ("reward.py", "tests", "train.py")), lines[0]  # only what runs
    assert all(line.endswith(" []") or line.endswith(" absent") for line in lines[1:4]), lines
    assert lines[4] == "False 3"


def test_syntax_error_shows_the_line(sb, contained):
    r = sb.run("x = 1\ny = (x +\nprint(y)")
    expect(r, "syntax", 'File "<cell>", line 2', "y = (x +", "SyntaxError")
    assert r.exception_type == "SyntaxError"


def test_library_frame_has_a_short_path(sb, contained):
    r = sb.run("import numpy as np\nm = np.zeros((2, 2))\nnp.linalg.inv(m)")
    expect(r, "exception", 'File "<cell>", line 3', "np.linalg.inv(m)", 'File "numpy/linalg/', "LinAlgError: Singular matrix")
    assert "site-packages" not in r.text and sys.prefix not in r.text
    assert r.text.count('File "') == 2  # the cell frame and the innermost library frame only


def test_killing_the_parent(sb, contained):
    r = sb.run("import os\nos.kill(os.getppid(), 9)\nprint('still here')")
    expect(r, "exception", "PermissionError")  # a slot uid cannot signal its zygote
    expect(sb.run("print('pool alive')"), "none", "pool alive")


def test_stdin_and_timeout_override(sb, contained):
    expect(sb.run("print(int(input()) * 2)", stdin="21\n"), "none", "42")
    r = sb.run("import time\ntime.sleep(0.2)\nprint('slow but fine')", timeout_s=LONG)
    expect(r, "none", "slow but fine")
    assert 0.2 <= r.duration_s < LONG


def zygote_pids(table: dict | None = None) -> list:
    """The zygotes below us: the topmost `python ... sandbox.py --zygote` of each chain (its forks,
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
    if "bwrap" in sb.layers:  # the private /dev/shm is wiped between executions
        expect(sb.run("import os\nprint(os.listdir('/dev/shm'))"), "none", "[]")
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


def test_session_cells_that_meddle_with_the_control_socket(sb, contained):
    # Session processes talk to the zygote over fd 3, which the cell can reach. A fork of a cell
    # posing as the next runner is ignored; a cell that closes the socket loses only its own state.
    before = settled_count()
    with sb.session() as s:
        expect(s.run("x = 1"), "none")
        pose = ("import os, socket\nctl = socket.socket(fileno=os.dup(3))\nfor _ in range(3):\n"
                "    if os.fork() == 0:\n        ctl.send(f'runner {os.getpid()} 0'.encode())\n"
                "        ctl.send(f'status {os.getpid()} 0'.encode())\n        import time; time.sleep(60)\nx = 2")
        expect(s.run(pose), "none")
        for i in range(3):
            expect(s.run(f"x += 1\nprint(x)"), "none", str(3 + i))
        expect(s.run("x = 7"), "none")
        expect(s.run("print(x)"), "none", "7")
    for _ in range(8):  # the next cell may come while the dying session's processes exit: a race, tried 8 times
        with sb.session() as s:
            expect(s.run("x = 1"), "none")
            expect(s.run("import os\nos.close(3)\ny = 1"), "none")
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
    if "bwrap" in sb.layers:  # without bwrap /dev/shm is the host's, and not the sandbox's to wipe
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
