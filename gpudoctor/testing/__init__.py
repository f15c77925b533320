"""Helpers for testing rules: build a run bundle in a few lines, open a recorded one, run one rule on it.

`BundleBuilder` writes the same files, in the same formats, that `gpudoctor profile` writes (manifest.json,
events.jsonl, samples/*.jsonl and a Chrome trace, trace.json.gz), so what it builds is read by the real
loader: `gpudoctor.bundle.load` and `Run.from_bundle`. A rule test describes a run by the numbers it
cares about and lets the builder fill in the rest::

    from gpudoctor.testing import BundleBuilder, assert_fires, assert_silent

    def test_loader_in_main_process(tmp_path):
        b = BundleBuilder(tmp_path)
        b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
        b.steps(5, wall_s=0.100, data_wait_s=0.060, gpu_busy_s=0.030)
        findings = assert_fires(my_rule, b.build(), count=1)
        assert findings[0]["location"]["line"] == 41

Steps are numbered from 0 and take the profiling-window state that the recorder would give them: with
the default `window=(0, 0, None)` every step is an analysed ("active") step; with `window=(5, 2, 5)` the
first five are "waiting", the next two "warmup", the next five "active" and the rest "closed". Only
warm-up and active steps carry phases, copies, syncs, GIL and CUDA-memory figures, as in a real run.
Times are seconds, sizes bytes, CPU in cores; every step starts where the previous one ended.

`load_fixture(name)` opens a bundle recorded on a GPU (fixtures/bundles/NAME, or packed in a .tar.gz
there); `run_rule`, `assert_fires`, `assert_silent` and `assert_not_evaluated` run one rule on a run.
`read_expectations` reads the `# expect:` comments a fixture script writes on the lines its findings must
point at, and `check_findings` compares findings with them (gpudoctor.testing.expectations has the format).
"""

from __future__ import annotations

from gpudoctor.testing.assertions import (
    RuleRaised,
    UndocumentedRuleWarning,
    assert_fires,
    assert_not_evaluated,
    assert_silent,
    evaluate,
    run_rule,
)
from gpudoctor.testing.builder import BundleBuilder
from gpudoctor.testing.expectations import (
    Expectation,
    ExpectationError,
    Expectations,
    Mismatch,
    check_findings,
    parse_expectations,
    read_expectations,
)
from gpudoctor.testing.fixtures import FIXTURES_ENV, available_fixtures, fixture_path, load_fixture

__all__ = [
    "FIXTURES_ENV", "BundleBuilder", "Expectation", "ExpectationError", "Expectations", "Mismatch", "RuleRaised",
    "UndocumentedRuleWarning",
    "assert_fires", "assert_not_evaluated", "assert_silent", "available_fixtures", "check_findings", "evaluate",
    "fixture_path", "load_fixture", "parse_expectations", "read_expectations", "run_rule",
]
