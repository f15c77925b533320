"""Running one rule so that nothing it does can take the run down with it.

A rule runs in a thread of its own, under a time limit and a cap on its findings: one that raises, yields
something that is not a valid Finding, yields more than `max_findings`, or is still running after `time_s`
becomes an error of that rule alone (a rule still running is left behind, on a daemon thread, and said so).
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.analysis import NotEvaluated, Run
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.engine.api import Finding, Rule
from gpudoctor.engine.checks import finding_record

# The built-in rules take milliseconds on a big run's views (and the views, built once, a few seconds): a rule
# still running after this long is stuck. `rule_timeout` in [tool.gpudoctor] or --rule-timeout changes it.
DEFAULT_RULE_TIMEOUT_S = 30.0
# More findings than this from one rule is a rule that does not stop (the built-in ones yield one per call site).
MAX_FINDINGS_PER_RULE = 1000


@dataclass(frozen=True)
class RuleLimits:
    time_s: float = DEFAULT_RULE_TIMEOUT_S
    max_findings: int = MAX_FINDINGS_PER_RULE


class RuleTimedOut(Exception):
    """The rule was still running at the time limit."""


class TooManyFindings(Exception):
    """The rule yielded more findings than the cap."""


@dataclass
class Outcome:
    """What one rule came to: its findings, or why it was not evaluated, or the error that stopped it."""

    records: list[FindingRecord] = field(default_factory=list)
    not_evaluated: str | None = None
    error: BaseException | None = None
    stack: str = ""  # where a rule that timed out was when it was left behind


# The name of a rule's thread begins so (a thread left behind by a rule that timed out is told by it).
RULE_THREAD_PREFIX = "gpudoctor-rule-"


def evaluate_rule(rule: Rule, run: Run | Any, overrides: Mapping[str, object], limits: RuleLimits) -> Outcome:
    outcome = Outcome()
    thread = threading.Thread(target=_collect, args=(rule, run, overrides, limits, outcome),
                              name=f"{RULE_THREAD_PREFIX}{rule.code}", daemon=True)
    thread.start()
    thread.join(limits.time_s)
    if not thread.is_alive():
        return outcome
    return Outcome(error=RuleTimedOut(f"rule {rule.code} was still running after {limits.time_s:g} s and was left "
                                      "behind; make it faster, or allow more with --rule-timeout"),
                   stack=_stack_of(thread))


def _collect(rule: Rule, run: Run | Any, overrides: Mapping[str, object], limits: RuleLimits, outcome: Outcome) -> None:
    try:
        produced = rule.func(run, **{**rule.options, **overrides})
        if isinstance(produced, Finding):
            raise TypeError(f"rule {rule.code} returned a Finding; yield it (or return a list of Findings)")
        for item in produced or ():
            outcome.records.append(finding_record(rule, item))
            if len(outcome.records) > limits.max_findings:
                raise TooManyFindings(f"rule {rule.code} yielded more than {limits.max_findings} findings; "
                                      "yield one per cause (per call site), not one per event")
    except NotEvaluated as exc:
        outcome.not_evaluated = str(exc)
    except BaseException as exc:  # noqa: BLE001 - whatever a rule raises (SystemExit too) is its own error
        outcome.records.clear()
        outcome.error = exc


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame, limit=4)) if frame is not None else ""
