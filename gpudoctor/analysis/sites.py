"""Call sites: the copies and syncs of the analysed steps, summed per line of the user's code."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from gpudoctor.analysis.views import CopySite, Location, SyncSite
from gpudoctor.bundle.events import CopyRow, StepEvent, SyncRow
from gpudoctor.bundle.records import Site


def _line(site: Site | None) -> tuple[str | None, int | None]:
    return (site.file, site.line) if site is not None else (None, None)


def copy_sites(steps: Iterable[StepEvent]) -> list[CopySite]:
    """Host<->device copies per (direction, pinned, non_blocking, line), the most host time first."""
    groups: dict[tuple[object, ...], list[CopyRow]] = defaultdict(list)
    for step in steps:
        for row in step.copies or ():
            key = (row.direction, row.pinned, row.non_blocking, *_line(row.site))
            groups[key].append(row)
    sites = [CopySite(rows[0].direction, rows[0].pinned, rows[0].non_blocking, sum(r.count for r in rows),
                      sum(r.bytes for r in rows), sum(r.host_s for r in rows), max(r.max_s for r in rows),
                      Location.from_site(rows[0].site))
             for rows in groups.values()]
    return sorted(sites, key=lambda c: -c.host_s)


def sync_sites(steps: Iterable[StepEvent]) -> list[SyncSite]:
    """Synchronizing calls per (kind, line), the most host time blocked first."""
    groups: dict[tuple[object, ...], list[SyncRow]] = defaultdict(list)
    for step in steps:
        for row in step.syncs or ():
            key = (row.kind, row.via, *_line(row.site))
            groups[key].append(row)
    sites = [SyncSite(rows[0].kind, sum(r.count for r in rows), sum(r.host_s for r in rows),
                      max(r.max_s for r in rows), Location.from_site(rows[0].site), rows[0].via)
             for rows in groups.values()]
    return sorted(sites, key=lambda s: -s.host_s)
