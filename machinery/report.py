"""machinery/report.py: one static HTML page of a train.py run folder, to read a run's curves, rollouts and SAAR's edits.

    python -m machinery.report out/RUN [out/RUN ...]   # writes out/RUN/report.html; train.py calls write(out) itself

A run folder holds its figures as lines of JSON; reading what SAAR did to a trajectory (which call failed, what
error the model saw, what replaced it, and what is trained on) means matching offsets by hand. The page shows
it: the curves (machinery/plots.py, the PNGs of scripts/plot_runs.py, embedded), every dumped trajectory turn by
turn with the masked (not trained on) text told apart, each SAAR event's failed call and error struck through
beside the text spliced in, with a character diff, and the held-out records per problem. Filters pick
trajectories by step, SAAR decision, reward and problem.

One file that opens from disk with no network: the data is JSON inside the page (with <, > and & escaped, so
that no text of the model's can close the script element), and the page's script writes every text of the
model's with textContent, never as HTML. Built from the run folder alone; bad lines and missing files are
skipped, and the page says which.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import sys
import time

from machinery import plots


def safely(run_dir: str) -> str:
    """write, for train.py: what to print of it. A page that fails to build must never cost a run."""
    try:
        return f"{write(run_dir)} (open it in a browser)"
    except Exception as e:  # noqa: BLE001
        return f"not written ({type(e).__name__}: {e}); python -m machinery.report {run_dir} tries again"


def write(run_dir: str) -> str:
    """Build <run_dir>/report.html from the run folder alone; returns its path. Written to a temp file and
    renamed, so that a reader (or a run calling this after each eval) never sees half a page."""
    notes: list[str] = []
    name = os.path.basename(os.path.normpath(run_dir))
    metrics = []
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        metrics = plots.read_metrics(run_dir, warn=lambda m: notes.append(m.replace(run_dir.rstrip("/") + "/", "")))
    else:
        notes.append("no metrics.jsonl: no curves")
    steps, trajs = _rollouts(run_dir, notes, [r["step"] for r in metrics if isinstance(r["step"], int) and r["step"]])
    data = dict(run=name, built=time.strftime("%Y-%m-%d %H:%M:%S"), info=_info(run_dir, notes), notes=notes,
                figures=_figures(name, metrics), steps=steps, trajs=trajs, evals=_evals(run_dir, notes))
    blob = json.dumps(_finite(data), separators=(",", ":"))  # ASCII: a lone surrogate can't break the file
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    path = os.path.join(run_dir, "report.html")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(PAGE.replace("__DATA__", blob))
    os.replace(path + ".tmp", path)
    return path


def _finite(x):
    """NaN and infinities as null: JSON.parse knows no NaN (a similarity can be NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _jsonl(path: str, notes: list[str]) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                notes.append(f"{os.path.basename(path)}:{i}: not a JSON object, skipped (a run killed mid-write?)")
    return rows


def _info(run_dir: str, notes: list[str]) -> dict:
    info = {}
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            run = json.load(f)
        info = dict(model=run.get("args", {}).get("model"), seed=run.get("seed"), commit=(run.get("commit") or "")[:10],
                    started=run.get("time"))
    except (OSError, ValueError, AttributeError):
        notes.append("no readable run.json")
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            info["summary"] = [str(x) for x in json.load(f).get("lines", [])]
    except (OSError, ValueError, AttributeError):
        pass  # a run still going has none yet
    return info


def _figures(name: str, metrics: list[dict]) -> list[dict]:
    """The figures (machinery/plots.py) of this one run (an arm of one seed), as base64 PNGs."""
    out = []
    for figure in plots.FIGURES:
        fig = plots.draw(figure, {name: [name]}, {name: metrics})
        if fig is None:
            continue
        import matplotlib.pyplot as plt  # draw() has chosen the Agg backend
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)
        out.append(dict(name=figure[0], title=figure[2], png=base64.b64encode(buf.getvalue()).decode()))
    return out


MAX_STEPS = 30  # dumped steps whose rollouts the page embeds


def _rollouts(run_dir: str, notes: list[str], metric_steps: list[int]) -> tuple[list[int], list[dict]]:
    """(steps with a rollouts file, every dumped trajectory with its step and its index in that file)."""
    folder, steps, trajs = os.path.join(run_dir, "rollouts"), [], []
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    found = [(n, re.fullmatch(r"step_(\d+)\.jsonl", n)) for n in names]
    found = [(n, int(m.group(1))) for n, m in found if m]
    if len(found) > MAX_STEPS:  # a long run's page stays a page: its last steps' rollouts (all are in rollouts/)
        notes.append(f"rollouts of the last {MAX_STEPS} of {len(found)} dumped steps (the rest: {folder})")
        found = found[-MAX_STEPS:]
    for name, step in found:
        rows = _jsonl(os.path.join(folder, name), notes)
        if not rows:
            notes.append(f"step {step}: no rollouts in {name}")
        steps.append(step)
        trajs += [dict(r, step=step, idx=i) for i, r in enumerate(rows)]
    missing = sorted(set(metric_steps) - set(steps))
    if missing:
        notes.append("no rollouts file for step(s) " + ", ".join(map(str, missing)))
    return steps, trajs


def _evals(run_dir: str, notes: list[str]) -> list[dict]:
    names = sorted(n for n in os.listdir(run_dir) if re.fullmatch(r"eval_step\d+\.jsonl", n))
    if not names:
        notes.append("no held-out records (eval_step*.jsonl)")
    return [dict(step=int(n[9:-6]), rows=_jsonl(os.path.join(run_dir, n), notes)) for n in names]


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>run report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.4em; margin: .2em 0; } h2 { font-size: 1.15em; margin: 1.2em 0 .4em; border-bottom: 1px solid #ccc; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2em 0; font: 12.5px/1.35 ui-monospace, monospace; }
.notes { color: #8a4b00; } .muted { color: #777; }
.figs img { width: 300px; margin: 0 6px 6px 0; border: 1px solid #ddd; }
.filters { position: sticky; top: 0; background: #f6f6f6; padding: .5em; border: 1px solid #ddd; z-index: 1; }
.filters label { margin-right: 1em; }
details.traj { border: 1px solid #ccc; border-radius: 4px; margin: .4em 0; padding: .2em .6em; }
details.traj > summary { cursor: pointer; }
.turn { border-left: 4px solid #4a8; padding-left: .5em; margin: .4em 0; }
.turn.tool { border-color: #999; } .turn .who { font-size: 11px; color: #666; }
span.m { color: #666; background: #eee; } span.at { border-bottom: 2px solid #d90; } span.at.hl { background: #fd8; }
.legend span { padding: 0 .4em; margin-right: .6em; }
table { border-collapse: collapse; margin: .3em 0; }
td, th { border: 1px solid #ddd; padding: 1px 6px; vertical-align: top; }
.event { border: 1px solid #d90; border-radius: 4px; margin: .3em 0; }
.ev-head { cursor: pointer; background: #fff6e0; padding: .2em .5em; }
.ev-body { padding: .3em .5em; } .cols { display: flex; gap: 1em; } .cols > div { flex: 1; min-width: 0; }
del, .del { background: #fdd; color: #900; } ins, .ins { background: #dfd; color: #060; text-decoration: none; }
.pass { background: #dfd; } .fail { background: #fdd; } .part { background: #ffd; } td.cell { cursor: pointer; }
#eval-view { scroll-margin-top: 3.5em; }
</style></head><body>
<h1 id="title"></h1><div id="info" class="muted"></div><ul id="summary"></ul><ul id="notes" class="notes"></ul>
<h2>Curves</h2><div id="figs" class="figs"></div>
<h2>Trajectories</h2>
<div class="filters">
 <label>step <select id="f-step"><option value="">all</option></select></label>
 <label><input type="checkbox" id="f-saar"> only with SAAR events</label>
 <label>decision <select id="f-kind"><option value="">any</option></select></label>
 <label>reward <select id="f-reward"><option value="">any</option><option value="pos">&gt; 0</option>
  <option value="neg">&le; 0</option></select></label>
 <label>problem <select id="f-problem"><option value="">all</option></select></label>
 <b id="count"></b>
</div>
<p class="legend"><span>trained on</span><span class="m">masked (loss mask 0)</span>
 <span class="at">placed by SAAR (spliced in, or regenerated after an error)</span></p>
<div id="trajs"></div>
<h2>Held-out evaluation</h2><div id="evals"></div><div id="eval-view"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
// every text from the run goes through textContent (el), never innerHTML: it is data, not markup
const D = JSON.parse(document.getElementById("data").textContent), $ = (id) => document.getElementById(id);
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function row(cells, tag = "td") {  // cells: texts, or elements to put in a cell as they are
  const tr = el("tr");
  for (const c of cells) {
    const td = el(tag);
    if (c instanceof Node) td.append(c); else td.textContent = String(c ?? "");
    tr.append(td);
  }
  return tr;
}
const struck = (cls, text) => { const pre = el("pre"); pre.append(el("del", cls, text)); return pre; };
const num = (x, d) => (typeof x === "number" && isFinite(x) ? x.toFixed(d) : "n/a");
const KINDS = ["shallow", "deep", "given_up", "answered", "gated"];
const WHY = {shallow: "shallow: kept the failed turn's reasoning, took the new call",
  deep: "deep: the new turn replaced the failed one whole",
  given_up: "gave up: the last failed attempt and its error stay; SAAR off for the rest of the trajectory",
  answered: "answered: the new turn has no call, so the failed turn and its error stay and the answer follows; SAAR off",
  gated: "gated: the replacement was unlikely on the clean context; the error stays and the new turn follows"};
const evs = (t) => Array.isArray(t.saar_events) ? t.saar_events.filter((e) => e && typeof e === "object") : [];
// where an event's text sits in the response: `at`, unless a later retry of the turn replaced that text again
const placed = (t, e) => {
  const r = clip(e.at, String(t.response ?? "").length), into = e.replacement ?? e.regenerated;
  return r && (into == null || String(t.response).slice(r[0], r[1]) === into) ? r : null;
};
const pid = (t) => String((t.meta && (t.meta.problem_id ?? t.meta.id)) ?? "?");

// header, notes, curves
$("title").textContent = "run " + D.run; document.title = "run report: " + D.run;
const I = D.info || {};
$("info").textContent = `model ${I.model ?? "?"} · seed ${I.seed ?? "?"} · commit ${I.commit || "?"} · ` +
  `started ${I.started ?? "?"} · report built ${D.built}`;
for (const line of I.summary || []) $("summary").append(el("li", "", line));
for (const n of D.notes) $("notes").append(el("li", "", n));
for (const f of D.figures) {
  const img = el("img");
  img.src = "data:image/png;base64," + f.png;
  img.alt = img.title = f.title;
  $("figs").append(img);
}
if (!D.figures.length) $("figs").append(el("p", "muted", "no curves"));

// the response, cut at turn starts, masked ranges and SAAR's spliced ranges; each piece one span
function clip(r, n) {  // a [c0, c1] range within a text of n characters, or null
  const ok = Array.isArray(r) && r.length === 2 && r.every(Number.isFinite) && r[0] < r[1];
  return ok ? [Math.max(0, r[0]), Math.min(n, r[1])] : null;
}
function response(t) {
  const s = String(t.response ?? ""), box = el("div", "resp");
  const masked = Array.isArray(t.masked) ? t.masked.map((r) => clip(r, s.length)).filter(Boolean) : null;
  const ats = evs(t).map((e, i) => [placed(t, e), i]).filter((x) => x[0]);
  const starts = [0], cuts = new Set([0, s.length]), re = /<\|im_start\|>(\w+)\n/g;
  for (let m; (m = re.exec(s));) if (m.index > 0) starts.push(m.index);
  for (const c of starts) cuts.add(c);
  for (const r of (masked || []).concat(ats.map((x) => x[0]))) { cuts.add(r[0]); cuts.add(r[1]); }
  const cs = [...cuts].sort((a, b) => a - b);
  if (!masked) box.append(el("p", "muted", "this run did not record which characters are masked"));
  let pre = null, turn = -1, assistant = 0;
  for (let k = 0; k + 1 < cs.length; k++) {
    const a = cs[k], b = cs[k + 1];
    if (turn + 1 < starts.length && a >= starts[turn + 1]) {  // a new turn begins here
      turn++;
      const head = s.slice(a, a + 40), role = turn === 0 ? "assistant" : (/^<\|im_start\|>(\w+)/.exec(head) || [, "?"])[1];
      const tool = role !== "assistant", div = el("div", "turn" + (tool ? " tool" : ""));
      div.append(el("div", "who", tool ? `${role}: tool output` : `assistant turn ${assistant++}`), (pre = el("pre")));
      box.append(div);
    }
    const span = el("span", masked && masked.some((r) => r[0] <= a && b <= r[1]) ? "m" : "t", s.slice(a, b));
    const hit = ats.filter((x) => x[0][0] <= a && b <= x[0][1]).map((x) => x[1]);
    if (hit.length) { span.classList.add("at"); span.dataset.ev = hit.join(" "); }
    pre.append(span);
  }
  return box;
}

// a character diff: common prefix and suffix, then an LCS table on what is left, when it is small enough
function diff(a, b) {
  let p = 0, q = 0;
  while (p < a.length && p < b.length && a[p] === b[p]) p++;
  while (q < a.length - p && q < b.length - p && a[a.length - 1 - q] === b[b.length - 1 - q]) q++;
  const x = a.slice(p, a.length - q), y = b.slice(p, b.length - q), ops = [["=", a.slice(0, p)]];
  const push = (o, c) => { const l = ops[ops.length - 1]; if (l[0] === o) l[1] += c; else ops.push([o, c]); };
  if (x.length * y.length > 4e6) { push("-", x); push("+", y); ops.big = true; }
  else {
    // L(i, j): the longest common subsequence of x[i:] and y[j:]
    const n = x.length, m = y.length, T = new Uint16Array((n + 1) * (m + 1)), L = (i, j) => T[i * (m + 1) + j];
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
      T[i * (m + 1) + j] = x[i] === y[j] ? L(i + 1, j + 1) + 1 : Math.max(L(i + 1, j), L(i, j + 1));
    let i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && x[i] === y[j]) { push("=", x[i]); i++; j++; }
      else if (i < n && (j === m || L(i + 1, j) >= L(i, j + 1))) push("-", x[i++]);
      else push("+", y[j++]);
    }
  }
  push("=", a.slice(a.length - q));
  const pre = el("pre", "diff");
  for (const [o, c] of ops) if (c) pre.append(el(o === "=" ? "span" : o === "-" ? "del" : "ins", "", c));
  if (ops.big) pre.prepend(el("div", "muted", "(too long for a character diff: shown whole)"));
  return pre;
}

function eventBody(t, e) {
  const b = el("div", "ev-body"), cols = el("div", "cols"), left = el("div"), right = el("div");
  const into = e.replacement ?? e.regenerated, none = el("p", "muted", "(not recorded)");
  left.append(el("b", "", "removed: the failed turn"), e.failed != null ? struck("failed", e.failed) : none.cloneNode(true),
    el("b", "", "the error the model saw"), e.error != null ? struck("error", e.error) : none.cloneNode(true));
  right.append(el("b", "", e.replacement != null ? "spliced in its place"
    : e.regenerated != null ? "the regenerated turn (after the error)" : "nothing replaced it"),
    into != null ? el("pre", "ins", into) : el("p", "muted", e.kind === "given_up" ? "(SAAR gave up)" : "(not recorded)"));
  if (e.at && !placed(t, e))
    right.append(el("p", "muted stale", "a later retry of this turn replaced this text again: it is not in the final response"));
  cols.append(left, right);
  const sim = typeof e.similarity === "number" && isFinite(e.similarity) ? e.similarity : null;
  const vs = sim !== null && typeof e.gamma === "number" ? (sim >= e.gamma ? " ≥ γ " : " < γ ") + e.gamma : "";
  b.append(el("p", "decision", `similarity ${num(sim, 3)}${vs} → ${WHY[e.kind] || e.kind}` +
    (e.reason ? ` (${e.reason})` : "") + ` · retry ${e.retry ?? "?"} · error kind ${e.error_kind ?? "?"}` +
    (e.regen_tokens != null ? ` · ${e.regen_tokens} regenerated tokens` : "")), cols);
  if (e.failed != null && into != null)
    b.append(el("b", "", "character diff, failed → " + (e.replacement != null ? "replacement" : "regenerated")),
      diff(String(e.failed), String(into)));
  return b;
}

function body(t) {  // a trajectory (or a held-out sample): prompt, turns, SAAR events, calls
  const box = el("div");
  if (t.prompt != null) {
    const d = el("details");
    d.append(el("summary", "", "prompt"), el("pre", "", t.prompt));
    box.append(d);
  }
  box.append(response(t));
  evs(t).forEach((e, i) => {
    const d = el("div", "event"), head = el("div", "ev-head", `SAAR event ${i + 1}: ${e.kind} · turn ${e.turn ?? "?"} · ` +
      `similarity ${num(e.similarity, 3)} · γ ${e.gamma ?? "?"}`);
    d.dataset.i = i;
    head.onclick = () => {  // open (built the first time) or close; the text of the open events lights up in the response
      const b = d.querySelector(".ev-body");
      if (b) b.hidden = !b.hidden; else d.append(eventBody(t, e));
      const on = new Set([...box.querySelectorAll(".event")].filter((x) => x.querySelector(".ev-body:not([hidden])"))
        .map((x) => x.dataset.i));
      box.querySelectorAll("span.at").forEach((s) => s.classList.toggle("hl", s.dataset.ev.split(" ").some((j) => on.has(j))));
    };
    d.append(head); box.append(d);
  });
  if (Array.isArray(t.turns) && t.turns.length) {
    const tab = el("table");
    tab.append(row(["turn", "call", "output"], "th"));
    for (const c of t.turns) {
      const r = row([c.turn, c.ok ? "ok" : `${c.error_kind} ${c.exception_type || ""}`, el("pre", "", c.output ?? "")]);
      r.cells[1].className = c.ok ? "pass" : "fail"; tab.append(r);
    }
    box.append(el("b", "", "tool calls left in the trajectory"), tab);
  }
  return box;
}

// trajectories and their filters
const F = {step: $("f-step"), saar: $("f-saar"), kind: $("f-kind"), reward: $("f-reward"), problem: $("f-problem")};
const opts = (sel, vals) => { for (const v of vals) sel.append(Object.assign(el("option", "", v), {value: v})); };
opts(F.step, D.steps); opts(F.kind, KINDS); opts(F.problem, [...new Set(D.trajs.map(pid))].sort());
function show() {
  const list = D.trajs.filter((t) => (!F.step.value || String(t.step) === F.step.value) && (!F.saar.checked || evs(t).length)
    && (!F.kind.value || evs(t).some((e) => e.kind === F.kind.value)) && (!F.problem.value || pid(t) === F.problem.value)
    && (!F.reward.value || (F.reward.value === "pos" ? t.reward > 0 : !(t.reward > 0))));
  const n = list.reduce((a, t) => a + evs(t).length, 0);
  $("count").textContent = `${list.length} trajectories, ${n} SAAR events`;
  Object.assign($("count").dataset, {trajs: list.length, events: n});
  $("trajs").replaceChildren(...list.map((t) => {
    const d = el("details", "traj"), kinds = evs(t).map((e) => e.kind);
    Object.assign(d.dataset, {step: t.step, idx: t.idx});
    d.append(el("summary", "", `step ${t.step} #${t.idx} · problem ${pid(t)} · reward ${num(t.reward, 2)} · ` +
      `${t.finish_reason ?? ""} · ${t.num_tool_calls ?? "?"} calls, ${t.num_tool_errors ?? "?"} errors` +
      (kinds.length ? ` · SAAR: ${kinds.join(", ")}` : "")));
    d.ontoggle = () => { if (d.open && d.children.length === 1) d.append(body(t)); };  // built when first opened
    return d;
  }));
}
Object.values(F).forEach((f) => f.addEventListener("change", show)); show();

// held-out records: per kind a table of problems by eval step, pass rate over samples; a cell opens its samples
const byKind = {};  // kind -> problem id -> step -> rows (its samples)
for (const ev of D.evals) for (const r of ev.rows) {
  const p = ((byKind[r.eval ?? "?"] ??= {})[String(r.id)] ??= {});
  (p[ev.step] ??= []).push(r);
}
if (!D.evals.length) $("evals").append(el("p", "muted", "no held-out records"));
const steps = D.evals.map((e) => e.step);
for (const [kind, probs] of Object.entries(byKind)) {
  const all = (s) => Object.values(probs).flatMap((p) => p[s] || []);
  const tab = el("table");
  tab.append(row([kind, ...steps.map((s) => `step ${s}: ${all(s).filter((r) => r.ok).length}/${all(s).length}`)], "th"));
  for (const id of Object.keys(probs).sort()) {
    const tr = row([id]);
    for (const s of steps) {
      const rows = probs[id][s] || [], ok = rows.filter((r) => r.ok).length;
      const cls = rows.length ? "cell " + (ok === rows.length ? "pass" : ok ? "part" : "fail") : "";
      const td = el("td", cls, rows.length ? `${ok}/${rows.length}` : "");
      td.onclick = () => {
        const v = $("eval-view");
        v.replaceChildren(el("h3", "", `${kind} · step ${s} · problem ${id}`));
        rows.forEach((r, k) => v.append(
          el("p", r.ok ? "pass" : "fail", `sample ${k}: ${r.ok ? "right" : "wrong"}, ${r.calls ?? "?"} calls, ${r.errors ?? "?"} errors`),
          r.response != null ? body(r) : el("p", "muted", "no response recorded (an older run)")));
        v.scrollIntoView();
      };
      tr.append(td);
    }
    tab.append(tr);
  }
  $("evals").append(tab);
}
</script></body></html>
"""


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__.split("\n\n")[1])
    for run in sys.argv[1:]:
        t0 = time.perf_counter()
        path = write(run)
        print(f"{path}: {os.path.getsize(path):,} bytes, built in {time.perf_counter() - t0:.2f} s")
