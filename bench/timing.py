"""How the analysis benchmarks time a command: in a fresh process, its wall time, CPU time and peak memory
(ru_maxrss of it and of every process it waited for), and several commands in turn (a, b, c, a, b, c, ...) so that a
slow moment of the machine weighs on all of them."""

from __future__ import annotations

import compileall
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

BARE = """
import gzip, sys, orjson
with gzip.open(sys.argv[1], "rb") as f:
    trace = orjson.loads(f.read())
print(len(trace["traceEvents"]), "events")
"""

NO_KERNEL = "HTA kept no kernel"

# Runs one command and reports its wall time, and the CPU time (user + system) and the peak RSS of it and its
# children (ru_maxrss, KiB on Linux).
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
with open(sys.argv[1], "wb") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT).returncode
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kib": usage.ru_maxrss}))
"""


ROOT = Path(__file__).resolve().parent.parent


def compile_sources() -> None:
    """Compile gpudoctor's modules and the built-in rules to bytecode first, as installing the package does: with
    PYTHONDONTWRITEBYTECODE set (or a read-only checkout) every timed run would compile them again from source, some
    0.2 s on the 2-core VM that no user pays."""
    for folder in ("gpudoctor", "rules"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def run_once(label: str, command: list[str], log: Path) -> dict[str, Any]:
    """Run `command` once in a fresh process: its exit status, wall time and peak RSS (KiB)."""
    result = subprocess.run([sys.executable, "-c", MEASURE, str(log), *command],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        sys.exit(f"{label}: the measuring process failed\n{result.stderr[-2000:]}")
    run: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    if run["rc"] != 0:
        tail = log.read_text(errors="replace")[-1500:]
        print(f"{label}: exit status {run['rc']}; the last of {log}:\n{tail}", file=sys.stderr)
    return run


def _summary(label: str, log: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The least wall time and the largest peak RSS of `runs`."""
    no_kernel = NO_KERNEL in log.read_text(errors="replace") if log.is_file() else False
    return {"label": label + (" [no kernel kept]" if no_kernel else ""), "log": str(log),
            "rc": max(r["rc"] for r in runs), "wall_s": min(r["wall_s"] for r in runs),
            "walls": [r["wall_s"] for r in runs], "cpu_s": min(r.get("cpu_s", 0.0) for r in runs),
            "maxrss_kib": max(r["maxrss_kib"] for r in runs), "no_kernel": no_kernel}


def measure(label: str, command: list[str], log: Path, repeat: int = 1) -> dict[str, Any]:
    """Run `command` `repeat` times, each in a fresh process: the least wall time, the largest peak RSS."""
    compile_sources()
    runs = []
    for i in range(repeat):
        print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
        runs.append(run_once(label, command, log))
        if runs[-1]["rc"] != 0:
            break
    return _summary(label, log, runs)


def measure_in_turn(commands: list[tuple[str, list[str], Path]], repeat: int) -> list[dict[str, Any]]:
    """Run each of `commands` (label, command line, log) `repeat` times, in turn: a, b, c, a, b, c, ..."""
    compile_sources()
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in commands}
    for i in range(repeat):
        for label, command, log in commands:
            if runs[label] and runs[label][-1]["rc"] != 0:
                continue
            print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
            runs[label].append(run_once(label, command, log))
    return [_summary(label, log, runs[label]) for label, _, log in commands]


def versions(hta_python: str | None) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from gpudoctor import __version__

    found = {"python": platform.python_version(), "gpudoctor": __version__}
    for name in ("orjson",):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    if hta_python:
        probe = ("from importlib.metadata import version as v; import json\n"
                 "out = {}\nfor n in ('HolisticTraceAnalysis', 'pandas', 'numpy', 'ijson'):\n"
                 "    try: out[n] = v(n)\n    except Exception: pass\nprint(json.dumps(out))")
        result = subprocess.run([hta_python, "-c", probe], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            found.update(json.loads(result.stdout))
    return found


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0
