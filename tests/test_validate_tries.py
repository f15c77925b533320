"""bench/validate_tries.py: the tries table in docs/rules.md is what fixtures/tries.json gives, and each try is set
beside a twin with its own setting."""

from __future__ import annotations

import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))  # a bench script imports its neighbours, as when it runs from bench/
from validate_tries import RECORDED, TRY_PAIRS, _saving_within, _workers_of, table


def test_the_rules_page_shows_the_recorded_tries() -> None:
    assert table(json.loads(RECORDED.read_text())) in (REPO / "docs" / "rules.md").read_text(encoding="utf-8"), \
        "run `PYTHONPATH=$PWD python3 bench/validate_tries.py` and paste its table into docs/rules.md"


def test_every_pair_that_can_be_tried_is_recorded() -> None:
    recorded = {(row["bad"], row["code"]) for row in json.loads(RECORDED.read_text())["pairs"]}
    assert {(pair.bad, pair.code) for pair in TRY_PAIRS} == recorded


def test_a_twin_takes_the_workers_the_try_gave() -> None:
    tried = {"changes": [{"rank": None, "setting": "num_workers", "before": 128, "after": 31},
                         {"rank": None, "setting": "persistent_workers", "before": False, "after": True}]}
    assert _workers_of(tried) == ("--workers", "31")
    assert _workers_of({"changes": None}) == ()
    assert _workers_of(None) == ()


def test_a_prediction_is_judged_as_a_saving_within_thirty_percent_or_five_points() -> None:
    assert _saving_within(0.95, 41.26) == "yes"  # a 95% saving beside a twin's 97.6%
    assert _saving_within(0.34, 1.02) == "no"  # loader_pageable: 34% predicted, 2% measured
    assert _saving_within(0.52, 3.11) == "yes"  # 52% beside 68%: within ±30%
    assert _saving_within(None, 2.0) == "—"
