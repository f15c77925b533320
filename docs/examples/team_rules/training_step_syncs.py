"""ACME's rule for our LightningModules: nothing in `training_step` may wait for the GPU."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Run, rule


@rule("ACME201", "sync-in-training-step", category="sync_point")
def sync_in_training_step(run: Run, functions: tuple[str, ...] = ("training_step",)) -> Iterator[Finding]:
    """A call in `training_step` makes the host wait for the GPU: `.item()`, `print(tensor)`, ...

    What it detects: every synchronizing call (`.item()`, `.tolist()`, `float(t)`, printing a CUDA
    tensor, `torch.cuda.synchronize()`, ...) made from a function named in `functions`, however cheap
    it looks; the built-in GD211 reports only the costly ones, wherever they are.

    Why it matters: our trainer reads the logged tensors every 50 steps; a sync in the step itself
    drains the GPU's queue on every step.

    Example: `self.log("loss", loss.item())` in `training_step`.

    Fix: log the tensor itself (`self.log("loss", loss)`) and let the trainer read it, or read values
    in `on_train_batch_end` every N steps.
    """
    steps = len(run.require_steps())
    for site in run.sites.syncs:
        if site.location is None or site.location.function not in functions:
            continue
        yield Finding(
            f"{site.kind} in {site.location.function}() waits for the GPU {site.count / steps:.0f}x per step",
            impact=site.host_s / run.step_view.wall_s,
            location=site.location,
            evidence={"calls per step": round(site.count / steps, 1),
                      "host blocked per step": (round(site.host_s / steps * 1e3, 3), "ms")},
            fix=f"log the tensor, not its value: move the {site.kind} out of {site.location.function}()",
        )
