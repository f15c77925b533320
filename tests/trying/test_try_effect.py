"""A try read back from its own bundle (gpudoctor.trying.effect), beside its finding's prediction (trying.reconcile),
and as the report says it (report/tried.py): on bundles written here, starting no process."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpudoctor.bundle.events import AnyEvent, EnvWindowEvent, LoaderEvent, RemedyEvent
from gpudoctor.bundle.findings import Evidence, FindingLocation, FindingRecord, Tried, TriedChange
from gpudoctor.bundle.records import Site
from gpudoctor.remedy import LoaderRemedy, Remedy
from gpudoctor.report.render import cost_text, tried_lines
from gpudoctor.report.tried import GAIN, gained, tried_head, tried_lead, tried_text
from gpudoctor.trying.effect import applied_per_rank, effects, not_in_effect
from gpudoctor.trying.reconcile import with_borrowed_tries

AT = Site(file="/proj/train.py", line=53, function="train_dataloader")
REMEDY = Remedy(loader=LoaderRemedy(at="/proj/train.py:53", num_workers=3, persistent_workers=True))


def _loader(workers: int, persistent: bool = False, made_by: str | None = None, site: Site = AT) -> LoaderEvent:
    return LoaderEvent(loader_id=0, site=site, num_workers=workers, persistent_workers=persistent,
                       prefetch_factor=2 if workers else None, made_by=made_by, dataset="SlowDisk",
                       start_method="fork")


def _bundle(folder: Path, *events: AnyEvent) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    (folder / "events.jsonl").write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in events))
    return folder


def _job(root: Path, *ranks: tuple[AnyEvent, ...]) -> Path:
    for rank, events in enumerate(ranks):
        _bundle(root / f"rank-{rank}", *events)
    return root


def test_a_loader_lightning_built_again_without_the_fix_is_not_in_effect_on_that_rank(tmp_path: Path) -> None:
    diagnosed = _job(tmp_path / "run", (_loader(2, made_by="lightning"),), (_loader(0, made_by="lightning"),))
    tried = _job(tmp_path / "run" / "tries" / "GD101",
                 (RemedyEvent(applied="DataLoader(num_workers=3)"), _loader(3, True, "lightning")),
                 (RemedyEvent(applied="DataLoader(num_workers=3)"), _loader(0, made_by="lightning")))
    found = effects(REMEDY, diagnosed, tried)
    assert not_in_effect(found) == ("not in effect on rank 1: its DataLoader was re-created by Lightning with "
                                    "num_workers=0")
    assert applied_per_rank(found) == "rank 0: num_workers 2 → 3, persistent_workers False → True"


def test_each_ranks_changes_are_read_from_the_try(tmp_path: Path) -> None:
    diagnosed = _job(tmp_path / "run", (_loader(6),), (_loader(0),))
    tried = _job(tmp_path / "try", (_loader(15, True),), (_loader(15, True),))
    remedy = Remedy(loader=LoaderRemedy(at="/proj/train.py:53", num_workers=15, persistent_workers=True))
    found = effects(remedy, diagnosed, tried)
    assert not_in_effect(found) is None
    assert applied_per_rank(found) == ("rank 0: num_workers 6 → 15, persistent_workers False → True; "
                                       "rank 1: 0 → 15, False → True")
    assert [(c.rank, c.setting, c.before, c.after) for e in found for c in e.changes] == [
        (0, "num_workers", 6, 15), (0, "persistent_workers", False, True),
        (1, "num_workers", 0, 15), (1, "persistent_workers", False, True)]


def test_a_setting_names_are_left_out_only_where_the_rank_before_changed_the_same(tmp_path: Path) -> None:
    remedy = Remedy(loader=LoaderRemedy(at="/proj/train.py:53", num_workers=15))
    found = effects(remedy, _job(tmp_path / "run", (_loader(6),), (_loader(0),)),
                    _job(tmp_path / "try", (_loader(15),), (_loader(15),)))
    assert applied_per_rank(found) == "rank 0: num_workers 6 → 15; rank 1: 0 → 15"


def test_a_loader_the_script_changes_after_building_it_is_named_by_its_line(tmp_path: Path) -> None:
    found = effects(REMEDY, _bundle(tmp_path / "run", _loader(0)), _bundle(tmp_path / "try", _loader(0)))
    assert not_in_effect(found) == "not in effect: its DataLoader at /proj/train.py:53 ran with num_workers=0"
    assert applied_per_rank(found) is None  # a run of one process: its RemedyEvents say what was applied


def test_settings_the_fix_leaves_alone_are_not_required(tmp_path: Path) -> None:
    """Pinning is skipped in a process that used no GPU, and the workers' settings on a loader without workers."""
    remedy = Remedy(loader=LoaderRemedy(at="/proj/train.py:53", num_workers=2, pin_memory=True,
                                        persistent_workers=True))
    found = effects(remedy, _bundle(tmp_path / "run", _loader(0)), _bundle(tmp_path / "try", _loader(2, True)))
    assert not_in_effect(found) is None
    other_line = _loader(0, site=Site(file="/proj/train.py", line=90))  # an evaluation loader: not the fix's
    found = effects(remedy, _bundle(tmp_path / "run2", other_line), _bundle(tmp_path / "try2", other_line))
    assert not_in_effect(found) is None and found[0].changes == []


def test_a_fix_for_one_rank_asks_nothing_of_the_others(tmp_path: Path) -> None:
    remedy = msgspec.structs.replace(REMEDY, rank=1)
    found = effects(remedy, _job(tmp_path / "run", (_loader(2),), (_loader(0),)),
                    _job(tmp_path / "try", (_loader(2),), (_loader(3, True),)))
    assert not_in_effect(found) is None
    assert applied_per_rank(found) == "rank 1: num_workers 0 → 3, persistent_workers False → True"


def test_threads_are_read_from_the_window(tmp_path: Path) -> None:
    remedy = Remedy(intra_op_threads=1)
    found = effects(remedy, _bundle(tmp_path / "run", EnvWindowEvent(intra_op_threads=4)),
                    _bundle(tmp_path / "try", EnvWindowEvent(intra_op_threads=4)))
    assert not_in_effect(found) == "not in effect: torch ran 4 intra-op threads"


# -- beside the prediction ------------------------------------------------------------------------------------
STEP_S = 0.6642


def _straggler(tried: Tried | None = None) -> FindingRecord:
    return FindingRecord(
        code="GD601", name="straggler", category="straggler", severity="critical",
        title="Rank 1 holds back the others: rank 0 waits for it in every collective", impact=0.816,
        saving_s=STEP_S - 0.122, evidence=[Evidence(name="slow rank", value=1),
                                           Evidence(name="then limited by",
                                                    value="rank 0's loader: 6 workers, 569 ms of CPU per batch")],
        location=FindingLocation(file="/proj/train.py", line=53), fix="load rank 1's data as fast", tried=tried)


def _slow_ranks_loader(tried: Tried | None) -> FindingRecord:
    return FindingRecord(
        code="GD101", name="loader-in-main-process", category="data_starvation", severity="critical",
        title="Each step waits 90% of its time", impact=None, impact_reason="counted in GD601's finding",
        evidence=[], location=FindingLocation(file="/proj/train.py", line=53), fix="DataLoader(num_workers=15)",
        ranks=[1], counted_in="GD601", remedy=REMEDY, tried=tried)


MEASURED = Tried(status="measured", applied="rank 0: num_workers 6 → 15; rank 1: 0 → 15", step_s=0.0484,
                 speedup=STEP_S / 0.0484, steps=40,
                 changes=[TriedChange(rank=0, setting="num_workers", before=6, after=15),
                          TriedChange(rank=1, setting="num_workers", before=0, after=15)])


def test_a_straggler_carries_the_try_of_its_causes_fix_and_says_what_each_figure_assumes() -> None:
    straggler, loader = with_borrowed_tries([_straggler(), _slow_ranks_loader(MEASURED)], STEP_S)
    assert loader.tried == MEASURED  # no prediction of its own: nothing to reconcile
    tried = straggler.tried
    assert tried is not None and tried.fix_of == "GD101" and tried.step_s == MEASURED.step_s
    assert tried.not_as_predicted == (
        "the prediction (~122.0 ms/step) changes rank 1 alone, rank 0 as it ran (the job's step then set by rank 0's "
        "loader: 6 workers, 569 ms of CPU per batch); the try changed rank 0 too (num_workers 6 → 15) and measured "
        "48.4 ms/step")


def test_a_try_that_is_the_predicted_fix_says_nothing_more() -> None:
    only_the_slow_rank = msgspec.structs.replace(MEASURED, changes=MEASURED.changes[1:])
    [straggler, _] = with_borrowed_tries([_straggler(), _slow_ranks_loader(only_the_slow_rank)], STEP_S)
    assert straggler.tried is not None and straggler.tried.not_as_predicted is None


def test_a_failed_try_is_the_stragglers_too() -> None:
    failed = Tried(status="failed", reason="not in effect on rank 1: its DataLoader was re-created by Lightning "
                                           "with num_workers=0")
    [straggler, loader] = with_borrowed_tries([_straggler(), _slow_ranks_loader(failed)], STEP_S)
    assert loader.tried == failed
    assert straggler.tried == msgspec.structs.replace(failed, fix_of="GD101")
    assert tried_text(STEP_S, straggler.to_json()) == f"tried, failed: {failed.reason}"


# -- as the report says it ------------------------------------------------------------------------------------
def test_a_measured_try_leads_the_line_and_the_verdict() -> None:
    straggler = with_borrowed_tries([_straggler(), _slow_ranks_loader(MEASURED)], STEP_S)[0].to_json()
    assert tried_head(STEP_S, straggler) == "measured 664.2 → 48.4 ms/step, 13.7×; predicted ~122.0 ms"
    assert tried_lead(STEP_S, [straggler]) == ("Tried GD101's fix: measured 664.2 → 48.4 ms/step, 13.7× "
                                               "(GD601 predicted ~122.0 ms).")
    assert gained(straggler)


@pytest.mark.parametrize(("speedup", "said", "head"), [
    (1.04, "no faster (1.04×)", "no faster"), (1 / 1.06, "1.06× slower", "1.06× slower"),
    (GAIN, "1.05× faster", "1.05×")])
def test_a_try_under_the_gain_is_no_success(speedup: float, said: str, head: str) -> None:
    finding = _straggler(Tried(status="measured", step_s=STEP_S / speedup, speedup=speedup, steps=30)).to_json()
    assert tried_text(STEP_S, finding).endswith(f"with the fix ({said})")
    assert f", {head};" in tried_head(STEP_S, finding)
    assert gained(finding) == (speedup >= GAIN)


def test_the_terminal_shows_what_each_rank_got_and_how_it_differs_from_the_prediction() -> None:
    straggler = with_borrowed_tries([_straggler(), _slow_ranks_loader(MEASURED)], STEP_S)[0].to_json()
    assert cost_text(STEP_S, straggler) == " (measured 664.2 → 48.4 ms/step, 13.7×; predicted ~122.0 ms)"
    lines = tried_lines(STEP_S, straggler)
    assert lines[:2] == ["tried: GD101's fix: rank 0: num_workers 6 → 15; rank 1: 0 → 15",
                         "predicted ~122.0 ms/step, measured 48.4 ms/step with the fix (13.72× faster)"]
    assert lines[2].startswith("not the predicted fix: the prediction (~122.0 ms/step) changes rank 1 alone")
    assert cost_text(STEP_S, _straggler().to_json()) == " (fix saves ~82%: 664.2 → ~122.0 ms/step (≈5.4×))"
