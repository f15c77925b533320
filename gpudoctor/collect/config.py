"""What the launcher tells the script's process: where to write and which steps to profile."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class WindowConfig:
    """The profiling window, in steps: skip `wait`, warm up for `warmup`, time `active`, then attribute `detail`.

    The warm-up and active steps run under torch.profiler recording GPU activity only, with gpudoctor's
    per-call hooks off, so that they run as fast as the steps outside the window: their times and the GPU's
    activity in them are what the figures come from. The `detail` steps that follow run without the
    profiler but with the hooks (copy and sync call sites, forward/backward phases, the GIL probe): they
    say which lines of the script the time goes to.

    With `every_s`, the window opens again (warm-up and active steps, no wait) at the first step that
    starts `every_s` seconds or more after the previous window opened, for as long as the script runs.
    """

    wait: int = 5
    warmup: int = 2
    active: int = 5
    detail: int = 5
    every_s: float | None = None

    @property
    def length(self) -> int:
        """Steps from the window's opening to its end: warm-up, active and detail."""
        return self.warmup + self.active + self.detail


@dataclass(frozen=True)
class ChildConfig:
    run_dir: str
    window: WindowConfig = WindowConfig()
    max_steps: int | None = None
    # Python call stacks in the trace: off by default, since on Python-heavy steps they multiply the
    # trace's size and export time; gpudoctor's own hooks record the call sites its rules need.
    with_stack: bool = False
    gil_probe_interval_s: float = 0.005
    # A try's fix (gpudoctor.remedy.Remedy, as JSON): `gpudoctor profile --try-fixes` runs the script with it.
    remedy: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildConfig:
        data = json.loads(text)
        data["window"] = WindowConfig(**data["window"])
        return cls(**data)
