"""The step time budget as findings.json and the report show it: each slice with the findings that claim it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpudoctor.analysis.budget import SLICE_LABELS, SLICES_OF_CATEGORY, Budget
from gpudoctor.analysis.views import Location
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.report.document import BudgetJson, HostLineJson

MAX_HOST_LINES = 5


def host_lines_json(host_lines: Sequence[tuple[Location, float]]) -> list[HostLineJson]:
    """The lines, each share rounded down to 4 decimals so that the shares never add up to more than 1."""
    return [{"file": where.file, "line": where.line, "function": where.function,
             "share": math.floor(share * 1e4) / 1e4}
            for where, share in host_lines[:MAX_HOST_LINES]]


def budget_json(budget: Budget | None, findings: Sequence[FindingRecord]) -> BudgetJson | None:
    if budget is None:
        return None
    claims: dict[str, list[str]] = {}
    for finding in findings:
        for where in SLICES_OF_CATEGORY.get(finding.category, ()) if finding.impact else ():
            if finding.code not in claims.setdefault(where, []):
                claims[where].append(finding.code)
    return {
        "step_s": round(budget.step_s, 9), "steps": budget.steps, "profiler_s": round(budget.profiler_s, 9),
        "slices": [{"slice": s.name, "label": SLICE_LABELS[s.name], "seconds": round(s.seconds, 9),
                    "share": round(min(1.0, s.share), 6), "claimed_by": claims.get(s.name, [])}
                   for s in budget.slices],
    }
