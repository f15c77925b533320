"""ACME's input-pipeline rule: our datasets live on NFS, and a slow read shows as a long wait for data."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Run, rule


@rule("ACME101", "slow-loader-wait", category="data_starvation")
def slow_loader_wait(run: Run, max_wait_s: float = 0.2) -> Iterator[Finding]:
    """Steps wait more than `max_wait_s` seconds for their next batch: the data comes slowly off NFS.

    What it detects: steps after start-up whose wait for the DataLoader's next batch exceeds
    `max_wait_s` seconds (200 ms unless the project sets it).

    Why it matters: our datasets live on NFS. When the filer is slow, every worker waits on it, the
    step waits on the workers, and the GPU waits on the step; more workers do not help.

    Example: `ImageFolder("/nfs/datasets/imagenet")` read one file per sample while other jobs
    read the same filer.

    Fix: copy the dataset to the node's local disk (/scratch) before training, or read it as a few
    large shards instead of one file per sample.
    """
    run.require_steps()  # no step detected: the rule is "not evaluated", never "passed"
    steps = run.step_view.steady_steps  # every step after start-up: the data wait is measured at each one
    slow = [s for s in steps if s.data_wait_s > max_wait_s]
    if not slow:
        return
    waited = sum(s.data_wait_s for s in slow)
    yield Finding(
        f"{len(slow)} of {len(steps)} steps waited more than {max_wait_s * 1e3:.0f} ms for data",
        impact=waited / sum(s.wall_s for s in steps),
        location=run.sites.loader.location,
        evidence={"longest wait": (round(max(s.data_wait_s for s in slow) * 1e3, 1), "ms"),
                  "time in those waits": (round(waited, 2), "s")},
        fix="copy the dataset to local disk (/scratch) before training, or read it as large shards",
    )
