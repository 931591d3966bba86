"""Where a URL's bytes come from: upstream, a local mirror directory, or a mirror web server.

A mirror keeps the upstream URL paths (``https://host/a/b.yaml`` is ``<mirror>/a/b.yaml``), so one mirror
directory, copied to an air-gapped site and served or used in place, answers for every upstream URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from imagebuilder import grammar
from imagebuilder.errors import ExternalError, InputError
from imagebuilder.files import MAX_DOCUMENT_BYTES, atomic_write, sha256_file
from imagebuilder.safepath import check_relative, safe_join

if TYPE_CHECKING:
    from imagebuilder.release_manifest import ReleaseManifest


@dataclass(frozen=True)
class Mirror:
    """A local directory or an http(s) base URL that mirrors upstream paths."""

    base: str

    @classmethod
    def parse(cls, value: str, flag: str = "--mirror") -> Mirror:
        if "://" in value:
            try:
                grammar.url(value, ("http", "https"))
            except ValueError as exc:
                raise InputError(str(exc), field=flag, expected="a directory or an http(s) URL") from None
            return cls(value.rstrip("/"))
        path = Path(value).expanduser()
        if not path.is_dir():
            raise InputError("mirror directory does not exist", field=flag, source=value, expected="a directory or URL")
        return cls(str(path.resolve()))

    @property
    def is_local(self) -> bool:
        return not self.base.startswith(("http://", "https://"))

    def locate(self, url: str) -> str:
        """The mirror location of an upstream URL (a path for a directory mirror, else a URL)."""
        path = urlsplit(url).path.lstrip("/")
        if self.is_local:
            return str(safe_join(Path(self.base), path, what=f"the path of {url}"))
        return f"{self.base}/{check_relative(path, what=f'the path of {url}')}"


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def fetch_bytes(location: str, *, timeout: float = 10.0, what: str = "document") -> bytes:
    """Read a small document from a URL or a local path.

    A missing local file is bad input (exit 2); an unreachable URL is an external failure (exit 1).
    """
    if not is_url(location):
        path = Path(location.removeprefix("file://"))
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_DOCUMENT_BYTES + 1)
        except FileNotFoundError:
            raise InputError(f"{what} not found", source=path) from None
        except OSError as exc:
            raise InputError(f"cannot read {what}: {exc.strerror}", source=path) from None
    else:
        try:
            with urllib.request.urlopen(location, timeout=timeout) as resp:  # noqa: S310 (http(s) only)
                data = resp.read(MAX_DOCUMENT_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ExternalError(
                f"cannot fetch {what} {location}: HTTP {exc.code} {exc.reason}",
                hint="check the URL, or use a mirror (--mirror DIR|URL)",
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ExternalError(
                f"cannot fetch {what} {location}: {reason}",
                hint="check the network or proxy (HTTPS_PROXY), or use a mirror (--mirror DIR|URL)",
            ) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InputError(f"{what} is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB", source=location)
    return data


# --- creating a mirror -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MirrorItem:
    url: str
    sha256: str
    path: Path
    status: str  # "downloaded" | "verified" (already there)
    size: int


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file, or None when it does not exist."""
    return sha256_file(path) if path.is_file() else None


def fetch_verified(
    location: str,
    target: Path,
    sha256: str,
    *,
    on_bytes: Callable[[int], None] | None = None,
    timeout: float = 60,
    algorithm: str = "sha256",
) -> int:
    """Stream ``location`` (URL or path) into a temp file beside ``target``; rename only when the digest matches.

    ``sha256`` is the expected hex digest of ``algorithm`` (sha256 unless said otherwise)."""
    digest = hashlib.new(algorithm)
    size = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if is_url(location):
                try:
                    src: Any = urllib.request.urlopen(location, timeout=timeout)  # noqa: S310 (http(s) only)
                except urllib.error.HTTPError as exc:
                    raise ExternalError(f"cannot fetch {location}: HTTP {exc.code} {exc.reason}") from None
                except (urllib.error.URLError, OSError) as exc:
                    raise ExternalError(f"cannot fetch {location}: {getattr(exc, 'reason', exc)}") from None
            else:
                try:
                    src = Path(location.removeprefix("file://")).open("rb")  # noqa: SIM115 - closed below
                except OSError as exc:
                    raise ExternalError(f"cannot read {location}: {exc.strerror}") from None
            with src:
                while block := src.read(1024 * 1024):
                    out.write(block)
                    digest.update(block)
                    size += len(block)
                    if on_bytes:
                        on_bytes(len(block))
        if digest.hexdigest() != sha256:
            raise ExternalError(
                f"checksum mismatch for {location}: got {algorithm} {digest.hexdigest()}, expected {sha256}",
                hint="the source is corrupt or tampered with; nothing was kept",
            )
        os.replace(tmp, target)
        return size
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def mirror_items(manifest: ReleaseManifest) -> list[tuple[str, str]]:
    """(url, sha256) of every node artifact file the manifest names (images: their OCI tarballs)."""
    items: list[tuple[str, str]] = []
    for a in manifest.artifacts:
        if a.kind != "image" and a.sha256:
            items.append((a.uri, a.sha256))
        elif a.archive_uri and a.sha256:
            items.append((a.archive_uri, a.sha256))
    return list(dict.fromkeys(items))


def create_mirror(
    manifest_url: str,
    dest: Path,
    *,
    source: Mirror | None = None,
    on_item: Callable[[str, int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> tuple[ReleaseManifest, list[MirrorItem]]:
    """Copy a release manifest and every node artifact it names into ``dest``, keeping the URL paths.

    Each file is checksum-verified; a file already in ``dest`` with the right sha256 is kept (reruns converge).
    """
    from imagebuilder.release_manifest import parse_manifest  # local: release_manifest imports this module

    dest.mkdir(parents=True, exist_ok=True)
    target_mirror = Mirror(str(dest.resolve()))
    location = source.locate(manifest_url) if source else manifest_url
    raw = fetch_bytes(location, what="release manifest")
    manifest = parse_manifest(raw.decode("utf-8"), location)
    results = []
    # every location is resolved (and an escaping one refused) before anything is written
    plan = [(url, sha, Path(target_mirror.locate(url)), source.locate(url) if source else url)
            for url, sha in mirror_items(manifest)]  # fmt: skip
    for url, sha, target, origin in plan:
        if on_item:
            on_item(url, 0)
        if file_sha256(target) == sha:
            results.append(MirrorItem(url, sha, target, "verified", target.stat().st_size))
            continue
        size = fetch_verified(origin, target, sha, on_bytes=on_bytes)
        results.append(MirrorItem(url, sha, target, "downloaded", size))
    manifest_target = Path(target_mirror.locate(manifest_url))
    with atomic_write(manifest_target, "wb") as fh:
        fh.write(raw)
    return manifest, results
