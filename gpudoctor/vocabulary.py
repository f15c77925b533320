"""The names other tools rely on: findings.json's categories and severities (least severe first), the entry-point
group that rule packages register under, and the formats `gpudoctor diff` writes. Kept free of imports: the command
line reads them before it starts a script."""

from __future__ import annotations

CATEGORIES = (
    "data_starvation", "blocking_copy", "sync_point", "gil_contention", "small_batch", "fork_after_cuda",
    "cpu_oversubscription", "cpu_contention", "host_memory_pressure", "straggler", "communication",
    "precision", "optimizer", "compile", "periodic_stall", "gpu_memory", "startup",
)
SEVERITIES = ("info", "warning", "critical")
ENTRY_POINT_GROUP = "gpudoctor.rules"
DIFF_FORMATS = ("text", "json", "html")
