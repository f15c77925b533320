"""A try beside the prediction it tests: the finding whose saving a tried fix makes, and where the try is not the fix
the prediction assumes, what each of the two figures assumes.

A job's straggler finding (GD601) has no fix of its own to try: its saving is made by the fix of the slow rank's
own finding (GD101 on rank 1), whose saving it counts (`FindingRecord.counted_in`). That fix's try is then the
straggler's too (`Tried.fix_of`). Its prediction changes only the slow rank, the others keeping their settings (and
their own limits, which the wait hid), while a try applies a remedy in every process that builds the loader it
names: where it changed ranks the prediction leaves as they ran, the finding says so (`Tried.not_as_predicted`),
and shows both figures, each with what it assumes.
"""

from __future__ import annotations

import msgspec

from gpudoctor.bundle.findings import FindingRecord, Tried, TriedChange

STRAGGLER = "straggler"  # the category of a finding whose prediction changes its slow rank alone
LENT = ("measured", "failed")  # a try that ran: what it measured, or why it says nothing of the fix


def with_borrowed_tries(findings: list[FindingRecord], step_s: float | None) -> list[FindingRecord]:
    """The findings, a job's finding that counts another's saving given that one's try (measured or failed), and
    every measured try reconciled with its finding's prediction."""
    measured = {f.counted_in: f for f in findings
                if f.counted_in and f.tried is not None and f.tried.status in LENT}
    return [reconciled(_borrowed(f, measured.get(f.code)), step_s) for f in findings]


def _borrowed(finding: FindingRecord, lender: FindingRecord | None) -> FindingRecord:
    """The finding with `lender`'s try, where it has no fix of its own and `lender`'s fix makes its saving."""
    if lender is None or lender.tried is None or finding.remedy is not None:
        return finding
    return msgspec.structs.replace(finding, tried=msgspec.structs.replace(lender.tried, fix_of=lender.code))


def reconciled(finding: FindingRecord, step_s: float | None) -> FindingRecord:
    """The finding, its measured try saying how it differs from the fix its prediction assumes, where it does."""
    tried = finding.tried
    if tried is None or tried.status != "measured" or finding.saving_s is None or not step_s:
        return finding
    said = not_as_predicted(finding, tried, step_s - finding.saving_s)
    return finding if said is None else msgspec.structs.replace(
        finding, tried=msgspec.structs.replace(tried, not_as_predicted=said))


def not_as_predicted(finding: FindingRecord, tried: Tried, predicted_s: float) -> str | None:
    """'the prediction (~31.4 ms/step) changes rank 1 alone, rank 0 as it ran (the job's step then set by rank 0's
    loader: 2 workers, 5 ms of CPU per batch); the try changed rank 0 too (persistent_workers False → True) and
    measured 22.9 ms/step'; None where the try changed no rank the prediction leaves as it ran."""
    predicted_ranks = _predicted_ranks(finding)
    if predicted_ranks is None or not tried.changes or tried.step_s is None:
        return None
    others = [c for c in tried.changes if c.rank is not None and c.rank not in predicted_ranks]
    if not others:
        return None
    alone, kept = _ranks(sorted(predicted_ranks)), _ranks(sorted({c.rank for c in others if c.rank is not None}))
    limit = _evidence(finding, "then limited by")
    set_by = f" (the job's step then set by {limit})" if limit else ""
    return (f"the prediction (~{_ms(predicted_s)}/step) changes {alone} alone, {kept} as {_it_they(others)} ran"
            f"{set_by}; the try changed {kept} too ({_changes(others)}) and measured {_ms(tried.step_s)}/step")


def _predicted_ranks(finding: FindingRecord) -> set[int] | None:
    """The ranks a finding's prediction changes: a straggler's slow rank, a rank's finding's ranks; None for a run
    of one process, where there is nothing else to change."""
    if finding.category == STRAGGLER:
        slow = _evidence(finding, "slow rank")
        return {slow} if isinstance(slow, int) else None
    return set(finding.ranks) if finding.ranks else None


def _evidence(finding: FindingRecord, name: str) -> object:
    return next((e.value for e in finding.evidence if e.name == name), None)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _it_they(changes: list[TriedChange]) -> str:
    return "it" if len({c.rank for c in changes}) == 1 else "they"


def _changes(changes: list[TriedChange]) -> str:
    """'persistent_workers False → True', by rank where they are several."""
    ranks = sorted({c.rank for c in changes if c.rank is not None})
    parts = []
    for rank in ranks:
        said = ", ".join(f"{c.setting} {c.before} → {c.after}" for c in changes if c.rank == rank)
        parts.append(said if len(ranks) == 1 else f"rank {rank}: {said}")
    return "; ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
