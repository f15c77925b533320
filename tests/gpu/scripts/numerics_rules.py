"""A rule file for the GPU suite's try of the numerics tier: findings whose fixes compile the loop's model with
inductor (whose Triton compile workers are processes of the job) and run it under bf16 autocast, so that
`--try-fixes=all` applies both inside the user's process on a GPU."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Remedy, Run, rule


@rule("SUITE301", "suite-compile", category="compile", severity="info")
def suite_compile(run: Run) -> Iterator[Finding]:
    """The model could be compiled.

    What it detects: any run with steps.

    Why it matters: the GPU suite tries torch.compile with inductor in the user's process.

    Fix: torch.compile(model).
    """
    run.require_steps()
    yield Finding("The model could be compiled", impact=None, impact_reason="the GPU suite's finding",
                  evidence={"steps": len(run.steps)}, fix="torch.compile(model)", remedy=Remedy(compile="inductor"))


@rule("SUITE302", "suite-autocast", category="precision", severity="info")
def suite_autocast(run: Run) -> Iterator[Finding]:
    """The model could run under bf16 autocast.

    What it detects: any run with steps.

    Why it matters: the GPU suite tries bf16 autocast in the user's process.

    Fix: torch.autocast("cuda", dtype=torch.bfloat16).
    """
    run.require_steps()
    yield Finding("The model could run under bf16 autocast", impact=None, impact_reason="the GPU suite's finding",
                  evidence={"steps": len(run.steps)}, fix="torch.autocast(dtype=torch.bfloat16)",
                  remedy=Remedy(autocast="bfloat16"))
