"""Reading input files with precise errors, and writing output files atomically.

Every writer goes through :func:`atomic_write` so an interrupted run never leaves a partial file at its final path.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import yaml

from imagebuilder.core import untrusted
from imagebuilder.core.errors import ExternalError, InputError

#: the largest input document read (release and bundle manifests are well under 1 MiB)
MAX_DOCUMENT_BYTES = 32 * 1024 * 1024
#: the most nodes a YAML document may expand to once its aliases are followed (an alias bomb expands to billions)
MAX_YAML_NODES = 200_000
#: and at most this deep (no configuration or manifest comes near it)
MAX_YAML_DEPTH = 64


def _bounded(size: int, source: str | Path, what: str = "document") -> None:
    """No input document is larger than :data:`MAX_DOCUMENT_BYTES` (a file, a download, a parsed text)."""
    if size > MAX_DOCUMENT_BYTES:
        raise InputError(f"{what} is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB", source=source)


def read_text(path: str | Path, what: str = "file", *, field: str | None = None) -> str:
    """An input document's text: a regular file of at most :data:`MAX_DOCUMENT_BYTES`, UTF-8 (the untrusted-value
    layer's :func:`~imagebuilder.core.untrusted.read_text`: a FIFO or device is refused, never waited on)."""
    return untrusted.read_text(path, what, limit=MAX_DOCUMENT_BYTES, field=field)


def parse_json(text: str, source: str | Path) -> Any:
    """Parse JSON strictly: bounded in size and depth before it is parsed, duplicate keys, NaN and Infinity are
    errors; errors give line and column (:func:`imagebuilder.core.untrusted.parse_json`)."""
    return untrusted.parse_json(text, source, limit=MAX_DOCUMENT_BYTES)


def load_json_object(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Load a JSON file that must hold one object; errors give line and column."""
    data = parse_json(read_text(path, what), path)
    if not isinstance(data, dict):
        raise InputError(f"top level is {type(data).__name__}", source=path, expected="a JSON object")
    return data


_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BaseLoader):  # type: ignore[misc]
    """The safe loader (libyaml's when present), refusing duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<' merges may override what they bring in: that is their purpose
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key is not a plain value", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (which one is meant is unknown)", key_node.start_mark
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` expands to with its aliases followed, without expanding it (memoised per node)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool, int]] = [(root, False, 0)]
    while stack:
        node, done, depth = stack.pop()
        ident = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if done:
            active.discard(ident)
            sizes[ident] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[ident] > limit:
                return sizes[ident]
            continue
        if ident in sizes:
            continue
        if ident in active:
            raise ValueError("an alias refers to a node that contains it (a recursive structure)")
        if depth > MAX_YAML_DEPTH:
            raise ValueError(f"nested deeper than {MAX_YAML_DEPTH} levels")
        active.add(ident)
        stack.append((node, True, depth))
        stack.extend((c, False, depth + 1) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def parse_yaml_documents(text: str, source: str | Path) -> list[Any]:
    """Parse (possibly multi-document) YAML safely; errors give the line.

    Safe means: no Python objects (the safe loader), at most :data:`MAX_DOCUMENT_BYTES` of text, no duplicate keys,
    and no document that expands past :data:`MAX_YAML_NODES` nodes through aliases (a one-kilobyte alias bomb
    would otherwise take all the memory of the machine once something walks it)."""
    _bounded(len(text), source)
    loader = _StrictLoader(text)
    docs: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            try:
                size = _expanded_nodes(node, MAX_YAML_NODES)
            except ValueError as exc:
                raise InputError(f"invalid YAML: {exc}", source=source) from None
            if size > MAX_YAML_NODES:
                raise InputError(
                    f"the YAML expands to more than {MAX_YAML_NODES} values through its aliases",
                    source=source,
                    expected="a document without an alias bomb",
                )
            doc = loader.construct_document(node)
            if doc is not None:
                docs.append(doc)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"invalid YAML{where}: {problem}", source=source) from None
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply", source=source) from None
    finally:
        loader.dispose()
    return docs


def load_yaml_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    docs = parse_yaml_documents(read_text(path, what), path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise InputError("expected one YAML mapping", source=path)
    return docs[0]


#: how every temporary file or folder beside an output is named: ``.<final name>.<pid>-<random><suffix>``, the
#: writer's pid in it so that the next run can tell a killed writer's from a live one's (:func:`partial_owner`)
PARTIAL_SUFFIXES = (".tmp", ".part")
_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)-[A-Za-z0-9_]+(?P<suffix>\.tmp|\.part)$")


def partial_prefix(final: Path) -> str:
    """The ``prefix`` for :func:`tempfile.mkstemp`/``mkdtemp`` of a temporary beside ``final`` (see
    :data:`PARTIAL_SUFFIXES`)."""
    return f".{final.name}.{os.getpid()}-"


def partial_owner(name: str) -> int | None:
    """The pid of the writer of a temporary file named by :func:`partial_prefix`, None for any other name."""
    match = _PARTIAL.match(name)
    return int(match["pid"]) if match else None


@contextmanager
def atomic_write(
    path: str | Path, mode: str = "w", perm: int = 0o644, *, sync: bool = True, uncache: bool = False
) -> Iterator[IO[Any]]:
    """Write to a temp file beside ``path`` and rename it into place only if the block succeeds. The file reaches
    the device before the rename (``sync``) unless its reader checks it anyway and it is cheaper to remake than to
    sync (a cache's entries, by the thousand). ``uncache`` (with ``sync``) then drops its pages from the page cache:
    an artifact of gigabytes that this run does not read again would otherwise push out what the next build needs
    or leave its memory to be reclaimed page by page."""
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        # the pid in the name: a run killed before the rename left this file, and the next run tells (disk/deadruns.py)
        fd, tmp = tempfile.mkstemp(prefix=partial_prefix(final), suffix=".tmp", dir=final.parent)
    except OSError as exc:  # a destination no file can be made in (/proc, a read-only mount, a file's name)
        if is_full(exc):
            raise full_error(final.parent, final.name) from None
        raise InputError(f"cannot write {final.name} there: {exc.strerror or exc}", source=final.parent,
                         expected="a folder this user can create files in") from None  # fmt: skip
    try:
        os.fchmod(fd, perm)
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
                if uncache:
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp, final)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        if is_full(exc):
            raise full_error(final.parent, final.name) from None
        raise


@contextmanager
def held(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the file ``lock`` (made if missing) for the block: one process at a time fills a cache
    entry that several may ask for at once (two builds on one host, a test beside the setup that warms the cache),
    and the others wait for it, then find it there. The kernel drops the lock with a killed holder."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem (or the user's quota on it) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def full_error(folder: Path, what: str, *, need: int | None = None) -> ExternalError:
    """The failure of a write that found ``folder``'s filesystem full: which folder, what was being written, the
    room it needed when known, and what is free there now (the partial file is gone by then)."""
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "its free space unknown"
    needed = f", which needs {need / 2**20:.1f} MiB" if need else ""
    return ExternalError(
        f"no space left under {folder} for {what}{needed} ({free}); nothing partial was kept",
        hint=f"free space under {folder}, or write to a larger filesystem, then rerun",
    )


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    """Hex SHA-256 of a file, read in chunks (images are gigabytes)."""
    digest = hashlib.sha256()
    with untrusted.open_regular(path) as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def run_checked(*args: str, timeout: int = 3600, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    """Run a command; its stdout, or :class:`ExternalError` with the end of what it said."""
    proc = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
        cwd=cwd,
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise ExternalError(f"'{' '.join(args[:4])}' failed (exit {proc.returncode}): {tail}")
    return proc.stdout
