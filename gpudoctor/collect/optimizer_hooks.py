"""The script's optimizers: where each was built, and how its step updates the tensors (one fused kernel, a foreach
kernel per operation, or a Python loop over the tensors). Written once per optimizer, at its first step().

What gpudoctor learns of an optimizer is held beside it, in weak-keyed tables, never on it.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from types import FrameType
from typing import Any

from gpudoctor.bundle.events import OptimizerEvent
from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import location, user_frame_from
from gpudoctor.collect.compile_safe import quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder


class OptimizerWatch:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.sites: weakref.WeakKeyDictionary[Any, Site | None] = weakref.WeakKeyDictionary()
        self._told: weakref.WeakSet[Any] = weakref.WeakSet()

    def install(self, patches: Patches) -> None:
        """Remember where each optimizer is built: torch.optim's Optimizer.__init__, which every optimizer's own
        __init__ calls."""
        from torch.optim import optimizer

        sites = self.sites

        def remember(opt: Any, caller: FrameType) -> None:
            if opt not in sites:
                sites[opt] = location(user_frame_from(caller))

        def make_init(original: Any) -> Any:
            def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
                original(opt, *args, **kwargs)
                quietly(remember, opt, sys._getframe(1))

            return __init__

        patches.wrap(optimizer.Optimizer, "__init__", make_init)

    def stepped(self, opt: Any) -> None:
        """An optimizer's step() returned: the first time, say what it is."""
        try:
            if opt in self._told:
                return
            self._told.add(opt)
        except TypeError:  # an optimizer that takes no weak reference is told of once per process at most
            return
        site = self.sites.get(opt) if _weakly(opt) else None
        self.recorder.emit(optimizer_event(opt, site))


def optimizer_event(opt: Any, site: Site | None) -> OptimizerEvent:
    cls = type(opt)
    groups = list(getattr(opt, "param_groups", []))
    params = [p for group in groups for p in group.get("params", [])]
    group = groups[0] if groups else {}
    foreach, fused = group.get("foreach"), group.get("fused")
    takes = _parameters(cls)
    takes_foreach, takes_fused = "foreach" in takes, "fused" in takes
    return OptimizerEvent(
        name=cls.__qualname__, module=cls.__module__, site=site, tensors=len(params),
        foreach=foreach if isinstance(foreach, bool) else None, fused=fused if isinstance(fused, bool) else None,
        takes_foreach=takes_foreach, takes_fused=takes_fused,
        devices=sorted({str(getattr(getattr(p, "device", None), "type", "?")) for p in params}),
        per_tensor=_per_tensor(params, foreach, fused, takes_foreach, takes_fused),
    )


def _per_tensor(params: list[Any], foreach: Any, fused: Any, takes_foreach: bool, takes_fused: bool) -> bool:
    """Whether the step updates the tensors one by one in Python: neither fused nor foreach, as set or as torch
    chooses by default (foreach where every parameter is a CUDA tensor); an optimizer that takes neither option
    steps its own way, which gpudoctor cannot see: not counted as a loop."""
    if not (takes_foreach or takes_fused):
        return False
    if fused is True or foreach is True:
        return False
    if foreach is False or not takes_foreach:
        return True
    return not _foreach_by_default(params)


def _foreach_by_default(params: list[Any]) -> bool:
    """What torch.optim picks when foreach is left None: its own rule where it has one (torch 2.0+)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        return bool(_default_to_fused_or_foreach(params, False, use_fused=False)[1])
    except Exception:  # noqa: BLE001 - an older or newer torch: foreach by default on CUDA tensors
        return bool(params) and all(getattr(p, "is_cuda", False) for p in params)


def _parameters(cls: type) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return frozenset()


def _weakly(obj: Any) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True
