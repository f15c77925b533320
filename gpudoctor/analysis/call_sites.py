"""`CallSites`: the lines of the script that one profiling window saw it run, built once: its DataLoaders and
optimizers, its copies and synchronizing calls per line, the lines the host spent its time on, and where it calls
its model and backward."""

from __future__ import annotations

from functools import cached_property

from gpudoctor.analysis.events import EventsOf
from gpudoctor.analysis.optimizers import OptimizerInfo, optimizers
from gpudoctor.analysis.sites import copy_sites, sync_sites
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.views import CopySite, LoaderInfo, LoaderView, Location, SyncSite
from gpudoctor.bundle.events import BackwardSiteEvent, ForwardSiteEvent, HostLinesEvent, LoaderEvent, OptimizerEvent
from gpudoctor.bundle.records import generated_code


class CallSites:
    """The call sites of a window: `events` gives its events of a kind, `steps` the steps the hooks watched."""

    def __init__(self, events: EventsOf, steps: StepView) -> None:
        self._events, self._steps = events, steps

    @cached_property
    def loader(self) -> LoaderView:
        return LoaderView([_loader_info(e) for e in self._events(LoaderEvent)])

    @cached_property
    def optimizers(self) -> list[OptimizerInfo]:
        """The optimizers the script stepped, where each was built and how its step updates its tensors."""
        return optimizers(self._events(OptimizerEvent))

    @cached_property
    def copies(self) -> list[CopySite]:
        """Host<->device copies per line of the script, summed over the `site_steps` hooked steps."""
        return copy_sites(self._steps.hooked_step_events)

    @cached_property
    def syncs(self) -> list[SyncSite]:
        """Synchronizing calls per line of the script, summed over the `site_steps` hooked steps."""
        return sync_sites(self._steps.hooked_step_events)

    @cached_property
    def host_lines(self) -> list[tuple[Location, float]]:
        """The user's lines the host spent its time on in the detail steps, each with its share of the samples
        (collect.hostlines), the most sampled first."""
        counts: dict[Location, int] = {}
        total = 0
        for event in self._events(HostLinesEvent):
            total += event.samples
            for line in event.lines:
                if generated_code(line.file):
                    continue  # counted in the samples, not named: no line of the user's
                where = Location(line.file, line.line, line.function)
                counts[where] = counts.get(where, 0) + line.samples
        ranked = sorted(counts.items(), key=lambda item: -item[1])
        return [(where, count / total) for where, count in ranked] if total else []

    @cached_property
    def backward_location(self) -> Location | None:
        """Where the script calls backward() (the first line seen in the window's detail steps)."""
        return next((Location.from_site(e.site) for e in self._events(BackwardSiteEvent)), None)

    @cached_property
    def forward_location(self) -> Location | None:
        """Where the script calls its model (the first top-level module call seen in the window)."""
        return next((Location.from_site(e.site) for e in self._events(ForwardSiteEvent)), None)

    @cached_property
    def forward_module(self) -> str | None:
        """The class of the outermost model the script calls ("OptimizedModule" for a torch.compile'd one)."""
        return next((e.module for e in self._events(ForwardSiteEvent) if e.module), None)


def _loader_info(e: LoaderEvent) -> LoaderInfo:
    return LoaderInfo(
        location=Location.from_site(e.site), num_workers=e.num_workers, pin_memory=e.pin_memory,
        batch_size=e.batch_size, prefetch_factor=e.prefetch_factor, persistent_workers=e.persistent_workers,
        dataset=e.dataset, dataset_len=e.dataset_len, start_method=e.start_method, sampler=e.sampler,
        drop_last=e.drop_last, made_by=e.made_by,
    )
