"""Step sources for loops with no optimizer: backward() calls (a hand-written update) and the outermost model's
calls (an inference loop). Installed with the always-on instrumentation; each costs one Python call a step."""

from __future__ import annotations

import functools
import threading
from typing import Any

from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder


def hook_backward_steps(recorder: Recorder, patches: Patches) -> None:
    """backward() calls mark the steps when nothing stronger (an optimizer, a marker) does."""
    import torch.autograd

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            recorder.on_backward()
            return original(*args, **kwargs)

        return backward

    patches.wrap(torch.autograd, "backward", make)


def find_outermost_model(recorder: Recorder, handles: list[Any]) -> None:
    """Watch every module call until the first outermost one returns, then only that module: its calls mark
    the steps of a loop with neither optimizer, backward() nor DataLoader (an inference loop). A hook on every
    module call costs microseconds each; one on the outermost module, one call a step. `handles` collects the
    hooks, for removal at the end."""
    from torch.nn.modules import module

    local = threading.local()  # per thread: how deep in module calls
    watched: list[Any] = []  # the outermost module, once found

    def pre(mod: Any, args: Any) -> None:
        local.depth = getattr(local, "depth", 0) + 1

    def post(mod: Any, args: Any, output: Any) -> None:
        local.depth = getattr(local, "depth", 1) - 1
        if local.depth == 0 and not watched:
            watched.append(mod)
            for handle in handles:
                handle.remove()
            handles.clear()
            recorder.on_forward()  # the call that just ended was the first of the loop's
            handles.append(mod.register_forward_pre_hook(lambda m, a: recorder.on_forward()))

    try:  # always_call: a forward that raises still leaves its depth
        post_handle = module.register_module_forward_hook(post, always_call=True)
    except TypeError:  # torch before 2.0 has no always_call
        post_handle = module.register_module_forward_hook(post)
    handles.extend([module.register_module_forward_pre_hook(pre), post_handle])
