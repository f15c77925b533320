"""Call sites as a test writes them: a (file, line, function) tuple, a dict, or None."""

from __future__ import annotations

from typing import Any, TypeAlias

Site: TypeAlias = tuple[str, int, str] | dict[str, Any] | None
SITE_DEFAULT: Any = object()  # "use the default call site for this kind of event"


def site_dict(site: Site) -> dict[str, Any] | None:
    if site is None:
        return None
    if isinstance(site, dict):
        return {"file": site["file"], "line": int(site.get("line", 0)), "function": site.get("function", "")}
    file, line, function = site
    return {"file": file, "line": int(line), "function": function}

