"""Keeping gpudoctor's hooks out of torch.compile's way.

gpudoctor's wrappers and hooks run inside the script's model code, and so inside what torch.compile traces and
compiles. Under a compiled nanoGPT on an H100, the window's per-call hooks ended the script with dynamo's
"Global grad_mode state changed while dynamo tracing". So every hook does nothing while dynamo traces
(`compiling()`), measures only plain tensors (the compiler's fake and functional tensors are subclasses), and never
lets its own bookkeeping raise into the code that called it (`quietly`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any


def compiling_check() -> Callable[[], bool]:
    """torch.compiler.is_compiling (torch 2.3 and later), torch._dynamo.is_compiling before it, else never."""
    import torch

    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if check is None:
        dynamo = getattr(torch, "_dynamo", None)
        check = getattr(dynamo, "is_compiling", None)
    return check if callable(check) else (lambda: False)


def plain_tensor_types() -> tuple[type, ...]:
    """The tensor types whose copies and reads are the script's own: not the compiler's FakeTensor and the like."""
    import torch

    return (torch.Tensor, torch.nn.Parameter)


def hide_global_hook_warning() -> None:
    """torch warns, on every call of a compiled model, that global module hooks fire an extra time for it: those are
    gpudoctor's (they count the model's calls and, in the detail steps, time them), not the script's. Set once, as
    torch is imported and the first of them are installed: the filter stays for the rest of the run."""
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")


def quietly(record: Callable[..., None], *args: Any) -> None:
    """Run gpudoctor's bookkeeping; a failure in it loses that one measurement, never the script's call."""
    with contextlib.suppress(Exception):  # measuring must not change what the script's code does
        record(*args)
