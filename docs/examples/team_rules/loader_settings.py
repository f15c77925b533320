"""ACME's DataLoader policy: loaders keep their workers between epochs and pin their batches."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Run, rule


@rule("ACME301", "loader-settings", category="data_starvation")
def loader_settings(run: Run, require_pin_memory: bool = True) -> Iterator[Finding]:
    """A DataLoader breaks our loader policy: `persistent_workers=True` (and `pin_memory=True`).

    What it detects: each DataLoader the script iterated that has workers but does not set
    `persistent_workers=True`, or, while `require_pin_memory` is on, does not set `pin_memory=True`.

    Why it matters: without persistent workers each epoch starts its workers again, and each new
    worker opens the dataset again before the first batch of the epoch arrives; a batch in unpinned
    memory cannot be copied to the GPU asynchronously.

    Example: `DataLoader(train_set, batch_size=64, num_workers=8)`.

    Fix: `DataLoader(train_set, batch_size=64, num_workers=8, persistent_workers=True, pin_memory=True)`.
    """
    if not run.sites.loader.loaders:
        raise NotEvaluated("the script iterated no DataLoader")
    for loader in run.sites.loader.loaders:
        missing = []
        if loader.num_workers > 0 and not loader.persistent_workers:
            missing.append("persistent_workers=True")
        if require_pin_memory and not loader.pin_memory:
            missing.append("pin_memory=True")
        if missing:
            yield Finding(
                f"DataLoader over {loader.dataset} does not set {' and '.join(missing)}",
                impact=None, impact_reason="a settings policy: what it costs depends on epochs and dataset",
                location=loader.location,
                evidence={"num_workers": loader.num_workers, "persistent_workers": loader.persistent_workers,
                          "pin_memory": loader.pin_memory},
                fix=f"DataLoader(..., {', '.join(missing)})",
            )
