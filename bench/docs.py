"""docs/performance.md's tables, rendered from the benchmarks' figures kept in bench/results/.

    python -m bench.docs            # rewrite the tables in place
    python -m bench.docs --check    # exit 1 when a table is not what its figures give

A table that comes from a benchmark stands between two comments that name its file (and, if it shows only some
of the benchmark's columns, which):

    <!-- bench/results/gpu_busy_check.json -->
    | fixture | ... |
    <!-- end -->

    <!-- bench/results/window_distortion.json columns: fixture, distortion -->

The file is what the benchmark wrote with `--json PATH` (bench/figures.py): its `table` is the table it printed,
its `command`, `commit` and `machine` say where the figures come from, and the line under the table says so.
To measure again: run the command on such a machine with `--json bench/results/NAME.json`, then this.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
REGION = re.compile(r"^<!-- (bench/results/[\w.-]+\.json)(?: columns: ([^>]*?))? -->\n(.*?)^<!-- end -->$",
                    re.MULTILINE | re.DOTALL)


def render(document: dict[str, Any], columns: list[str] | None = None) -> str:
    """The Markdown table of a benchmark's figures, with a line that says where they come from."""
    table = document["table"]
    shown = columns or table["columns"]
    missing = [c for c in shown if c not in table["columns"]]
    if missing:
        raise ValueError(f"{document['bench']}'s table has no column {', '.join(missing)}")
    picks = [table["columns"].index(c) for c in shown]
    lines = [f"| {' | '.join(shown)} |", f"|{' --- |' * len(shown)}"]
    lines += [f"| {' | '.join(row[i] for i in picks)} |" for row in table["rows"]]
    where = ", ".join(part for part in (f"commit {document['commit']}" if document.get("commit") else "",
                                        document.get("machine") or "") if part)
    lines += ["", f"<sub>`{document['command']}`{f' ({where})' if where else ''}</sub>"]
    return "\n".join(lines) + "\n"


def rendered(text: str, root: Path = ROOT) -> str:
    """`text` with every marked table rendered again from its file."""
    def one(match: re.Match[str]) -> str:
        document = json.loads((root / match.group(1)).read_text(encoding="utf-8"))
        columns = [c.strip() for c in match.group(2).split(",")] if match.group(2) else None
        head = match.group(0).splitlines()[0]
        return f"{head}\n{render(document, columns)}<!-- end -->"

    return REGION.sub(one, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the tables are up to date")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = rendered(text)
    regions = len(REGION.findall(text))
    if args.check:
        if new != text:
            print(f"{DOC.relative_to(ROOT)}: a table is not what its figures give; run `python -m bench.docs`")
            return 1
        print(f"{DOC.relative_to(ROOT)}: {regions} tables, each what its figures give")
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"{DOC.relative_to(ROOT)}: {regions} tables rendered from bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
