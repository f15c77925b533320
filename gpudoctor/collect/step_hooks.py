"""Step sources for loops with no optimizer: backward() calls (a hand-written update) and the outermost model's
calls (an inference loop). Installed with the always-on instrumentation; each costs one Python call a step."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.compile_safe import compiling_check, hide_global_hook_warning, quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder


def hook_backward_steps(recorder: Recorder, patches: Patches) -> None:
    """backward() calls mark the steps when nothing stronger (an optimizer, a marker) does."""
    import torch.autograd

    compiling = compiling_check()

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not compiling():
                recorder.on_backward()
            return original(*args, **kwargs)

        return backward

    patches.wrap(torch.autograd, "backward", make)


class KeptHooks:
    """The module hooks that found a compiled outermost model, kept after it was found.

    torch.compile guards on how many global module hooks there are: removing these, or adding the detail steps'
    own, would make it compile the model again (a second compile of the first graph, measured with a counting
    backend). So they stay, do nothing, and in the detail steps time the model's calls (`time_with`).
    """

    def __init__(self) -> None:
        self.kept = False
        self.timing: tuple[Callable[..., None], Callable[..., None]] | None = None

    def time_with(self, pre: Callable[..., None], post: Callable[..., None]) -> Any:
        """Call pre(mod, args) and post(mod, args, output) around module calls until the handle is removed."""
        self.timing = (pre, post)
        return _Stop(self)


class _Stop:
    def __init__(self, hooks: KeptHooks) -> None:
        self._hooks = hooks

    def remove(self) -> None:
        self._hooks.timing = None


def find_outermost_model(recorder: Recorder, handles: list[Any], kept: KeptHooks,
                         on_found: Callable[[Any], None] | None = None) -> None:
    """Watch every module call until the first outermost one returns, then only that module: its calls mark
    the steps of a loop with neither optimizer, backward() nor DataLoader (an inference loop). A hook on every
    module call costs microseconds each; one on the outermost module, one call a step. `handles` collects the
    hooks, for removal at the end. A compiled model keeps the hooks (`kept`): see KeptHooks. `on_found` is told of
    the model once it is found (a try's remedy compiles it, or runs it under autocast)."""
    from torch.nn.modules import module

    local = threading.local()  # per thread: how deep in module calls
    found: list[bool] = []
    compiling = compiling_check()  # inside a compiled model the hooks do nothing, and are traced as nothing
    hide_global_hook_warning()

    def pre(mod: Any, args: Any) -> None:
        if compiling():
            return
        if kept.kept:
            if kept.timing is not None:
                kept.timing[0](mod, args)
            return
        local.depth = getattr(local, "depth", 0) + 1

    def post(mod: Any, args: Any, output: Any) -> None:
        if compiling():
            return
        if kept.kept:
            if kept.timing is not None:
                kept.timing[1](mod, args, output)
            return
        local.depth = getattr(local, "depth", 1) - 1
        if local.depth == 0 and not found:
            found.append(True)
            recorder.on_forward()  # the call that just ended was the first of the loop's
            if on_found is not None:  # first: a try's torch.compile of the model's calls is wrapped by the watch
                quietly(on_found, mod)
            watch = _watch_calls(mod, recorder.on_forward)
            # Asked after on_found, which may compile the model (a try of torch.compile): a compiled model keeps
            # the hooks, since torch.compile guards on their count (KeptHooks).
            if compiled(mod):
                kept.kept = True
            else:
                for handle in handles:
                    handle.remove()
                handles.clear()
            handles.append(watch)

    try:  # always_call: a forward that raises still leaves its depth
        post_handle = module.register_module_forward_hook(post, always_call=True)
    except TypeError:  # torch before 2.0 has no always_call
        post_handle = module.register_module_forward_hook(post)
    handles.extend([module.register_module_forward_pre_hook(pre), post_handle])


# The models a try's remedy compiled (collect.step_remedies): their calls go through torch.compile as an
# OptimizedModule's do, and they keep the hooks that found them as compiled models do. Told apart by identity: a
# module class may be unhashable (a dataclass with eq=True), and a hook must never raise into the script.
COMPILED_BY_A_TRY: list[weakref.ref[Any]] = []


def compiled(mod: Any) -> bool:
    """A model that torch.compile compiled: torch.compile(model)'s OptimizedModule, model.compile(), or a try's."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return (isinstance(optimized, type) and isinstance(mod, optimized)) or (
        getattr(mod, "_compiled_call_impl", None) is not None) or any(ref() is mod for ref in COMPILED_BY_A_TRY)


class _ClassPatch:
    """A removable handle for a patch on a class, like the handle torch gives for a hook."""

    def __init__(self, patches: Patches) -> None:
        self._patches = patches

    def remove(self) -> None:
        self._patches.restore()


def _watch_calls(target: Any, on_call: Callable[[], None]) -> _ClassPatch:
    """Call on_call before each call of `target` (a module), through its class's __call__.

    Not a hook on the module: a module's own hooks are part of it, so torch.save(model) and pickle would
    have to pickle gpudoctor's closure (and fail), and a model saved during the run would carry it. A class
    is pickled by reference. The module is held weakly, so the script can still free it.
    """
    patches = Patches()
    watched = weakref.ref(target)

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self is watched():
                on_call()
            return original(self, *args, **kwargs)

        return call

    with contextlib.suppress(Exception):  # a class that refuses the patch leaves the loop without forward steps
        patches.wrap(type(target), "__call__", make)
    return _ClassPatch(patches)
