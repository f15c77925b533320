"""`gpudoctor rules new`: a starter rule file and its test, written with the public API only."""

from __future__ import annotations

import keyword
from pathlib import Path

from gpudoctor.engine.api import NAME_PATTERN, REQUIRED_SECTIONS, check_code
from gpudoctor.engine.loading import BUILTIN_PREFIX
from gpudoctor.engine.retired import refuse_retired
from gpudoctor.errors import OutputNotWritableError, RuleLoadError
from gpudoctor.vocabulary import CATEGORIES

DEFAULT_NAME = "long-data-wait"

RULE_TEMPLATE = '''\
"""{code} {name}: a team rule for gpudoctor, started by `gpudoctor rules new`. Edit it to fit."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Run, rule


# The docstring is the rule's documentation (`gpudoctor rules explain {code}`): a summary line, then the
# paragraphs {sections}; a rule without one still loads and runs, and `gpudoctor rules check` says which it lacks.
@rule("{code}", "{name}", category="{category}", severity="warning")
def {function}(run: Run, max_wait_s: float = 0.2) -> Iterator[Finding]:
    """Steps wait longer than `max_wait_s` seconds for their next batch.

    What it detects: steps after start-up whose wait for the DataLoader's next batch exceeds
    `max_wait_s` (an option: set it in pyproject.toml under [tool.gpudoctor.rules.{code}]).

    Why it matters: while the step waits for data, the GPU has nothing to do.

    Example: a dataset read from network storage, one small file per sample.

    Fix: read ahead: more DataLoader workers, a local cache, or fewer and larger files.
    """
    run.require_steps()  # no step detected: the rule is "not evaluated", never "passed"
    steps = run.step_view.steady_steps  # every step after start-up; data wait is measured at each one
    slow = [s for s in steps if s.data_wait_s > max_wait_s]
    if not slow:
        return
    yield Finding(
        f"{{len(slow)}} of {{len(steps)}} steps wait more than {{max_wait_s * 1e3:.0f}} ms for data",
        impact=sum(s.data_wait_s for s in slow) / sum(s.wall_s for s in steps),
        location=run.sites.loader.location,
        evidence={{"longest wait": (round(max(s.data_wait_s for s in slow) * 1e3, 1), "ms")}},
        fix="raise DataLoader(num_workers=...) or cache the data on local disk",
    )
'''

TEST_TEMPLATE = '''\
"""Tests of rule {code}: bundles built in a few lines, where it fires and where it stays silent."""

from gpudoctor.testing import BundleBuilder, assert_fires, assert_silent

from {module} import {function}


def slow_loader(tmp_path, data_wait_s):
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=2, site=("train.py", 40, "main"))
    b.steps(6, wall_s=0.5, data_wait_s=data_wait_s, gpu_busy_s=0.1)
    return b.build()


def test_fires_when_steps_wait_long_for_data(tmp_path):
    findings = assert_fires({function}, slow_loader(tmp_path, 0.3), count=1, location="train.py:40")
    assert findings[0]["title"].startswith("6 of 6 steps")


def test_silent_when_data_is_ready(tmp_path):
    assert_silent({function}, slow_loader(tmp_path, 0.01))


def test_the_threshold_is_an_option(tmp_path):
    assert_silent({function}, slow_loader(tmp_path, 0.3), options={{"max_wait_s": 0.4}})
'''


def _check(code: str, name: str, category: str) -> None:
    check_code(code, "")
    refuse_retired(code, "gpudoctor rules new", "is never given to another rule; choose another code")
    if code.startswith(BUILTIN_PREFIX):
        raise RuleLoadError(f"rule code {code} uses the prefix GD, which is reserved for gpudoctor's built-in rules; "
                            "give your team's rules their own prefix, e.g. ACME101.")
    if not NAME_PATTERN.match(name):
        raise RuleLoadError(f"rule name '{name}' must be kebab-case, e.g. --name loader-starves-gpu.")
    if category not in CATEGORIES:
        raise RuleLoadError(f"category '{category}' is unknown; use one of: {', '.join(CATEGORIES)}.")


def _sections() -> str:
    """'"What it detects:", "Why it matters:" and "Fix:"'."""
    quoted = [f'"{s}:"' for s in REQUIRED_SECTIONS]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def new_rule(code: str, name: str = DEFAULT_NAME, category: str = "data_starvation",
             directory: Path = Path(".")) -> list[Path]:
    """Write `<directory>/<code>.py` (the rule) and `<directory>/test_<code>.py` (its test); return both paths."""
    code = code.upper()
    _check(code, name, category)
    module = code.lower()
    function = name.replace("-", "_") + ("_" if keyword.iskeyword(name) else "")
    files = {directory / f"{module}.py": RULE_TEMPLATE, directory / f"test_{module}.py": TEST_TEMPLATE}
    for path in files:
        if path.exists():
            raise OutputNotWritableError(f"{path} already exists; choose another code or --dir, or move the file away.")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, template in files.items():
            path.write_text(template.format(code=code, name=name, category=category, function=function,
                                            module=module, sections=_sections()), encoding="utf-8")
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write the rule into {directory} ({exc.strerror}).") from None
    return list(files)
