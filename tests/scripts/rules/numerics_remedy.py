"""A rule file for the tests of the tiers of tries: a finding whose fix runs the model under bf16 autocast, which
changes the numerics (gpudoctor.remedy's tier "numerics"), so that `--try-fixes` leaves it and `--try-fixes=all`
measures it, with how far the loss moved."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Remedy, Run, rule


@rule("TIER101", "try-bf16-autocast", category="precision", severity="info")
def try_bf16_autocast(run: Run) -> Iterator[Finding]:
    """The model could run under bf16 autocast.

    What it detects: any run with steps.

    Why it matters: it gives the tests a fix of the numerics tier to try on a CPU.

    Fix: bf16 autocast around the model's calls.
    """
    run.require_steps()
    yield Finding("The model could run under bf16 autocast", impact=None, impact_reason="a test's finding",
                  evidence={"steps": len(run.steps)}, fix="torch.autocast(dtype=torch.bfloat16)",
                  remedy=Remedy(autocast="bfloat16"))


@rule("TIER102", "try-compile", category="compile", severity="info")
def try_compile(run: Run) -> Iterator[Finding]:
    """The model could be compiled.

    What it detects: any run with steps.

    Why it matters: it gives the tests a fix that compiles the model, of the numerics tier, to try on a CPU (with
    dynamo's eager backend, which compiles in seconds).

    Fix: torch.compile(model).
    """
    run.require_steps()
    yield Finding("The model could be compiled", impact=None, impact_reason="a test's finding",
                  evidence={"steps": len(run.steps)}, fix="torch.compile(model)", remedy=Remedy(compile="eager"))
