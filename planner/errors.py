"""The one exception type for bad or infeasible user input.

The command line turns a `PartitaError` into one line `error: ...` on stderr and exit code 1;
anything else that escapes is a bug and keeps its traceback.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class PartitaError(Exception):
    """Bad or infeasible input. The message is shown to the user as is, after `error: `."""


def closest(name: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    """The valid names closest to a misspelt `name` (case-insensitive), best first."""
    choices = list(choices)
    lower = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=cutoff)
    return [lower[h] for h in hits]


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> PartitaError:
    """`unknown <kind> 'x'; did you mean 'y'? (valid: ...)` as a PartitaError."""
    choices = sorted(choices)
    near = closest(name, choices)
    hint = f"; did you mean {', '.join(repr(c) for c in near)}?" if near else ""
    listing = ", ".join(choices) if len(choices) <= 40 else ", ".join(choices[:40]) + ", ..."
    return PartitaError(f"unknown {kind} {name!r}{hint} (valid: {listing})")
