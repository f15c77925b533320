"""A job of many ranks made of a recorded job's: its rank bundles replicated as rank-0 ... rank-(N-1), each
saying its new rank and the job's size, so that `gpudoctor analyze` reads a job of N ranks of recorded data.

    build_job(Path("fixtures/job_bundles/job_lightning_straggler_bad"), 64, Path("/tmp/job64"))

Rank K is a copy of the recorded rank K % R (R the recorded job's ranks): its steps, trace and samples as they
were recorded, the slow rank among them again every R ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpudoctor.bundle.layout import rank_dirs

# What a rank bundle holds that its analysis reads; its findings and report are written again.
KEPT = ("events.jsonl", "manifest.json", "trace.json.gz", "samples")


def build_job(recorded: Path, ranks: int, out: Path) -> Path:
    """`ranks` rank bundles in `out` (made anew), replicated from the recorded job `recorded`."""
    sources = list(rank_dirs(recorded).values())
    if not sources:
        raise SystemExit(f"{recorded} holds no rank bundle")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for rank in range(ranks):
        source, target = sources[rank % len(sources)], out / f"rank-{rank}"
        target.mkdir()
        for name in KEPT:
            if (source / name).is_dir():
                shutil.copytree(source / name, target / name)
            elif (source / name).is_file():
                shutil.copy2(source / name, target / name)
        _renumber(target / "events.jsonl", rank, ranks)
    return out


def _renumber(events: Path, rank: int, world_size: int) -> None:
    """The rank's records say its new rank and the job's size."""
    lines = []
    for line in events.read_text().splitlines():
        record = json.loads(line)
        if "world_size" in record:
            record["world_size"] = world_size
            if "rank" in record:
                record["rank"] = rank
            if "local_world_size" in record:
                record["local_world_size"] = world_size
        lines.append(json.dumps(record, separators=(",", ":")))
    events.write_text("\n".join(lines) + "\n")
