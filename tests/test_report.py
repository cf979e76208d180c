"""machinery/report.py in a real headless Chromium (Debian's, driven by Playwright), offline: the report of a small real
train.py run loads with no errors, shows every dumped trajectory and SAAR event, opens an event on its failed
call and error, and its filters count; a damaged copy of the run (a cut metrics line, an empty rollouts file, no
eval files, markup and a closing script tag in a response) still builds, and shows that markup as text.

The run: the demo's model and warm start (built once per machine and code, cached, as `python train.py` does),
two GRPO steps of 1 prompt x 4 samples, every rollout dumped, 1 held-out problem with test-time SAAR off and
on. No browser here (no /usr/bin/chromium, or no playwright): skipped, unless CLEANER_REQUIRE_BROWSER=1 (CI).

The README's picture is this test's screenshot of the demo's run: `CLEANER_REPORT_RUN=out/demo python -m pytest
tests/test_report.py` checks that run's report instead and writes docs/img/report.png (otherwise it goes to a
temporary folder).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from machinery import report

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
LAUNCH = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
          "--disable-component-update", "--disable-sync"]
RUN = ["--prompts-per-step", "1", "--samples-per-prompt", "4", "--mini-batch-prompts", "1", "--steps", "2",
       "--dump-rollouts", "4", "--eval-size", "1", "--eval-saar", "both", "--sandbox-slots", "1", "--seed", "0"]
EVIL = "</script><script>window.pwned=1</script> <b>html</b> <!-- "
SHOT = ROOT / "docs" / "img" / "report.png"


@pytest.fixture(scope="module")
def browser():
    why = None
    if not os.path.exists(CHROMIUM):
        why = f"no browser at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            why = "playwright is not installed (pip install -r requirements.txt)"
    if why:
        if os.environ.get("CLEANER_REQUIRE_BROWSER") == "1":
            pytest.fail(why + ", and CLEANER_REQUIRE_BROWSER=1")
        pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH)
        yield b
        b.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    if os.environ.get("CLEANER_REPORT_RUN"):
        given = Path(os.environ["CLEANER_REPORT_RUN"]).resolve()
        assert (given / "metrics.jsonl").is_file(), f"CLEANER_REPORT_RUN={given}: not a run folder (no metrics.jsonl)"
        return given
    out = tmp_path_factory.mktemp("report")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONHASHSEED": "0"}
    r = subprocess.run([sys.executable, "train.py", *RUN, "--out-dir", str(out), "--run-name", "r"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return out / "r"


def dumped(run: Path) -> dict[int, list[dict]]:
    return {int(p.stem[5:]): [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
            for p in sorted((run / "rollouts").glob("step_*.jsonl"))}


class Page:
    """A page of the browser that records what went wrong in it, and every request that left the file."""

    def __init__(self, browser, path: str):
        self.page = browser.new_page(viewport=dict(width=1280, height=900))
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

        def route(r):  # offline: anything but the file itself (and its data: images) is refused, and noted
            if r.request.url.startswith(("file:", "data:")):
                return r.continue_()
            self.requests.append(r.request.url)
            return r.abort()
        self.page.route("**/*", route)
        self.page.goto(Path(path).as_uri())

    def count(self) -> tuple[int, int]:
        d = self.page.eval_on_selector("#count", "e => [e.dataset.trajs, e.dataset.events]")
        return int(d[0]), int(d[1])

    def pick(self, **f):
        """Set the filters (step, kind, reward, problem: an option's value; saar: checked) and read the count."""
        p = self.page
        p.set_checked("#f-saar", bool(f.get("saar")))
        for k in ("step", "kind", "reward", "problem"):
            p.select_option(f"#f-{k}", str(f.get(k, "")))
        return self.count()


def stale(t: dict, e: dict) -> bool:
    """A later retry of the turn replaced the event's text: its `at` no longer holds it."""
    into = e.get("replacement", e.get("regenerated"))
    return bool(e.get("at")) and into is not None and t["response"][slice(*e["at"])] != into


def both_ways(a: str | None, b: str | None) -> bool:
    """A character diff from a to b both removes and adds: neither is a subsequence of the other."""
    def sub(x, y):
        it = iter(y)
        return all(c in it for c in x)
    return a is not None and b is not None and not sub(a, b) and not sub(b, a)


def open_event(page: Page, step: int, idx: int, k: int):
    """Show that step's trajectories with events, open trajectory idx and its k-th event: (the card, the head)."""
    page.pick(saar=True, step=step)
    card = page.page.locator(f'details.traj[data-step="{step}"][data-idx="{idx}"]')
    card.locator("summary").click()
    card.locator(".resp").wait_for()  # the body is built on the toggle event, after the click
    head = card.locator(".ev-head").nth(k)
    head.click()
    card.locator(".ev-body").wait_for()
    return card, head


def check_run_report(browser, run: Path, shot: Path | None = None):
    steps = dumped(run)
    trajs = [t for rows in steps.values() for t in rows]
    events = [e for t in trajs for e in t["saar_events"]]
    assert events, "the run made no SAAR event: the test needs a run that does"
    page = Page(browser, report.write(str(run)))
    p = page.page
    assert page.count() == (len(trajs), len(events))
    assert p.locator("details.traj").count() == len(trajs)
    # the filters: SAAR only, a decision, the step picker, and two at once
    def expect(keep):
        kept = [t for t in trajs if keep(t)]
        return len(kept), sum(len(t["saar_events"]) for t in kept)
    kind, step, problem = events[0]["kind"], min(steps), trajs[0]["meta"]["problem_id"]
    counts = [page.pick(saar=True), page.pick(kind=kind), page.pick(step=step), page.pick(saar=True, step=step),
              page.pick(reward="pos"), page.pick(problem=problem)]
    assert counts == [expect(lambda t: t["saar_events"]), expect(lambda t: any(e["kind"] == kind for e in t["saar_events"])),
                      expect(lambda t: t in steps[step]), expect(lambda t: t in steps[step] and t["saar_events"]),
                      expect(lambda t: t["reward"] > 0), expect(lambda t: t["meta"]["problem_id"] == problem)]
    assert set(counts) != {(len(trajs), len(events))}  # some filter left some out
    # an event opened: the failed call and the error the model saw, struck through, beside what replaced them
    found = [(s, i, k, e) for s, rows in steps.items() for i, t in enumerate(rows) for k, e in enumerate(t["saar_events"])]
    fresh = [f for f in found if not stale(steps[f[0]][f[1]], f[3])]  # its text still in the final response
    live = [f for f in fresh if f[3]["kind"] in ("shallow", "deep") and both_ways(f[3].get("failed"), f[3].get("replacement"))]
    # a shallow one if any (the paper's own case: the reasoning kept, the call swapped), the shortest: one screen
    s, i, k, e = min(live or fresh or found, key=lambda f: (f[3]["kind"] != "shallow", len(steps[f[0]][f[1]]["response"])))
    card, head = open_event(page, s, i, k)
    body = card.locator(".ev-body")
    assert body.is_visible()
    assert body.locator("del.failed").text_content() == e["failed"]
    assert body.locator("del.error").text_content() == e["error"]
    decision = body.locator(".decision").text_content()
    assert e["kind"] in decision
    if isinstance(e.get("similarity"), float) and e.get("gamma") is not None:
        assert f"similarity {e['similarity']:.3f} {'≥' if e['similarity'] >= e['gamma'] else '<'} γ {e['gamma']}" in decision
    into = e.get("replacement", e.get("regenerated"))
    if into is not None:  # the character diff: its kept and removed parts are the failed turn, kept and added the new
        assert body.locator("pre.ins").text_content() == into
        side = "p => [...p.children].filter(n => n.tagName !== '%s').map(n => n.textContent).join('')"
        assert body.locator("pre.diff").evaluate(side % "INS") == e["failed"]
        assert body.locator("pre.diff").evaluate(side % "DEL") == into
    if e.get("at") and not stale(steps[s][i], e):  # its text in the response lights up
        assert "".join(card.locator("span.at.hl").all_text_contents()) == steps[s][i]["response"][slice(*e["at"])]
    old = [f for f in found if stale(steps[f[0]][f[1]], f[3])]
    if old:  # an event whose text a later retry replaced: said, and not lit up in the response
        c, _ = open_event(page, *old[0][:3])
        assert "replaced this text again" in c.locator(".ev-body").text_content()
        assert c.locator("span.at.hl").count() == 0
        page.pick(saar=True, step=s)
        card, head = open_event(page, s, i, k)
    t = steps[s][i]
    # masked text told apart from trained text, exactly as the record's ranges say
    if t.get("masked") is not None:
        resp = t["response"]
        cut = [0] + [c for r in t["masked"] for c in r] + [len(resp)]
        trained = "".join(resp[a:b] for a, b in zip(cut[::2], cut[1::2]))
        assert "".join(card.locator(".resp span.m").all_text_contents()) == "".join(resp[a:b] for a, b in t["masked"])
        assert "".join(card.locator(".resp span.t").all_text_contents()) == trained
    # the held-out records: a table per kind of problems by eval step, the pass rates; a cell opens its samples' turns
    evals = {int(f.stem[9:]): [json.loads(x) for x in f.read_text().splitlines()] for f in sorted(run.glob("eval_step*.jsonl"))}
    kinds = sorted({r["eval"] for rows in evals.values() for r in rows})
    tables = p.eval_on_selector_all("#evals table", "ts => ts.map(t => [...t.rows].map(r => [...r.cells].map(c => c.textContent)))")
    assert kinds and sorted(t[0][0] for t in tables) == kinds

    def rate(kind, step, pid=None):
        rows = [r for r in evals[step] if r["eval"] == kind and pid in (None, r["id"])]
        return f"{sum(r['ok'] for r in rows)}/{len(rows)}" if rows else ""
    for (kind, *head), *body in tables:
        assert head == [f"step {st}: {rate(kind, st)}" for st in evals]
        ids = sorted({r["id"] for rows in evals.values() for r in rows if r["eval"] == kind})
        assert body == [[pid] + [rate(kind, st, pid) for st in evals] for pid in ids]
    p.locator("#evals td.cell").first.click()
    assert p.locator("#eval-view .resp").count() >= 1
    if shot is not None:  # an expanded event, for the README of the report
        card.evaluate("e => e.scrollIntoView({block: 'start'})")
        p.evaluate("window.scrollBy(0, -60)")  # below the filters' bar: the response, its spliced text lit, the event
        shot.parent.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(shot))
    assert page.errors == [] and page.requests == []
    p.close()


def check_damaged_report(browser, run: Path, tmp: Path):
    """A cut last metrics line, an empty rollouts file, no eval files, markup and a closing script tag in a response."""
    copy = tmp / "damaged"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("ckpt.pt", "hf"))  # the page reads neither (1.4 GB)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    (copy / "metrics.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][:len(lines[-1]) // 2]]))
    steps = dumped(copy)
    first, last = min(steps), max(steps)
    (copy / "rollouts" / f"step_{last:06d}.jsonl").write_text("")
    rows = steps[first]
    rows[0]["response"] += EVIL
    rows[0]["prompt"] = EVIL + rows[0]["prompt"]
    (copy / "rollouts" / f"step_{first:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for f in copy.glob("eval_step*.jsonl"):
        f.unlink()
    path = report.write(str(copy))
    html = Path(path).read_text()
    assert "window.pwned" in html and "<script>window.pwned" not in html  # the data is there, escaped
    page = Page(browser, path)
    p = page.page
    assert p.evaluate("typeof window.pwned") == "undefined"
    assert page.count()[0] == sum(len(r) for st, r in steps.items() if st != last)  # the emptied step has none
    notes = p.locator("#notes").text_content()
    assert f"metrics.jsonl:{len(lines)}: not JSON" in notes and f"step {last}: no rollouts" in notes
    assert "no held-out records" in notes and p.locator("#evals table").count() == 0
    assert p.locator("#figs img").count() > 0  # the curves from the lines that were whole
    card = p.locator("details.traj").first
    card.locator("summary").click()
    card.locator(".resp").wait_for()  # the body is built on the toggle event, after the click
    shown = card.text_content()
    for s in ("</script><script>window.pwned=1</script>", "<b>html</b>", "<!--"):
        assert s in shown and shown.count(s) >= 2, s  # in the prompt and in the response, as text
    assert p.locator("details.traj b", has_text="html").count() == 0  # no element made of it
    assert p.evaluate("typeof window.pwned") == "undefined"
    assert page.errors == [] and page.requests == []
    p.close()


def test_report_of_a_real_run(browser, run, tmp_path):
    shot = SHOT if os.environ.get("CLEANER_REPORT_RUN") else tmp_path / "report.png"
    check_run_report(browser, run, shot=shot)
    assert 10_000 < shot.stat().st_size < 300_000


def test_report_of_a_damaged_run(browser, run, tmp_path):
    check_damaged_report(browser, run, tmp_path)
