"""`Run` holds the steps and the figures its views make together; the rest is read on its views. The names rules read
on the run before the views still answer, each saying where its member lives now."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path

import pytest

from gpudoctor.analysis import MOVED, Run, RunNameMoved
from gpudoctor.testing import BundleBuilder


def _run(tmp_path: Path) -> Run:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=2, site=("train.py", 40, "main"))
    b.steps(6, wall_s=0.5, data_wait_s=0.2, gpu_busy_s=0.1)
    return b.build()


def test_an_old_name_reads_the_member_where_it_lives_now_and_says_so(tmp_path: Path) -> None:
    run = _run(tmp_path)
    with pytest.warns(RunNameMoved, match=r"run\.loader is run\.sites\.loader: read it there"):
        loader = run.loader  # type: ignore[attr-defined]
    assert loader is run.sites.loader
    with pytest.warns(RunNameMoved, match=r"run\.gpu_idle_share is run\.gpu_work\.idle_share"):
        assert run.gpu_idle_share == run.gpu_work.idle_share  # type: ignore[attr-defined]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_answers_as_its_new_spelling(tmp_path: Path, old: str) -> None:
    run = _run(tmp_path)
    with pytest.warns(RunNameMoved):
        value = getattr(run, old)
    assert value == attrgetter(MOVED[old])(run)


def test_the_run_itself_keeps_the_steps_and_what_its_views_make_together(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run.steps is run.step_view.steps
    assert run.pace.seconds == pytest.approx(0.5) and run.data_wait is not None
    public = {name for name in dir(Run) if not name.startswith("_")} - set(MOVED)
    assert len(public) <= 33, sorted(public)  # a new figure of one view belongs on that view (throughput: the
    # pace, the device and the counted step together)
