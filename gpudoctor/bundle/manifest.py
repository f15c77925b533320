"""manifest.json: what ran, where, how it ended, and which collectors worked (or why not).

The launcher writes it twice: when the script starts (`status: running`) and once it has ended, with the
exit, the facts the script's process reported and the list of files. `read_manifest` checks the schema
version first, so that a bundle from another version says so instead of failing on a field.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from gpudoctor.bundle.confined import bundle_file
from gpudoctor.bundle.events import ProcessFacts, TorchFacts, WindowFacts
from gpudoctor.bundle.jsonio import decode_error
from gpudoctor.bundle.layout import MANIFEST, SCHEMA_VERSION
from gpudoctor.bundle.records import Count, Record, Seconds, Site
from gpudoctor.errors import BundleError


class Target(Record, frozen=True):
    script: str | None = None
    module: str | None = None
    args: list[str] = msgspec.field(default_factory=list)


class HostInfo(Record, frozen=True):
    hostname: str | None = None
    platform: str | None = None
    cpu_count: int | None = None
    affinity: list[int] | None = None  # the cores gpudoctor's own process may run on
    memory_total: int | None = None


class LaunchInfo(Record, frozen=True):
    """A rank of a job, as its launcher said (gpudoctor.launch.ranks): its global rank, the node it ran on and the
    job all its ranks share."""

    launcher: str  # torchrun | slurm | mpirun | env
    rank: int
    world_size: int
    local_rank: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    job: str | None = None


class GpuInfo(Record, frozen=True):
    """One GPU as NVML describes it."""

    index: int = 0
    name: str | None = None
    uuid: str | None = None
    memory_total: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


class WindowSettings(Record, frozen=True):
    """The profiling window asked for, in steps (see gpudoctor.collect.config.WindowConfig)."""

    wait: Count = 5
    warmup: Count = 2
    active: Count = 5
    detail: Count = 0  # steps with gpudoctor's hooks after the active ones (bundles before them had none)
    every_s: Seconds | None = None


class CollectorStatus(Record, omit_defaults=True, frozen=True):
    """A collector that worked (with what it measured) or did not (with why); only what is known is written."""

    ok: bool
    reason: str | None = None
    interval_s: Seconds | None = None
    samples: Count | None = None
    sampler_cpu_s: Seconds | None = None


class ExceptionInfo(Record, frozen=True):
    exception: str | None = None
    message: str | None = None
    where: Site | None = None


class ExitInfo(Record, frozen=True):
    """How the script ended: completed, exit, exception, signal, timeout, interrupted, max_steps or no_start."""

    ending: str = "unknown"
    status: int | None = None
    returncode: int | None = None
    signal: str | None = None
    steps: Count | None = None
    exception: ExceptionInfo | None = None
    ended: float | None = None  # when its process said it ended (time.time()); None when it could not say


class ChildFacts(Record, frozen=True):
    """What the script's process reported about itself (from its events)."""

    process: ProcessFacts | None = None
    torch: TorchFacts | None = None
    env_window: WindowFacts | None = None


class Manifest(Record, frozen=True):
    schema_version: int
    gpudoctor_version: str | None = None
    created: str | None = None  # ISO 8601
    status: str = "finished"  # running | finished
    target: Target = Target()
    cwd: str | None = None
    python: str | None = None
    host: HostInfo = HostInfo()
    launch: LaunchInfo | None = None  # a rank of a job: which, on which node
    gpus: list[GpuInfo] = msgspec.field(default_factory=list)
    driver: str | None = None
    window: WindowSettings | None = None  # None for a bare trace, which had no gpudoctor window
    max_steps: int | None = None
    with_stack: bool = False
    timeout_s: Seconds | None = None
    collectors: dict[str, CollectorStatus] = msgspec.field(default_factory=dict)
    files: list[str] = msgspec.field(default_factory=list)
    duration_s: Seconds | None = None
    exit: ExitInfo | None = None
    child: ChildFacts = ChildFacts()
    trace_only: bool = False  # made up for a bare trace, which has no manifest

    @classmethod
    def for_trace(cls, path: Path) -> Manifest:
        """The manifest of a bare Chrome trace analysed without its bundle."""
        return cls(schema_version=SCHEMA_VERSION, trace_only=True, target=Target(script=path.name))

    def collector_reason(self, name: str) -> str | None:
        status = self.collectors.get(name)
        return status.reason if status is not None and not status.ok else None


class _Version(msgspec.Struct):
    schema_version: int


_VERSION_DECODER = msgspec.json.Decoder(_Version)
_MANIFEST_DECODER = msgspec.json.Decoder(Manifest)


def read_manifest(run_dir: Path) -> Manifest:
    path = bundle_file(run_dir, MANIFEST)
    if path is None:
        raise BundleError(f"{run_dir} is not a gpudoctor run directory: it has no {MANIFEST}.")
    raw = path.read_bytes()
    _check_version(path, raw)
    try:
        return _MANIFEST_DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise decode_error(path, exc) from None


def _check_version(path: Path, raw: bytes) -> None:
    try:
        version = _VERSION_DECODER.decode(raw).schema_version
    except msgspec.ValidationError as exc:
        if "schema_version" in str(exc) and "missing" not in str(exc):
            raise BundleError(
                f"{path} is not a gpudoctor manifest: its schema_version is not a whole number."
            ) from None
        raise BundleError(f"{path} is not a gpudoctor manifest: it has no schema_version.") from None
    except msgspec.DecodeError as exc:
        raise BundleError(f"{path} is corrupt: it is not valid JSON ({exc}).") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise decode_error(path, exc) from None
    if version != SCHEMA_VERSION:
        raise BundleError(
            f"{path.parent} was written with bundle schema version {version}; this gpudoctor reads version "
            f"{SCHEMA_VERSION}. Re-run `gpudoctor profile` or use a gpudoctor that matches."
        )
