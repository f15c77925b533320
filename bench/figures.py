"""What every benchmark shares: `--json PATH`, which writes its figures as JSON beside what it prints, with the commit,
the machine and the command they come from. `python -m bench.docs` renders docs/performance.md's tables from the
files kept in bench/results/.

    figures = Figures("window_distortion", args.json, columns=["fixture", "distortion"])
    figures.row("healthy_trainer", "1.56x")          # a row of the table it prints, as printed
    figures.set("median_distortion", 1.42)           # a figure of its own
    figures.write()                                  # nothing without --json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", type=Path, default=None,
                        help="also write the figures as JSON to PATH (bench/results/NAME.json feeds "
                             "docs/performance.md through `python -m bench.docs`)")


class Figures:
    """A benchmark's figures, and the rows of the table it prints, written as JSON at the end (with --json)."""

    def __init__(self, bench: str, path: Path | None, columns: list[str] | None = None) -> None:
        self.bench, self.path, self.columns = bench, path, columns
        self.rows: list[list[str]] = []
        self.values: dict[str, Any] = {}

    def row(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value

    def markdown(self, lines: list[str]) -> None:
        """The table of a benchmark that prints Markdown: its header row the columns, the rows after the rule."""
        cells = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines
                 if line.startswith("|")]
        if cells:
            self.columns = cells[0]
            self.rows += [row for row in cells[1:] if set("".join(row)) - set("- ")]

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {"bench": self.bench, "command": command_line(self.bench),
                                    "commit": commit(), "machine": machine(), "figures": self.values}
        if self.columns is not None:
            document["table"] = {"columns": self.columns, "rows": self.rows}
        return document

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.document(), indent=1, ensure_ascii=False, default=str) + "\n",
                             encoding="utf-8")
        print(f"figures written to {self.path}", file=sys.stderr)


def command_line(bench: str) -> str:
    """The command that made the figures, as the docs show it (without --json)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg == "--json":
            skip = not skip
            continue
        if not arg.startswith("--json="):
            args.append(arg)
    return " ".join(["PYTHONPATH=$PWD python3", f"bench/{bench}.py", *args])


def commit() -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    done = subprocess.run([git, "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def machine() -> str:
    """The CPU, and the GPUs when nvidia-smi is there, without importing torch."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    gpus = ""
    if smi is not None:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              check=False)
        names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        gpus = f"; {len(names)}x {names[0]}" if names else ""
    return f"{cpu}{gpus}"
