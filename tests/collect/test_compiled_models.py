"""gpudoctor's hooks under torch.compile: the script runs as without them, compiles its model as often, and torch's
warning about global module hooks, which are gpudoctor's, is not shown."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import Gpudoctor, script
from gpudoctor.bundle.events import ForwardSiteEvent, StepEvent


def test_a_compiled_model_runs_under_the_hooks_in_evaluation_and_training(gd: Gpudoctor) -> None:
    # The small window (wait 1, warm-up 1, active 2, detail 1) puts detail steps, with every per-call hook on, in the
    # evaluation; after the restart, the window's detail steps come in the training loop.
    result = gd.profile(script("compiled_model.py"))
    assert result.returncode == 0, result
    plain = subprocess.run([sys.executable, script("compiled_model.py")], capture_output=True, text=True, check=True)
    compiles = re.compile(r"done, (\d+) compiles")
    assert compiles.search(result.stdout).group(1) == compiles.search(plain.stdout).group(1), (plain.stdout, result)
    assert "global hooks" not in result.stderr, result.stderr
    assert len([e for e in result.events(StepEvent) if e.source == "optimizer"]) == 12
    assert {e.site.function for e in result.events(ForwardSiteEvent) if e.site} == {"evaluate", "main"}
    assert result.findings()["run"]["step_source"] == "optimizer"


def test_a_model_a_try_compiled_is_known_by_identity_even_when_its_class_cannot_be_hashed() -> None:
    import weakref

    from torch import nn

    from gpudoctor.collect.step_hooks import COMPILED_BY_A_TRY, compiled

    class Unhashable(nn.Module):  # as a dataclass with eq=True is
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Unhashable)

    model, other = Unhashable(), Unhashable()
    COMPILED_BY_A_TRY.append(weakref.ref(model))
    try:
        assert compiled(model) and not compiled(other)  # equal to the model, and not it
    finally:
        COMPILED_BY_A_TRY.pop()
