"""The ``image-builder`` program: the tasks of tasks.py as a command of their own (issue 61).

It is built on Invoke, and ``invoke build ...`` in a checkout keeps working, but Invoke's own machinery does not
show through: ``image-builder --help`` lists only image-builder's options (``--help``, ``--list``, ``--version`` and
shell completion), so ``-f`` and every other letter belong to the tasks; usage lines read ``image-builder build
[options]``; each value names what it is (``--disk-gb=GIB``); ``--list`` gives each task one whole sentence. Help
texts are made from the facts the tasks run on (:mod:`imagebuilder.cli._help`).

``invoke --version`` stays Invoke's own: ``invoke`` is Invoke's program, and its version is the one its users ask it
for. Its task help and task list read as image-builder's do (:func:`exit_2_on_bad_flags` installs them).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

from invoke.collection import Collection
from invoke.completion.complete import complete, print_completion_script
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import ParserContext
from invoke.program import Program

from imagebuilder import __version__
from imagebuilder.cli import _help as helptext
from imagebuilder.cli import namespace
from imagebuilder.core.errors import did_you_mean
from imagebuilder.core.untrusted import message

#: what image-builder is, above its options
ABOUT = (
    "Builds Kubernetes node images (Ubuntu, Red Hat; Bottlerocket downloaded) for vSphere, CloudStack, Nutanix, "
    "bare metal and AWS, and prepares each platform for them: offline from a local mirror, checked before any VM "
    "boots."
)


def friendly_parse_error(exc: ParseError, task_names: list[str]) -> str:
    """Invoke's parse error plus a "did you mean" for a mistyped flag or task name."""
    text = str(exc)
    match = re.match(r"No idea what '([^']+)' is!", text)
    if match:
        word = match.group(1)
        candidates = list(exc.context.flags.keys()) if exc.context is not None and word.startswith("-") else []
        candidates += task_names
        hint = did_you_mean(word, candidates)
        if not hint and word.startswith("-") and exc.context is not None and not exc.context.name:
            # before any task name: a task's flag put ahead of its task (image-builder -f user.yaml vsphere.setup-user)
            hint = f" (a task's options come after its name: image-builder TASK {word} ...)"
        text += hint
    return f"error: {text}"


def _parse_tasks_exit_2(self: Program, original: Any) -> None:
    try:
        original(self)
    except ParseError as exc:
        # every name a task answers to: build.build is also plain 'build' (its namespace's default)
        names = [n for k, v in self.collection.task_names.items() for n in (k, *v)] if self.collection else []
        raise Exit(message(friendly_parse_error(exc, names)), code=2) from None
    except ValueError as exc:  # a flag's value Invoke itself could not convert
        raise Exit(message(f"error: a flag has a value of the wrong type: {exc}"), code=2) from None


# --- task help and the task list, shared by both front ends ---------------------------------------------------------


def short_name(collection: Collection, name: str) -> str:
    """The name a user types: ``build`` for ``build.build`` (its namespace's default), else ``name``."""
    space, _, task_name = name.rpartition(".")
    if space and space in collection.collections and collection.collections[space].default == task_name:
        return space
    return name


def flag_spec(arg: Argument) -> str:
    """``--disk-gb=GIB``, ``-f FILE, --file=FILE``, ``--dry-run``: the names of one flag and what its value is."""
    value = "" if arg.kind is bool else helptext.placeholder(arg.name or "")
    specs = []
    canonical = (arg.name or "").replace("_", "-")
    for name in sorted(arg.names, key=lambda n: (len(n) > 1, n.replace("_", "-") != canonical)):
        if len(name) == 1:
            shown = f" [{value}]" if arg.optional else f" {value}"
            specs.append(f"-{name}" + (shown if value else ""))
        else:
            shown = f"[={value}]" if arg.optional else f"={value}"
            specs.append(f"--{name.replace('_', '-')}" + (shown if value else ""))
    return ", ".join(specs)


def _flag_help(arg: Argument) -> str:
    text = helptext.render(arg.help or "")
    if arg.kind is list and "repeat" not in text:
        text += " (repeatable)"  # a list of paths: a path may hold a comma, so these are repeated only
    return text


def _columns(rows: Sequence[tuple[str, str]], width: int) -> Iterator[str]:
    name_width = min(max((len(n) for n, _ in rows), default=0), 34)
    for name, text in rows:
        wrapped = textwrap.wrap(text, max(width - name_width - 4, 30), break_on_hyphens=False) or [""]
        if len(name) > name_width:
            yield f"  {name}"
            yield from (" " * (name_width + 4) + line for line in wrapped)
        else:
            yield f"  {name.ljust(name_width)}  {wrapped[0]}"
            yield from (" " * (name_width + 4) + line for line in wrapped[1:])


def _width() -> int:
    try:
        return max(60, min(os.get_terminal_size(sys.stdout.fileno()).columns, 120))
    except OSError:
        return 100


def task_help(binary: str, collection: Collection, name: str, context: ParserContext) -> str:
    """A task's ``--help``: usage, what it does, its flags with their placeholders, its examples."""
    task = collection[name]
    doc = inspect.getdoc(task) or ""
    body = helptext.render(doc.split(helptext.EXAMPLES_HEADING, 1)[0].strip())
    args = sorted({id(a): a for a in context.flags.values()}.values(), key=lambda a: a.name.lstrip("_"))
    lines = [f"Usage: {binary} {short_name(collection, name)}" + (" [options]" if args else ""), ""]
    lines += [*(textwrap.fill(p, _width(), break_on_hyphens=False) for p in body.split("\n\n")), ""]
    lines += ["Options:", *_columns([(flag_spec(a), _flag_help(a)) for a in args], _width()), ""]
    shown = helptext.examples(doc)
    if shown:
        lines += [helptext.EXAMPLES_HEADING, *(f"  {helptext.render(e)}" for e in shown), ""]
    return "\n".join(lines)


def task_rows(collection: Collection, prefix: str = "") -> list[tuple[str, str]]:
    """(name, one sentence) of every task, top-level first, then each namespace's."""
    rows = []
    for name, task in sorted(collection.tasks.items()):
        full = prefix + name
        shown = prefix.rstrip(".") if prefix and name == collection.default else full
        rows.append((shown, helptext.summary(task.__doc__)))
    for space, sub in sorted(collection.collections.items()):
        rows += task_rows(sub, f"{prefix}{space}.")
    return rows


# --- the image-builder program ---------------------------------------------------------------------------------------


class ImageBuilderProgram(Program):
    """Invoke's Program with image-builder's own options only (no ``--echo``, ``--dry``, ``-f`` config file...)."""

    def core_args(self) -> list[Argument]:
        return [
            Argument(names=("help", "h"), optional=True, help="show this help, or a task's (--help TASK)"),
            Argument(names=("list",), optional=True, help="list the tasks, or a namespace's (--list NAMESPACE)"),
            Argument(names=("version",), kind=bool, default=False, help="print image-builder's version"),
            Argument(
                names=("print-completion-script",),
                kind=str,
                default="",
                help="print the shell completion script: bash, zsh or fish",
            ),
            Argument(names=("complete",), kind=bool, default=False, help="(used by the completion script)"),
        ]

    def task_args(self) -> list[Argument]:
        return []

    def parse_core(self, argv: list[str] | None) -> None:
        self.normalize_argv(argv)
        self.parse_core_args()
        if self.args.version.value:
            self.print_version()
            raise Exit
        if self.args["print-completion-script"].value:
            shell = self.args["print-completion-script"].value
            if shell not in ("bash", "zsh", "fish"):
                raise Exit(f"error: --print-completion-script: {shell[:40]!r} is not bash, zsh or fish", code=2)
            print_completion_script(shell=shell, names=self.binary_names)
            raise Exit

    def parse_cleanup(self) -> None:
        wanted = self.args.help.value
        if wanted is True:
            self.print_help()
            raise Exit
        if wanted:
            if wanted not in self.parser.contexts:
                names = list(self.parser.contexts)
                raise Exit(message(f"error: --help: no task {wanted!r}" + did_you_mean(wanted, names)), code=2)
            self.print_task_help(wanted)
            raise Exit
        listed = self.args.list.value
        if listed:
            self.list_root = listed if isinstance(listed, str) else None
            if self.list_root is not None:
                try:
                    self.scoped_collection = self.collection.subcollection_from_path(self.list_root)
                except KeyError:
                    names = list(self.collection.collections)
                    raise Exit(f"error: --list: no namespace {self.list_root!r}" + did_you_mean(self.list_root, names),
                               code=2) from None  # fmt: skip
            self.list_tasks()
            raise Exit
        if self.args.complete.value:
            complete(names=self.binary_names, core=self.core, initial_context=self.initial_context,
                     collection=self.collection, parser=self._make_parser())  # fmt: skip
        if not self.tasks:
            self.print_help()
            raise Exit

    def update_config(self, merge: bool = True) -> None:
        # no runtime config file, no run() overrides: the tasks take everything from their flags
        if merge:
            self.config.merge()

    def print_help(self) -> None:
        width = _width()
        print(f"Usage: {self.binary} TASK [options]     (a task's options: {self.binary} TASK --help)")
        print(f"       {self.binary} --list | --version")
        print()
        print(textwrap.fill(ABOUT, width))
        print()
        print("Options:")
        print("\n".join(_columns([(flag_spec(a), a.help or "") for a in self.core_args()], width)))
        print()
        self.list_tasks()

    def print_task_help(self, name: str) -> None:
        _print_task_help(self, name)

    def list_tasks(self) -> None:
        _print_tasks(self)


def _print_task_help(program: Program, name: str) -> None:
    print(task_help(program.binary, program.collection, name, program.parser.contexts[name]))


def _print_tasks(program: Program) -> None:
    """The task list (of the namespace ``--list NAMESPACE`` names), one whole sentence per task."""
    root = getattr(program, "list_root", None)
    print("Tasks:")
    print("\n".join(_columns(task_rows(program.scoped_collection, f"{root}." if root else ""), _width())))
    print()


def _use_our_help(program_class: type[Program]) -> None:
    """Invoke's own ``invoke`` shows a task's help and the task list as image-builder does (its core options stay
    Invoke's: it is Invoke's program)."""
    program_class.print_task_help = _print_task_help  # type: ignore[method-assign,assignment]
    program_class.list_flat = _print_tasks  # type: ignore[method-assign,assignment]


def exit_2_on_bad_flags() -> None:
    """Make Invoke's own ``invoke`` program exit 2 (not 1) on bad flags, like ``image-builder`` does, and show task
    help and the task list as ``image-builder`` does.

    tasks.py calls this when Invoke loads it, which happens before task flags are parsed. Bad input must exit 2
    whichever front end the user types.
    """
    if getattr(Program.parse_tasks, "_imagebuilder", False):
        return
    original = Program.parse_tasks

    def parse_tasks(self: Program) -> None:
        _parse_tasks_exit_2(self, original)

    parse_tasks._imagebuilder = True  # type: ignore[attr-defined]
    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]
    _use_our_help(Program)


exit_2_on_bad_flags()
if not helptext.CLI_SECTIONS:
    helptext.CLI_SECTIONS.append(
        ("building.md", helptext.FLAGS_START, helptext.FLAGS_END, lambda: helptext.flag_names_table(namespace))
    )

program = ImageBuilderProgram(namespace=namespace, name="image-builder", binary="image-builder", version=__version__)


def main() -> None:
    try:
        program.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # whoever read our output went away (``| head``): not an error to report, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)


__all__ = ["ImageBuilderProgram", "exit_2_on_bad_flags", "friendly_parse_error", "main", "program"]
