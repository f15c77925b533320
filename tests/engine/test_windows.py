"""`gpudoctor profile --every`: repeated profiling windows, and a report that compares them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

from conftest import Gpudoctor, Result, script
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import StepEvent, WindowEvent
from gpudoctor.bundle.manifest import Manifest
from gpudoctor.bundle.samples import HostRow, ProcsRow
from gpudoctor.collect.config import WindowConfig
from gpudoctor.paths import findings_schema
from gpudoctor.ui.status_line import Status

LATE = script("late_starvation.py")
LOADER_LINE = next(i for i, line in enumerate(Path(LATE).read_text().splitlines(), start=1) if "# LOADER" in line)


@pytest.fixture(scope="module")
def late_run(tmp_path_factory) -> Result:
    """100 steps: 40 fed at once, then 60 that wait for a slow loader; a window every second."""
    gd = Gpudoctor(tmp_path_factory.mktemp("late"))
    result = gd.profile(LATE, options=("--wait-steps", "1", "--warmup-steps", "1", "--active-steps", "3",
                                       "--every", "1s"))
    assert result.returncode == 0, result
    return result


@pytest.mark.e2e
def test_each_window_writes_its_own_trace(late_run: Result) -> None:
    opened = [e for e in late_run.events(WindowEvent) if e.state == "opened"]
    closed = [e for e in late_run.events(WindowEvent) if e.state == "closed"]
    assert len(opened) >= 3, opened
    assert [e.index for e in opened] == list(range(len(opened)))
    assert [e.first_step for e in opened] == sorted({e.first_step for e in opened})
    traces = [e.trace for e in closed]
    assert traces[:2] == ["trace.json.gz", "trace.1.json.gz"]
    for name in traces:
        assert (late_run.run_dir / name).is_file()
        assert name in late_run.manifest()["files"]
        assert json.loads(gzip.decompress((late_run.run_dir / name).read_bytes()))["traceEvents"]
    assert not list(late_run.run_dir.glob("trace.partial.*"))  # the plain export and its compressed copy
    assert late_run.manifest()["window"]["every_s"] == 1.0


@pytest.mark.e2e
def test_each_window_analyses_its_own_steps(late_run: Result) -> None:
    run = Run.from_bundle(late_run.run_dir)
    assert len(run.windows) >= 3
    for info in run.windows:
        window = run.for_window(info.index)
        # The last window may be cut short by the end of the script.
        assert len(window.steps) == 3 or (info is run.windows[-1] and 1 <= len(window.steps) <= 3)
        assert all(s.index >= info.first_step for s in window.steps)
        assert window.trace_file.name == info.trace
    assert run.step_view.steps_in_run == 100


@pytest.mark.e2e
def test_a_pathology_that_appears_late_is_found_in_the_late_windows_only(late_run: Result) -> None:
    findings = late_run.findings()
    windows = findings["windows"]
    assert [w["index"] for w in windows] == list(range(len(windows)))
    assert "GD101" not in windows[0]["findings"]  # the first 40 steps are fed at once
    assert "GD101" in windows[-1]["findings"]  # the last ones wait for the slow shard
    gd101 = next(f for f in findings["findings"] if f["code"] == "GD101")
    assert gd101["location"]["line"] == LOADER_LINE
    seen = [w["index"] for w in gd101["windows"]]
    assert 0 not in seen and seen == sorted(seen)
    assert gd101["impact"] == max(w["impact"] for w in gd101["windows"])  # reported where it costs the most
    charted = [w for w in windows if w["charted"]]
    assert len(charted) == 1 and "GD101" in charted[0]["findings"]
    assert 1 <= findings["run"]["steps_analysed"] <= 3 and findings["run"]["steps_total"] == 100


@pytest.mark.e2e
def test_findings_json_with_windows_matches_the_schema(late_run: Result) -> None:
    schema = json.loads(findings_schema().read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(late_run.findings())


@pytest.mark.e2e
def test_the_report_and_summary_compare_the_windows(late_run: Result) -> None:
    html = (late_run.run_dir / "report.html").read_text(encoding="utf-8")
    windows = late_run.findings()["windows"]
    assert 'id="windows"' in html and f"profiled {len(windows)} times" in html
    assert f"{len(windows)} profiling windows" in late_run.stderr
    assert "GD101" in late_run.stderr and "windows" in late_run.stderr.split("GD101", 1)[1].splitlines()[1]


def test_a_run_with_one_window_has_no_window_rows(gd: Gpudoctor) -> None:
    result = gd.profile(LATE, "--steps", "8", "--fast-steps", "8")
    assert result.returncode == 0, result
    assert result.findings()["windows"] == []
    assert 'id="windows"' not in (result.run_dir / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("value", ["soon", "0", "-5m", "10x"])
def test_a_bad_every_is_a_usage_error(gd: Gpudoctor, value: str) -> None:
    result = gd.run("profile", "--every", value, LATE)
    assert result.returncode == 2, result
    assert "--every" in result.stderr and not (gd.cwd / "gpudoctor-runs").exists()


def test_the_progress_line_counts_the_windows_recorded() -> None:
    status = Status(WindowConfig(wait=1, warmup=1, active=3, every_s=1.0), None)
    status.update([StepEvent(step=4, t0=4.0, t1=5.0, wall_s=1.0, window="closed"),
                   WindowEvent(state="opened", index=0, first_step=1),
                   WindowEvent(state="closed", index=0),
                   WindowEvent(state="opened", index=1, first_step=20),
                   StepEvent(step=22, t0=22.0, t1=23.0, wall_s=1.0, window="active")])
    assert "profiling step 2 of 3" in status.text()  # steps 21 and 22, after the warm-up step 20
    status.update([WindowEvent(state="closed", index=1)])
    assert "2 profiled windows recorded" in status.text()


def test_a_window_in_a_compacted_stretch_reads_the_rows_either_side() -> None:
    """Samples merged into 10 s rows (an old stretch of a long run): a 0.5 s window between two rows uses those two,
    not the whole run and not nothing."""
    host = [{"t": 1000.0 + 10 * i, "t0": 991.0 + 10 * i, "n": 100, "cpu_pct": [50.0, 50.0], "mem_available": 10**9,
             "lo": {"mem_available": 10**9 - i}, "swap_in": 0, "swap_out": 0} for i in range(100)]
    procs = [{"t": h["t"], "t0": h["t0"], "n": 100,
              "procs": [{"pid": 7, "ppid": 1, "name": "python", "cpu_s": 0.8 * i * 10, "rss": 10**8, "threads": 3,
                         "hi": {"rss": 2 * 10**8 + i}, "ctx_vol": 0, "ctx_invol": 0, "thread_cpu": {}}]}
             for i, h in enumerate(host)]
    steps = [{"kind": "step", "step": i, "t0": 1503.0 + 0.1 * i, "t1": 1503.1 + 0.1 * i, "wall_s": 0.1,
              "data_wait_s": 0.0, "batches": 1, "source": "optimizer", "window": "active", "window_index": 0,
              "phases": {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}, "copies": [], "syncs": []}
             for i in range(5)]
    run = Run(msgspec.convert({"schema_version": 1, "window": {"wait": 0}}, Manifest),
              [msgspec.convert(e, StepEvent) for e in steps], None, msgspec.convert(host, list[HostRow]),
              msgspec.convert(procs, list[ProcsRow]), [])
    assert [p.t for p in run.host.step_samples.host] == [1500.0, 1510.0]
    (process,) = run.host.processes
    assert process.rss_max == 2 * 10**8 + 51 and abs(process.cpu_mean - 0.8) < 1e-9


def test_a_windows_cell_adds_up_a_rules_call_sites() -> None:
    from gpudoctor.bundle.findings import FindingRecord
    from gpudoctor.engine.windows import _impact_per_rule

    rows = [{"code": "GD211", "impact": 0.02}, {"code": "GD211", "impact": 0.03}, {"code": "GD502", "impact": None},
            {"code": "GD201", "impact": 0.7}, {"code": "GD201", "impact": 0.6}]
    findings = [FindingRecord(name="r", category="sync_point", severity="warning", title="t", evidence=[],
                              location=None, fix="", **row) for row in rows]
    assert _impact_per_rule(findings) == {"GD211": 0.05, "GD502": None, "GD201": 1.0}
