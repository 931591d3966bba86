"""Shared pieces of the task modules: error-to-exit-status translation and output.

Every task body runs inside :func:`cli_task`, so an :class:`~imagebuilder.core.errors.ImageBuilderError` becomes a
one-paragraph message on stderr and exit status 2 (bad input) or 1 (external failure), never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from invoke.exceptions import Exit
from invoke.tasks import Task

from imagebuilder.core.errors import ImageBuilderError, InputErrors
from imagebuilder.core.progress import Advance, Say, Transfers
from imagebuilder.core.runs import RUN_ENV, run_tag
from imagebuilder.core.untrusted import masked, message, printable_lines
from imagebuilder.core.untrusted import printable as untrusted_printable

F = TypeVar("F", bound=Callable[..., Any])


def format_error(exc: ImageBuilderError) -> str:
    """The message for the user, through the untrusted-value layer whatever raised it: every credential it quotes
    masked, control characters replaced, long values and long lists shortened (:func:`~imagebuilder.core.untrusted.
    message`)."""
    if isinstance(exc, InputErrors):
        return message("\n".join(f"error: {e}" for e in exc.errors))
    return message(f"error: {exc}")


#: what is coloured on a terminal (issue 61), by the text that marks it: the status words of preflight and
#: image.verify, warnings and errors, the plan's headings. Applied after the line is made printable, so the only escape
#: sequences on the terminal are these; never when the stream is not a terminal, NO_COLOR is set or TERM is dumb.
_STYLES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\[ok  \]"), "32"), (re.compile(r"^\[WARN\]"), "33"), (re.compile(r"^\[FAIL\]"), "1;31"),
    (re.compile(r"^\[skip\]"), "2"), (re.compile(r"^warning:"), "33"), (re.compile(r"^error:"), "1;31"),
    (re.compile(r"^(Build plan:|  steps:|  node artifacts[^:]*:|disk:|estimate:)"), "1"),
)  # fmt: skip


def colour_wanted(stream: Any) -> bool:
    """Whether ``stream`` gets colour: a terminal, and neither NO_COLOR (https://no-color.org) nor TERM=dumb."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(line: str) -> str:
    """``line`` (printable already) with its mark coloured, when it has one of :data:`_STYLES`."""
    for pattern, code in _STYLES:
        m = pattern.search(line)
        if m:
            return f"{line[: m.start()]}\x1b[{code}m{m.group(0)}\x1b[0m{line[m.end() :]}"
    return line


class _Masked(io.TextIOBase):
    """A task's standard output or error with every credential masked and every control character but the line feed
    and tab replaced, line by line (:func:`~imagebuilder.core.untrusted.masked`, :func:`~imagebuilder.core.
    untrusted.printable_lines`): a dry run's plan, a warning or a report that quotes a URL, a key reference or a
    path the user gave shows no token or PIN and plays no escape sequence on the terminal, whichever code printed it.
    A partial line waits for its end (or a flush), each thread's apart. The CLI's own displays (progress bars, the
    spinner) draw on the stream beneath (:func:`raw`)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.colour = colour_wanted(raw)
        # each thread's partial line apart: print() writes a line's text and its end in two calls, and another
        # thread's text between them would tear both lines (build.matrix's builds print from their own threads)
        self.pending: dict[int, str] = {}
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        me = threading.get_ident()
        with self.lock:
            pending = self.pending.get(me, "") + text
            if "\n" in pending:
                done, _, pending = pending.rpartition("\n")
                shown = printable_lines(masked(done))
                if self.colour:
                    shown = "\n".join(paint(line) for line in shown.split("\n"))
                self.raw.write(shown + "\n")
            if pending:
                self.pending[me] = pending
            else:
                self.pending.pop(me, None)  # a thread that ended a line holds nothing here
        return len(text)

    def flush(self) -> None:
        with self.lock:
            for pending in self.pending.values():
                self.raw.write(printable_lines(masked(pending)))
            self.pending.clear()
            self.raw.flush()

    def isatty(self) -> bool:
        return bool(self.raw.isatty())

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def __getattr__(self, name: str) -> Any:  # encoding, buffer...: the stream's own
        return getattr(self.raw, name)


def raw(stream: Any) -> Any:
    """The stream beneath a task's masked output (what the CLI's own displays draw on), or ``stream`` itself."""
    return stream.raw if isinstance(stream, _Masked) else stream


@contextlib.contextmanager
def _masked_output() -> Iterator[None]:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Masked(out), _Masked(err)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = out, err


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM ends Python without running finally blocks; turned into SystemExit, every cleanup runs
    # (loop devices detached, mounts released, temp files removed, workspaces handled)
    raise SystemExit(128 + signum)


def cli_task(body: F) -> F:
    """Wrap a task body so library errors exit with their status and a clear message."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
            # what this run starts carries its pid and start time: once it is gone, the next run finds them
            os.environ[RUN_ENV] = run_tag()
        try:
            with _masked_output():
                return body(*args, **kwargs)
        except ImageBuilderError as exc:
            raise Exit(format_error(exc), code=exc.exit_code) from None
        except KeyboardInterrupt:
            # every finally block has run on the way here: what the task made is cleaned up
            raise Exit("interrupted", code=130) from None
        except (Exit, SystemExit, BrokenPipeError):
            raise  # a closed output pipe is handled by the program's main (exit 141, no message)
        except Exception as exc:
            # a bug, not the user's input: no traceback (it could carry a secret), one line that says where
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else "?"
            raise Exit(
                f"error: internal error ({type(exc).__name__} at {where}) in {body.__name__}; this is a bug in "
                "image-builder: please report it with the command you ran",
                code=1,
            ) from None

    wrapper.masked_output = True  # type: ignore[attr-defined]  # what tests/unit/test_untrusted_layer.py checks
    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


@contextlib.contextmanager
def transfer_bars() -> Iterator[Transfers | None]:
    """The CLI's rendering of the progress protocol: one rich display, a bar per transfer (several at once when
    transfers run in parallel), gone when done. None when standard error is not a terminal: logs stay clean."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, transient=True, console=Console(file=raw(sys.stderr))) as bars:

        def start(label: str, total: int) -> Advance:
            task_id = bars.add_task(label[:40], total=total or None)
            return lambda n: bars.advance(task_id, n)

        yield start


@contextlib.contextmanager
def status_line(title: str) -> Iterator[Say]:
    """The CLI's rendering of :data:`~imagebuilder.core.progress.Say`: on a terminal one progress line, the current
    step with its running time, and each finished step left above it with the time it took (a ``warning:`` stays
    visible too); elsewhere each report is a plain line on standard error."""
    if not sys.stderr.isatty():
        yield lambda text: print(text, file=sys.stderr, flush=True)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=raw(sys.stderr), no_color=not colour_wanted(raw(sys.stderr)))
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as line:
        current: list[tuple[Any, str, float]] = []

        def finish() -> None:
            if current:
                task_id, text, began = current.pop()
                line.remove_task(task_id)
                line.console.print(f"{text} [dim]({StepClock.span(time.monotonic() - began)})[/]")

        def say(text: str) -> None:
            if text.startswith("warning:"):
                shown = escape(masked(untrusted_printable(text, 2000)))
                line.console.print(f"[yellow]warning:[/]{shown.removeprefix('warning:')}")
                return
            finish()
            short = escape(masked(untrusted_printable(text, 120)))
            current.append((line.add_task(short, total=None), short, time.monotonic()))

        line.add_task(escape(untrusted_printable(title)), total=None)
        try:
            yield say
        finally:
            finish()


class StepClock:
    """A :data:`~imagebuilder.core.progress.Say` that prints each step with the time it began (since the start) and,
    when the next begins or the work ends, how long it took: on a fresh machine, where the first run builds what later
    runs take from the cache, the user sees where the time went."""

    def __init__(self, out: Callable[[str], None] = print) -> None:
        self.out = out
        self.began = self.last = time.monotonic()
        self.pending: str | None = None

    @staticmethod
    def span(seconds: float) -> str:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes}m{secs:02d}s"

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if text.startswith("warning:") or "\n" in text:  # said during a step (a warning, a report), not a step
            self.out(text)
            return
        self._close(now)
        self.out(f"[{self.span(now - self.began)}] {text}")
        self.pending, self.last = text.split(":", 1)[0], now

    def _close(self, now: float) -> None:
        if self.pending is not None:
            self.out(f"           ({self.pending}: {self.span(now - self.last)})")
            self.pending = None

    def done(self) -> None:
        """Close the last step and print the total."""
        now = time.monotonic()
        self._close(now)
        self.out(f"[{self.span(now - self.began)}] done")


#: the short flags, by the flag they stand for: ``-f`` is the file a task reads (the reference tool's spelling), the
#: only letter a task flag has (Invoke would give every flag one, first come first served: ``-o`` was --force in
#: vsphere.setup-user and --offline in cluster.validate)
SHORT_FLAGS = {"file": "f"}
#: switches that also take the value they once required (``--insecure``, ``--insecure=false``): a switch is a switch,
#: and the old spelling still works (:func:`~imagebuilder.cli.flags.switch` reads the value)
VALUED_SWITCHES = {"insecure"}


class Flags(Task[Any]):
    """Every task's class: its flags get the one short flag of :data:`SHORT_FLAGS` and the old spellings a task
    keeps as aliases (``flag_aliases``: canonical name -> older names, each still accepted), no automatic letters."""

    def __init__(self, *args: Any, flag_aliases: dict[str, tuple[str, ...]] | None = None, **kwargs: Any) -> None:
        kwargs["auto_shortflags"] = False
        super().__init__(*args, **kwargs)
        self.flag_aliases = flag_aliases or {}

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        """Invoke's, which uses up the task's help texts as it makes the arguments (a second call, by ``--help``
        after ``--list`` in one process or by a test, would find none): here they stay."""
        kept = dict(self.help)
        try:
            return list(super().get_arguments(ignore_unknown_help))
        finally:
            self.help = kept

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        if name in VALUED_SWITCHES:
            opts["optional"] = True
        extra = [alias.replace("_", "-") for alias in self.flag_aliases.get(name, ())]
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names:
            extra.append(short)
        opts["names"] = [*opts["names"], *(n for n in extra if n not in taken_names)]
        return opts


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], Flags]:
    """Invoke's ``@task(...)`` with :class:`Flags` as the task class (every task module imports it from here)."""
    from invoke.tasks import task as invoke_task

    kwargs.setdefault("klass", Flags)
    kwargs.pop("auto_shortflags", None)
    return cast("Callable[[Callable[..., Any]], Flags]", invoke_task(**kwargs))
