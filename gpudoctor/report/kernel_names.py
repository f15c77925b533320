"""A kernel's name as a reader can take it in: its C++ signature without the return type, the argument lists, the
lambdas and the library's namespaces, cut at a template boundary, never inside an identifier. The full name stays
beside it (the page's tooltip). Formatting only."""

from __future__ import annotations

import re

MAX_LABEL = 80
NAMESPACES = re.compile(r"\(anonymous namespace\)::|\b(?:at::native::|at::cuda::|c10::|std::)")
PARENTHESIZED = re.compile(r"\([^()]*\)")  # an argument list, innermost first
LAMBDAS = re.compile(r"::\{lambda[^{}]*\}|::operator\s*(?:const)?")  # a functor's lambdas, once their lists are gone


def kernel_label(name: str) -> str:
    """'void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)::{lambda()#1}...>(int,
    ...)' reads 'vectorized_elementwise_kernel<4, GeluCUDAKernelImpl, array<char*, 2ul> >'."""
    text = NAMESPACES.sub("", name.removeprefix("void ").strip())
    while True:
        shorter = PARENTHESIZED.sub("", text)
        if shorter == text:
            break
        text = shorter
    text = re.sub(r"\s+", " ", LAMBDAS.sub("", text)).strip()
    return text if len(text) <= MAX_LABEL else _cut(text, MAX_LABEL)


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters, ended at a separator (',', '<', a space, '::') and marked with '…'; a name of one
    long identifier is kept whole."""
    head = text[:limit]
    boundary = max(head.rfind(sep) for sep in (",", "<", " ", "::"))
    if boundary <= 0:
        return text
    return head[:boundary].rstrip(" ,<:") + "…"
