"""The benchmarks, each with what it measures and what it needs: `python -m bench`.

Each one runs as a script from the repository root (`PYTHONPATH=$PWD python3 bench/NAME.py --help` for its
options) and prints its figures; `--json PATH` also writes them as JSON, and `python -m bench.docs` renders
docs/performance.md's tables from the files kept in bench/results/.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# name: what it needs to run. The order is docs/performance.md's.
BENCHMARKS = {
    "overhead": "a GPU (--small: a CPU)",
    "step_cost": "a CPU",
    "samplers": "a CPU",
    "profiler_start": "a GPU",
    "profiler_setup": "a GPU",
    "profiler_cost": "a GPU",
    "window_distortion": "recorded bundles",
    "window_transient": "a GPU",
    "window_warmup": "a GPU",
    "gpu_busy_check": "a GPU",
    "precision_rates": "a GPU",
    "long_run": "a CPU",
    "many_steps": "a CPU, a recorded bundle",
    "events_growth": "a CPU",
    "analyze": "a CPU; HolisticTraceAnalysis to compare with it",
    "analysis_guard": "a CPU",
    "job_analysis": "a CPU (more cores: more of the ranks side by side), recorded job bundles",
    "validate_impacts": "recorded bundles",
    "validate_jobs": "a CPU (--recorded: recorded bundles)",
    "validate_job_tries": "two GPUs",
    "validate_tries": "recorded results (--record: a GPU)",
}
# What the benchmarks import, run or are timed with, not benchmarks of their own.
HELPERS = {
    "figures": "the --json option and its file",
    "docs": "docs/performance.md's tables from bench/results/",
    "synthetic_trace": "a big trace made of a recorded one (analyze, analysis_guard)",
    "timing": "a command timed in its own process (analyze, analysis_guard, many_steps)",
    "overhead_runs": "one run of the overhead benchmark, and the GPU's clocks meanwhile",
    "workload_common": "what the overhead benchmark's jobs share",
    "workload_resnet": "the overhead benchmark's ResNet job",
    "workload_transformer": "the overhead benchmark's transformer job",
    "workload_resnet18": "the overhead benchmark's job on torchvision's ResNet-18",
    "workload_fast_steps": "events_growth's job of short steps",
    "job_bundles": "a job of many ranks made of a recorded job's (job_analysis)",
}


def summary(name: str) -> str:
    """The first line of the script's docstring: what it measures."""
    tree = ast.parse((BENCH / f"{name}.py").read_text(encoding="utf-8"))
    return (ast.get_docstring(tree) or "").strip().splitlines()[0]


def main() -> None:
    width = max(map(len, BENCHMARKS))
    print("gpudoctor's benchmarks (PYTHONPATH=$PWD python3 bench/NAME.py --help; --json PATH writes the figures):\n")
    for name, needs in BENCHMARKS.items():
        print(f"  {name:<{width}}  {summary(name)}")
        print(f"  {'':<{width}}  needs {needs}")
    print("\nbeside them:")
    for name, what in HELPERS.items():
        print(f"  {name:<{width}}  {what}")
    print("\ndocs/performance.md's tables: python -m bench.docs (--check says whether they are up to date)")


if __name__ == "__main__":
    main()
