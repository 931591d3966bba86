"""Reading input files with precise errors, and writing output files atomically.

Every writer goes through :func:`atomic_write` so an interrupted run never leaves a partial file at its final path.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import yaml

from imagebuilder.errors import ExternalError, InputError


def read_text(path: str | Path, what: str = "file") -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} not found", source=p) from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory", source=p, expected="a file") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text", source=p) from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", source=p) from None


def load_json_object(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Load a JSON file that must hold one object; errors give line and column."""
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=path) from None
    if not isinstance(data, dict):
        raise InputError(f"top level is {type(data).__name__}", source=path, expected="a JSON object")
    return data


def parse_yaml_documents(text: str, source: str | Path) -> list[Any]:
    """Parse (possibly multi-document) YAML; errors give the line."""
    try:
        # libyaml's loader when present: the same safe loader, several times faster on the config files
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"invalid YAML{where}: {problem}", source=source) from None


def load_yaml_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    docs = parse_yaml_documents(read_text(path, what), path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise InputError("expected one YAML mapping", source=path)
    return docs[0]


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", perm: int = 0o644) -> Iterator[IO[Any]]:
    """Write to a temp file beside ``path`` and rename it into place only if the block succeeds."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        os.fchmod(fd, perm)
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    """Hex SHA-256 of a file, read in chunks (images are gigabytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def run_checked(*args: str, timeout: int = 3600, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or :class:`ExternalError` with the end of what it said."""
    proc = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise ExternalError(f"'{' '.join(args[:4])}' failed (exit {proc.returncode}): {tail}")
    return proc.stdout
