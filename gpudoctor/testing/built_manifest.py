"""manifest.json of a built bundle: the `Manifest` the launcher writes once the script has ended."""

from __future__ import annotations

from gpudoctor._version import __version__
from gpudoctor.bundle.layout import SCHEMA_VERSION
from gpudoctor.bundle.manifest import (
    ChildFacts,
    CollectorStatus,
    ExceptionInfo,
    ExitInfo,
    GpuInfo,
    HostInfo,
    Manifest,
    Target,
    WindowSettings,
)
from gpudoctor.testing.built_events import process_facts, torch_facts, window_facts
from gpudoctor.testing.spec import H100, H100_MEMORY, BundleSpec

CREATED = "1970-01-12T13:46:40+00:00"  # DEFAULT_START, as the launcher writes the time
DRIVER = "550.54.15"
NO_HOST = CollectorStatus(ok=False, reason="not sampled in this bundle")
NO_NVML = CollectorStatus(ok=False, reason="NVML could not be initialized: NVML Shared Library Not Found")
SETUP_S = 3.0  # the run's duration beyond its steps: starting Python and torch, writing the trace


def manifest(spec: BundleSpec, files: list[str]) -> Manifest:
    e, gpus = spec.env, _gpus(spec)
    return Manifest(
        schema_version=SCHEMA_VERSION, gpudoctor_version=__version__, created=CREATED, status="finished",
        target=Target(script=spec.settings.script, module=None, args=list(spec.settings.args)), cwd="/work",
        python=e.python,
        host=HostInfo(hostname="builder", platform="Linux-x86_64", cpu_count=spec.cpu_count, affinity=spec.affinity,
                      memory_total=e.memory_total),
        gpus=gpus, driver=e.driver if e.driver is not None else (DRIVER if gpus else None),
        window=_window_settings(spec), collectors=_collectors(spec), files=files, duration_s=_duration_s(spec),
        exit=_exit_info(spec), child=_child_facts(spec),
    )


def _gpus(spec: BundleSpec) -> list[GpuInfo]:
    """The GPUs NVML describes: env(gpus=...), else an H100 for each GPU sampled."""
    if spec.env.gpus is not None:
        return spec.env.gpus
    return [GpuInfo(index=i, name=H100.name, uuid=f"GPU-{i:08d}", memory_total=H100_MEMORY, pcie_gen=5, pcie_width=16)
            for i in sorted(spec.gpus)]


def _window_settings(spec: BundleSpec) -> WindowSettings:
    """The window asked for; without an active count, as many steps as were added."""
    s = spec.settings
    active = s.active if s.active is not None else max(1, len(spec.steps))
    return WindowSettings(wait=s.wait, warmup=s.warmup, active=active)


def _collectors(spec: BundleSpec) -> dict[str, CollectorStatus]:
    host_ok = spec.host is not None or bool(spec.processes) or "host" in spec.raw
    gpu_ok = bool(spec.gpus) or "gpu" in spec.raw
    profiler = CollectorStatus(ok=True) if spec.writes_trace else CollectorStatus(ok=False, reason=spec.profiler_reason)
    return {
        "host": CollectorStatus(ok=True, interval_s=0.1) if host_ok else NO_HOST,
        "nvml": CollectorStatus(ok=True, interval_s=spec.gpu_interval_s) if gpu_ok else NO_NVML,
        "profiler": profiler,
    }


def _duration_s(spec: BundleSpec) -> float:
    steps = spec.steps
    return (steps[-1].end - steps[0].start if steps else 0.0) + SETUP_S


def _exit_info(spec: BundleSpec) -> ExitInfo:
    x = spec.exit
    return ExitInfo(ending=x.ending, status=x.status, returncode=x.status, steps=len(spec.steps),
                    exception=ExceptionInfo(exception=x.exception, message=x.message, where=x.where))


def _child_facts(spec: BundleSpec) -> ChildFacts:
    """What the script's process reported; the window's facts only when a window opened."""
    window = window_facts(spec) if spec.first_window_step is not None else None
    return ChildFacts(process=process_facts(spec), torch=torch_facts(spec), env_window=window)
