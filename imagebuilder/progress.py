"""The one progress protocol: how long work tells whoever runs it what it is doing.

Two shapes, plain callables so a library function needs no UI object and a test can pass a list's ``append``:

- :data:`Say`: one line about the step now under way ("base image: building ..."); a line that starts with
  ``warning:`` is one the user must still see when the work is done.
- :data:`Transfers`: called once per transfer (a download, an upload, a compression) with its label and total
  bytes (0: unknown); returns the :data:`Advance` the transfer calls with each chunk's byte count.

The library never prints or draws; the CLI prints what is said and renders transfers as rich progress bars
(:func:`imagebuilder.cli._common.transfer_bars`), on a terminal only.
"""

from __future__ import annotations

from collections.abc import Callable

#: one line about the step under way
Say = Callable[[str], None]
#: advances one transfer by a byte count
Advance = Callable[[int], None]
#: starts a transfer (label, total bytes or 0) and returns what advances it
Transfers = Callable[[str, int], Advance]


def silent(text: str) -> None:
    """A :data:`Say` for callers that want no report."""


def start(transfers: Transfers | None, label: str, total: int = 0) -> Advance | None:
    """The Advance of a new transfer, or None when nobody watches (the transfer then skips the calls)."""
    return transfers(label, total) if transfers else None
