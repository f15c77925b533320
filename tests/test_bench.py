"""bench/: `python -m bench` lists every benchmark, each writes its figures with --json, and docs/performance.md's
tables are what the figures kept in bench/results/ give."""

from __future__ import annotations

import json
from pathlib import Path

from bench import docs
from bench.__main__ import BENCHMARKS, HELPERS, summary
from conftest import REPO

BENCH = REPO / "bench"


def test_the_index_names_every_script_of_bench() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py")} - {"__init__", "__main__"}
    assert scripts == set(BENCHMARKS) | set(HELPERS)
    assert not set(BENCHMARKS) & set(HELPERS)
    assert all(summary(name) for name in BENCHMARKS)


def test_every_benchmark_writes_its_figures_with_json() -> None:
    lacking = [name for name in BENCHMARKS if "add_json_option(parser)" not in (BENCH / f"{name}.py").read_text()]
    assert lacking == []


def test_the_performance_pages_tables_are_what_their_figures_give() -> None:
    text = docs.DOC.read_text(encoding="utf-8")
    assert docs.REGION.findall(text), "no table of docs/performance.md is marked with its figures"
    assert docs.rendered(text) == text, "run `python -m bench.docs`"


def test_a_table_shows_the_columns_asked_for_and_where_its_figures_come_from(tmp_path: Path) -> None:
    document = {"bench": "window_distortion", "command": "PYTHONPATH=$PWD python3 bench/window_distortion.py",
                "commit": "abc1234", "machine": "1x NVIDIA H100",
                "table": {"columns": ["fixture", "step source", "distortion"],
                          "rows": [["healthy_trainer", "optimizer", "1.20x"]]}}
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "wd.json").write_text(json.dumps(document))
    page = "before\n<!-- bench/results/wd.json columns: fixture, distortion -->\nstale\n<!-- end -->\nafter\n"
    assert docs.rendered(page, tmp_path) == (
        "before\n<!-- bench/results/wd.json columns: fixture, distortion -->\n"
        "| fixture | distortion |\n| --- | --- |\n| healthy_trainer | 1.20x |\n\n"
        "<sub>`PYTHONPATH=$PWD python3 bench/window_distortion.py` (commit abc1234, 1x NVIDIA H100)</sub>\n"
        "<!-- end -->\nafter\n")
