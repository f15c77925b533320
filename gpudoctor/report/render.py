"""Renderers: a Report in, text out. They format; they compute nothing."""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

import jinja2
from markupsafe import Markup, escape

from gpudoctor.bundle.findings import FindingJson, FindingWindowJson
from gpudoctor.report import svg
from gpudoctor.report.cpu_wait import cpu_wait_text, notable
from gpudoctor.report.document import BudgetJson, FindingsDocument, Report, RunFacts
from gpudoctor.report.kernel_names import kernel_label
from gpudoctor.report.templates import template_environment
from gpudoctor.report.throughput import throughput_text
from gpudoctor.report.tried import gained, tried_applied, tried_head, tried_text
from gpudoctor.report.units import elapsed, percent, seconds, step_after


def findings_document(report: Report) -> FindingsDocument:
    """The part of the Report that findings.json holds, in the order it holds it."""
    return {
        "schema_version": report["schema_version"], "gpudoctor_version": report["gpudoctor_version"],
        "run": report["run"], "summary": report["summary"], "findings": report["findings"],
        "not_evaluated": report["not_evaluated"], "errors": report["errors"], "windows": report["windows"],
    }


def to_json(report: Report) -> str:
    """findings.json: the contract other tools read."""
    # Strict JSON: every number that reaches the report is checked finite where it enters (the bundle's records,
    # the trace reader, engine.checks), so a NaN here is a bug in gpudoctor, not a file for other tools to choke on.
    return json.dumps(findings_document(report), indent=2, default=str, allow_nan=False) + "\n"


def _windows_seen(seen: list[FindingWindowJson], total: int) -> str:
    """'in 3 of 8 windows (#5 to #7), ~20% to ~41% of step time'."""
    indices = [w["index"] for w in seen]
    where = f"#{indices[0]}" if len(indices) == 1 else f"#{indices[0]} to #{indices[-1]}"
    text = f"in {len(seen)} of {total} windows ({where})"
    impacts = [impact for impact in (w["impact"] for w in seen) if impact]
    shares = sorted({f"{impact:.0%}": impact for impact in impacts}.items(), key=lambda s: s[1])
    if shares:
        text += f", ~{shares[0][0]}" + (f" to ~{shares[-1][0]}" if len(shares) > 1 else "") + " of step time"
    return text


def _environment() -> jinja2.Environment:
    env = template_environment()
    env.filters["seconds"] = seconds
    env.filters["percent"] = percent
    env.filters["kernel_label"] = kernel_label
    env.filters["elapsed"] = elapsed
    env.globals["step_after"] = step_after
    env.globals["tried_text"] = tried_text
    env.globals["tried_head"] = tried_head
    env.globals["tried_applied"] = tried_applied
    env.globals["gained"] = gained
    env.globals["host_ran_ahead"] = host_ran_ahead
    env.globals["step_time_text"] = step_time_text
    env.globals["median_step_text"] = median_step_text
    env.globals["distortion_text"] = distortion_text
    env.globals["gpu_text"] = gpu_text
    env.globals["profiler_cost_shown"] = profiler_cost_shown
    env.globals["throughput_text"] = throughput_text
    env.globals["cpu_wait_text"] = cpu_wait_text
    env.globals["nodes_shown"] = nodes_shown
    env.globals["node_text"] = node_text
    env.globals["clock_text"] = clock_text
    env.globals["clocks_sentence"] = clocks_sentence
    env.filters["code_spans"] = _code_spans
    env.filters["when"] = _when
    env.filters["shell_quote"] = shlex.quote  # the compare line's run directory, pasted into a shell
    env.globals.update(step_bars=svg.step_bars, timeline=svg.timeline, kernel_histogram=svg.kernel_histogram)
    return env


def nodes_shown(ranks: list[Any]) -> bool:
    """Whether a job's ranks ran on more than one host or node: then the ranks table says where each ran."""
    places = {(r["figures"].get("host"), r["figures"].get("node_rank")) for r in ranks}
    return len(places) > 1


def node_text(figures: Mapping[str, Any]) -> str:
    """'node 1 (gpu-b07)', 'gpu-b07', or '—'."""
    host, node = figures.get("host"), figures.get("node_rank")
    if node is not None:
        return f"node {node}" + (f" ({host})" if host else "")
    return host or "—"


def clock_text(figures: Mapping[str, Any]) -> str:
    """', clock +3.2 ms' beside a rank whose clock is measurably off the first rank's; '' otherwise."""
    offset, residual = figures.get("clock_offset_s"), figures.get("clock_residual_s") or 0.0
    if offset is None or abs(offset) <= max(residual, 5e-5):
        return ""
    return f", clock {'+' if offset > 0 else '-'}{_ms(abs(offset))}"


def clocks_sentence(ranks: list[Any]) -> str:
    """What the ranks table says of the hosts' clocks, where the ranks ran on more than one."""
    if not nodes_shown(ranks):
        return ""
    measured = [r["figures"] for r in ranks if r["figures"].get("clock_offset_s") is not None]
    if len(measured) < 2:
        return (" The ranks' clocks could not be aligned (too few steps show collectives on every rank): where "
                "their times are compared, each host's clock is taken as it is.")
    spread = max(abs(f["clock_offset_s"]) for f in measured)
    residual = max(f.get("clock_residual_s") or 0.0 for f in measured)
    return (f" The ranks' clocks are aligned by the ends of their steps' last collectives, one moment on every "
            f"rank: they differ from the first rank's by up to {_ms(spread)}, known to within {_ms(residual)}.")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def _code_spans(text: str) -> Markup:
    """Text with `backquoted` parts as <code>; everything escaped first."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))  # noqa: S704 (escaped first)


def _when(iso: str) -> str:
    """An ISO timestamp as a reader writes it: 2026-11-21 08:12 UTC."""
    try:
        moment = dt.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return str(iso)
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M") + (" UTC" if moment.tzinfo is not None else "")


def to_html(report: Report) -> str:
    return _environment().get_template("report.html.j2").render(report=report)


def _location(finding: FindingJson) -> str:
    loc = finding.get("location")
    return f" at {loc['file']}:{loc['line']}" if loc else ""


BUDGET_WORDS = {"gpu_busy": "GPU computing", "collective": "collectives", "data_wait": "waiting for data",
                "stall": "stalls now and then", "sync": "syncs", "copy": "copies", "host": "host-side work",
                "unexplained": "unexplained"}


def _budget_line(budget: BudgetJson) -> str:
    """'each step: GPU computing 64%, syncs 15%, host-side work 17%, unexplained 4%' (slices of 1% or more)."""
    shown = [f"{BUDGET_WORDS[s['slice']]} {s['share']:.0%}" for s in budget["slices"] if s["share"] >= 0.01]
    return "each step: " + ", ".join(shown) + _profiler_cost_text(budget)


def profiler_cost_shown(budget: BudgetJson) -> bool:
    """Whether the report and the terminal say what the profiler cost: when it is 1% of a step or more."""
    return (budget.get("profiler_s") or 0.0) >= 0.01 * budget["step_s"]


def _profiler_cost_text(budget: BudgetJson) -> str:
    """'; the profiler's own 4.6 ms of each profiled step left out' (see profiler_cost_shown)."""
    if not profiler_cost_shown(budget):
        return ""
    return f"; the profiler's own {seconds(budget['profiler_s'])} of each profiled step left out"


def _on_ranks(finding: FindingJson) -> str:
    """' (rank 1)', ' (ranks 0, 1)' for a finding of a torchrun job's rank; nothing for one of the whole job."""
    ranks = finding.get("ranks")
    if not ranks:
        return ""
    return f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"


def host_ran_ahead(run: RunFacts) -> bool:
    """The GPU's work for a step took longer than the host's steps after start-up, waits for data included: the
    host launched ahead of the GPU (no sync held it back), so the GPU, not the step the host measured, set the
    pace. Documents written before the figure existed never say so."""
    return bool(run.get("host_ran_ahead")) and run.get("gpu_work_per_step_s") is not None


STEP_BASIS_WORDS = {"unprofiled": "the mean of {n} steps after the profiling window",
                    "analysed": "the mean of {n} analysed steps",
                    "gpu_work": "the GPU's work per step: the host ran ahead of it"}
MEDIAN_APART = 1.25  # a median step this far from the step time is shown beside it


def step_time_text(run: RunFacts) -> str | None:
    """'82.2 ms (the mean of 22 steps after the profiling window)'; None when no step was measured."""
    step, basis = run["step_s"], run["step_s_basis"]
    if step is None:
        return None
    words = STEP_BASIS_WORDS.get(basis or "")
    if not words:
        return seconds(step)
    left_out = _left_out_text(run.get("step_s_evaluations") or 0, run.get("step_s_stalls") or 0)
    left_out = left_out if basis != "gpu_work" else ""
    return seconds(step) + f" ({words.format(n=run['step_s_steps'])}{left_out})"


def _left_out_text(evaluations: int, stalls: int) -> str:
    """'; 1 with an evaluation and 2 stalled left out': the steps the mean leaves out (analysis.timebase)."""
    parts = [f"{evaluations} with an evaluation"] * bool(evaluations) + [f"{stalls} stalled"] * bool(stalls)
    return f"; {' and '.join(parts)} left out" if parts else ""


def median_step_text(run: RunFacts) -> str | None:
    """'half the steps took under 2.1 ms' where the median is far from the step time (a bursty loader feeds most
    steps from its queue and makes one in several wait long); None otherwise."""
    step, median = run["step_s"], run["median_step_s"]
    if not step or median is None or 1 / MEDIAN_APART <= median / step <= MEDIAN_APART:
        return None
    return f"half the steps took under {seconds(median)}"


DISTORTION_SAID = 1.10  # the profiler's effect on the steps it records is said when it is this far from none


def distortion_text(run: RunFacts) -> str | None:
    """'the profiler slowed the steps it recorded 1.46×' where it did (or sped them: the ones it recorded can come
    at a quicker stretch of the run); None where the steps it recorded ran as the others."""
    ratio = run.get("window_distortion")
    if ratio is None or 1 / DISTORTION_SAID <= ratio <= DISTORTION_SAID:
        return None
    if ratio > 1:
        return f"the profiler slowed the steps it recorded {ratio:.2f}×: savings are of the steps it did not record"
    return f"the steps the profiler recorded ran {ratio:.2f}× as long as the others"


def gpu_text(run: RunFacts) -> str | None:
    """The GPU the script used ('NVIDIA H200'), else the host's ('2 × NVIDIA H200'); None where none was seen."""
    used = run.get("cuda_device")
    if used:
        return str(used)
    names = [str(gpu) for gpu in run.get("gpus") or []]  # an unnamed GPU is None
    if not names:
        return None
    return f"{len(names)} × {names[0]}" if len(set(names)) == 1 and len(names) > 1 else ", ".join(names)


def step_facts(run: RunFacts) -> list[str]:
    """'step 82.2 ms (the mean of 22 steps after the profiling window)', then the median step where shown."""
    shown = step_time_text(run)
    return [text for text in (shown and f"step {shown}", median_step_text(run)) if text]


def cost_text(step_s: float | None, finding: FindingJson) -> str:
    """' (measured 52.4 → 21.0 ms/step, 2.5×; predicted ~23.0 ms)' where its fix was measured, else what the fix
    is predicted to save: ' (fix saves ~56%: 52.4 → ~23.0 ms/step (≈2.3×))'."""
    measured = tried_head(step_s, finding)
    if measured:
        return f" ({measured})"
    if not finding.get("impact"):
        return ""
    after = step_after(step_s, finding.get("saving_s"))
    held = f"; {finding['counted_in']}'s fix holds it" if finding.get("counted_in") else ""
    return f" (fix saves ~{finding['impact']:.0%}{': ' + after if after else ' of the step'}{held})"


def tried_lines(step_s: float | None, finding: FindingJson) -> list[str]:
    """What the try changed, where its processes say more than the fix does (a job's ranks, another finding's
    fix), its step beside the prediction, and how it differs from the fix the prediction assumes."""
    said = tried_text(step_s, finding)
    if not said:
        return []
    tried: Mapping[str, Any] = finding.get("tried") or {}
    lines = []
    if tried.get("fix_of") or any(c.get("rank") is not None for c in tried.get("changes") or []):
        lines.append(f"tried: {tried_applied(finding)}")
    lines.append(said)
    if tried.get("not_as_predicted"):
        lines.append(f"not the predicted fix: {tried['not_as_predicted']}")
    return lines


def to_text(report: Report, report_path: str | None = None, limit: int = 5) -> str:
    """The one-screen terminal summary."""
    run = report["run"]
    lines = [f"gpudoctor: {report['summary']['verdict']}"]
    facts = [f"{run['steps_analysed']} steps analysed"]
    facts += step_facts(run)
    if host_ran_ahead(run) and run.get("step_s_basis") != "gpu_work":
        facts.append(f"the GPU's work takes {seconds(run['gpu_work_per_step_s'])} a step: the host ran ahead of it")
    if run.get("step_source"):
        facts.append(f"steps marked by {run['step_source']}")
    facts += [text for text in (distortion_text(run), gpu_text(run)) if text]
    lines.append("  " + "; ".join(facts))
    budget = run.get("budget")
    if budget:
        line = _budget_line(budget)
        shown = run.get("shown_rank")
        lines.append("  " + (line.replace("each step:", f"rank {shown}'s steps:", 1) if shown is not None else line))
    matrix = throughput_text(run.get("throughput"))
    if matrix:
        lines.append(f"  {matrix}")
    if notable(run.get("cpu_wait")):
        lines.append(f"  {cpu_wait_text(run.get('cpu_wait'))}")
    windows = report.get("windows") or []
    if len(windows) > 1:
        charted = next((w["index"] for w in windows if w["charted"]), None)
        lines.append(f"  {len(windows)} profiling windows; the figures below are from window #{charted}")
    for finding in report["findings"][:limit]:
        lines.append(f"  [{finding['severity']}] {finding['code']}{_on_ranks(finding)} {finding['title']}"
                     f"{cost_text(run['step_s'], finding)}{_location(finding)}")
        if len(windows) > 1 and finding.get("windows"):
            lines.append(f"      {_windows_seen(finding['windows'], len(windows))}")
        if finding.get("fix"):
            lines.append(f"      fix: {finding['fix']}")
        lines += [f"      {line}" for line in tried_lines(run["step_s"], finding)]
    hidden = len(report["findings"]) - limit
    if hidden > 0:
        lines.append(f"  ... and {hidden} more in the report")
    for row in report["not_measured"]:
        lines.append(f"  not measured: {row['what']}: {row['reason']}")
    for error in report["errors"]:
        lines.append(f"  rule {error['code']} failed: {error['error']}")
    if report_path:
        lines.append(f"  report: {report_path}")
    if report["links"]["run"] and not run["trace_only"] and run["steps_analysed"]:  # diff compares steps
        run_dir = shlex.quote(report["links"]["run"])
        lines.append(f"  compare with an earlier run: gpudoctor diff EARLIER_RUN_DIR {run_dir}")
    return "\n".join(lines) + "\n"
