"""The one progress protocol: how long work tells whoever runs it what it is doing.

Two shapes, plain callables so a library function needs no UI object and a test can pass a list's ``append``:

- :data:`Say`: one line about the step now under way ("base image: building ..."); a line that starts with
  ``warning:`` is one the user must still see when the work is done.
- :data:`Transfers`: called once per transfer (a download, an upload, a compression) with its label and total
  bytes (0: unknown); returns the :data:`Advance` the transfer calls with each chunk's byte count.

Work that runs elsewhere (a vCenter task, an EC2 export, a Prism task, a CloudStack download) is waited for with
:func:`poll`, the one polling loop.

The library never prints or draws; the CLI prints what is said and renders transfers as rich progress bars
(:func:`imagebuilder.cli._common.transfer_bars`), on a terminal only.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from imagebuilder.core.errors import ExternalError

T = TypeVar("T")

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


def poll(
    check: Callable[[], tuple[bool, T]],
    what: str,
    timeout: float = 3600,
    *,
    interval: float | None = None,
    hint: str = "",
) -> T:
    """Call ``check`` until it reports done (it raises itself on a failure it sees), for a task that runs elsewhere.

    ``interval`` None: 2 ms, then twice as long each time up to 1 s, so a quick task (most vCenter tasks) costs one
    or two calls and a long one about one a second; a number: that many seconds between calls (a service's own
    pace). :class:`ExternalError` naming ``what`` when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    delay = 0.002 if interval is None else interval
    while True:
        finished, value = check()
        if finished:
            return value
        if time.monotonic() > deadline:
            raise ExternalError(f"{what} did not finish in {timeout:.0f} s", hint=hint)
        time.sleep(delay)
        if interval is None:
            delay = min(delay * 2, 1.0)


def follow(
    args: list[str],
    *,
    env: dict[str, str],
    log: IO[str],
    redact: Callable[[str], str],
    say: Say,
    pick: Callable[[str], str | None],
    cwd: Path | None = None,
) -> int:
    """Run a long child (Packer, the chroot build), its output written to ``log`` line by line with secrets
    redacted, and each line that ``pick`` turns into text said as progress; returns the child's exit status."""
    log.write(f"$ {' '.join(args)}\n")
    log.flush()
    # stdin is not the child's: Ansible (run by Packer, or by the chroot build) refuses a non-blocking stdin, which
    # the caller's may be (a CI runner's, a test harness's pipe), and nothing here answers a prompt
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)  # fmt: skip
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            clean = redact(line)
            log.write(clean)
            log.flush()
            said = pick(clean.strip())
            if said is not None:
                say(said)
    except BaseException as exc:
        # we stop following (Ctrl-C, or whoever reads our progress went away): the child must not run on unseen,
        # holding what it made (a VM, a mounted image). Ctrl-C at the terminal has reached it already (it is in our
        # process group); otherwise it is asked to stop. Either way it gets the time its own clean-up takes (Packer
        # destroying a VM can take a while) with its output still read into the log, since a child blocked on a
        # full pipe never finishes; a second Ctrl-C stops the waiting.
        if not isinstance(exc, KeyboardInterrupt):
            proc.terminate()
        # read on the side: a grandchild that outlives the child may hold the pipe open, and must not hold us
        reader = threading.Thread(target=_drain, args=(proc.stdout, log, redact), daemon=True)
        reader.start()
        proc.wait()
        reader.join(timeout=2)
        raise
    return proc.wait()


def _drain(stream: IO[str], log: IO[str], redact: Callable[[str], str]) -> None:
    """What a stopped child still says, into its log, until its pipe closes or the log does."""
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            log.write(redact(line))
            log.flush()
