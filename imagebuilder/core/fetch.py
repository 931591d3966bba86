"""The one fetcher: every byte this tool reads from a URL or a path outside the repository comes through here.

Three shapes of read, one HTTP stack (urllib3, with the environment's proxies), one set of errors:

- :func:`read` -- a small document (a manifest, root.json, a sidecar checksum), whole into memory, size-capped;
- :func:`download` -- a large file streamed once: its length and hashes checked as it streams, an optional
  transform applied (lz4 -> gzip for the bare-metal image), a dropped connection resumed with an HTTP ``Range``
  request, and only a verified result renamed into place (python-tuf's ``download_target`` writes, re-reads and
  copies: three passes over gigabytes; this is one);
- :class:`imagebuilder.release.tuffetch.TufFetcher` -- python-tuf's ``FetcherInterface`` over the same stack
  (:func:`get_response`), so TUF metadata travels the way every other download does; apart, so that only OS-1
  downloads import python-tuf (and the signers it pulls in).

A location is an ``http(s)://`` URL, a ``file://`` URL or a path. A mirror (:class:`Mirror`) maps upstream URLs to
a directory or a base URL, keeping their paths. A missing local document is bad input (exit 2); an unreachable
URL is an external failure (exit 1).
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import MAX_DOCUMENT_BYTES, full_error, is_full, partial_prefix
from imagebuilder.core.progress import Advance
from imagebuilder.core.safepath import check_relative, safe_join
from imagebuilder.core.stream import CHUNK, Copy, Transform

if TYPE_CHECKING:
    import urllib3


@dataclass(frozen=True)
class Mirror:
    """A local directory or an http(s) base URL that mirrors upstream paths."""

    base: str

    @classmethod
    def parse(cls, value: str, flag: str = "--mirror") -> Mirror:
        if "://" in value:
            try:
                parts = grammar.url(value, ("http", "https"))
            except ValueError as exc:
                raise InputError(str(exc), field=flag, expected="a directory or an http(s) URL") from None
            if parts.query or parts.fragment:  # upstream paths are appended to it: a query would swallow them
                raise InputError(f"{untrusted.shown(value)!r} has a query or fragment, which the paths appended to it "
                                 "would not keep", field=flag, expected="a directory or a base URL")  # fmt: skip
            return cls(value.rstrip("/"))
        path = Path(value).expanduser()
        info = untrusted.path_stat(path, "mirror directory", flag)
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise InputError("mirror directory does not exist", field=flag, source=value, expected="a directory or URL")
        return cls(str(path.resolve()))

    @property
    def is_local(self) -> bool:
        return not is_url(self.base)

    def locate(self, url: str) -> str:
        """The mirror location of an upstream URL (a path for a directory mirror, else a URL)."""
        path = urlsplit(url).path.lstrip("/")
        if self.is_local:
            return str(safe_join(Path(self.base), path, what=f"the path of {url}"))
        return f"{self.base}/{check_relative(path, what=f'the path of {url}')}"


#: where a failed fetch sends the user (no flag: this fetcher serves tasks with and without --mirror)
_OFFLINE_HINT = "an air-gapped site reads a local mirror (docs/building.md, Real builds, offline)"


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://"))


# --- HTTP ------------------------------------------------------------------------------------------------------


@functools.cache
def _pools() -> tuple[urllib3.PoolManager, dict[str, urllib3.ProxyManager]]:
    import urllib3

    proxies = {
        scheme: urllib3.ProxyManager(url, retries=False)
        for scheme, url in urllib.request.getproxies().items()
        if scheme in ("http", "https")
    }
    return urllib3.PoolManager(retries=False), proxies


def reset_connections() -> None:
    """Forget the connection pools and the proxies they were made with: they are read from the environment once per
    process, so a program that changes its proxy variables while it runs (the in-process test runner, which gives each
    run its own environment) calls this to have the next request read them again."""
    _pools.cache_clear()


def _pool(url: str) -> urllib3.PoolManager:
    """The connection pool for ``url``: through the environment's proxy (HTTPS_PROXY...) unless NO_PROXY says not."""
    direct, proxies = _pools()
    parts = urlsplit(url)
    proxy = proxies.get(parts.scheme)
    if proxy is None or urllib.request.proxy_bypass(parts.hostname or ""):
        return direct
    return proxy


def get_response(url: str, *, timeout: float, offset: int = 0) -> urllib3.BaseHTTPResponse:
    """A streamed GET from the one connection pool (proxies and timeouts as every download has them), from byte
    ``offset`` on; the caller hands the response back with :func:`release_response`. For a reader of its own
    protocol (python-tuf's fetcher); every other download goes through this module's functions."""
    import urllib3

    headers = {"Range": f"bytes={offset}-"} if offset else {}
    return _pool(url).request(
        "GET", url, headers=headers, preload_content=False, timeout=urllib3.Timeout(connect=timeout, read=timeout)
    )


def release_response(res: urllib3.BaseHTTPResponse) -> None:
    """Give the connection back; one whose body was not read to its end is closed first (never reused mid-body)."""
    if res.length_remaining != 0:  # unknown (chunked) or bytes left
        res.close()
    res.release_conn()


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return str(reason)


# --- small documents -------------------------------------------------------------------------------------------


def read(location: str, *, timeout: float = 10.0, what: str = "document") -> bytes:
    """Read a small document (at most ``MAX_DOCUMENT_BYTES``) from a URL or a local path."""
    import urllib3

    if not is_url(location):
        data = untrusted.read_bytes(_local(location), what, limit=MAX_DOCUMENT_BYTES)
    else:
        try:
            res = get_response(location, timeout=timeout)
            try:
                if res.status != 200:
                    raise ExternalError(
                        f"cannot fetch {what} {location}: HTTP {res.status} {res.reason or ''}".rstrip(),
                        hint=f"check the URL; {_OFFLINE_HINT}",
                    )
                data = res.read(MAX_DOCUMENT_BYTES + 1)
            finally:
                release_response(res)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ExternalError(
                f"cannot fetch {what} {location}: {_reason(exc)}",
                hint=f"check the network or proxy (HTTPS_PROXY); {_OFFLINE_HINT}",
            ) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InputError(f"{what} is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB", source=location)
    return data


def read_optional(url: str, *, timeout: float = 30.0) -> bytes | None:
    """A small document that may not exist (a checksum published beside a file): None when it cannot be read."""
    try:
        return read(url, timeout=timeout)
    except (ExternalError, InputError):
        return None


# --- large files -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What a trusted source promised: the length (None: not known) and hashes (algorithm -> hex) of the bytes."""

    length: int | None
    hashes: dict[str, str]


class VerificationError(ExternalError):
    """The bytes are not the promised ones: nothing was put at the destination."""


@dataclass
class _State:
    """What survives a dropped connection: the hashes so far and the byte count (the transform keeps its own)."""

    location: str
    expected: Expected
    transform: Transform
    progress: Advance | None
    hashers: dict[str, hashlib._Hash]
    received: int = 0

    def feed(self, chunk: bytes) -> None:
        limit = self.expected.length
        if limit is not None and self.received + len(chunk) > limit:
            raise VerificationError(
                f"{self.location} is larger than the {limit} bytes its source promised",
                hint="the mirror serves another file under this name",
            )
        for h in self.hashers.values():
            h.update(chunk)
        self.transform.feed(chunk)
        self.received += len(chunk)
        if self.progress:
            self.progress(len(chunk))


def download(
    location: str,
    dest: Path,
    expected: Expected,
    transform: Transform | None = None,
    *,
    progress: Advance | None = None,
    attempts: int = 6,
    backoff: float = 0.5,
    timeout: float = 60.0,
) -> Path:
    """Stream ``location`` into ``dest`` through ``transform`` (default: the bytes as they come); see the module
    docstring. Nothing is left at ``dest`` or beside it unless every promised hash (and length) matched."""
    if not expected.hashes:
        raise VerificationError(f"no checksum is known for {location}: it cannot be verified")
    transform = transform or Copy()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _release_killed_parts(dest)
    # the writer's pid in the name (files.partial_prefix): a killed run's is released by the next, a live one's kept
    fd, name = tempfile.mkstemp(prefix=partial_prefix(dest), suffix=".part", dir=dest.parent)
    part = Path(name)
    state = _State(location, expected, transform, progress, {alg: hashlib.new(alg) for alg in expected.hashes})
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as out:
            transform.start(out)
            if is_url(location):
                _download_url(state, attempts=attempts, backoff=backoff, timeout=timeout)
            else:
                _download_file(state)
            transform.finish()
            for alg, want in expected.hashes.items():
                got = state.hashers[alg].hexdigest()
                if got != want.lower():
                    raise VerificationError(
                        f"{location} failed verification: {alg} is {got}, its source promised {want}",
                        hint="the source is corrupt or tampered with, or a mirror or proxy serves other bytes;"
                        " nothing was kept",
                    )
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, dest)
        return dest
    except OSError as exc:
        if is_full(exc):
            part.unlink(missing_ok=True)  # first: the room it took is free again when the message measures it
            raise full_error(dest.parent, dest.name, need=expected.length) from None
        raise
    finally:
        transform.abort()
        part.unlink(missing_ok=True)


def _release_killed_parts(dest: Path) -> None:
    """Remove what downloads of ``dest`` by runs that were killed meanwhile left (a live run's are kept)."""
    from imagebuilder.core import disk  # the disk helper's imports are for the downloads only

    disk.release([p for p in disk.stale_partials(dest.parent) if Path(p.name).name.startswith(f".{dest.name}.")])


def _download_file(state: _State) -> None:
    with untrusted.open_regular(_local(state.location)) as src:
        while block := src.read(CHUNK):
            state.feed(block)


def _download_url(state: _State, *, attempts: int, backoff: float, timeout: float) -> None:
    import urllib3

    failures = 0
    while True:
        try:
            _fetch_from(state, timeout)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if is_full(exc):
                raise  # our disk, not the network: no retry helps
            failures += 1
            if failures >= attempts:
                raise ExternalError(
                    f"cannot fetch {state.location}: {_reason(exc)} (after {attempts} attempts, at byte"
                    f" {state.received} of {state.expected.length or 'unknown'})",
                    hint="check the network, the proxy (HTTPS_PROXY) or the mirror, then rerun",
                ) from None
            time.sleep(backoff * 2 ** (failures - 1))
            continue
        if state.expected.length is None or state.received >= state.expected.length:
            return  # without a known length, a body that ended cleanly is the whole file
        failures += 1  # the server ended the body early: resume from here
        if failures >= attempts:
            raise VerificationError(
                f"{state.location} is truncated: the server sent {state.received} of the"
                f" {state.expected.length} promised bytes"
            )
        time.sleep(backoff * 2 ** (failures - 1))


def _fetch_from(state: _State, timeout: float) -> None:
    """One HTTP GET from ``state.received`` on; raises on connection errors (the caller resumes from the state)."""
    offset = state.received
    res = get_response(state.location, timeout=timeout, offset=offset)
    try:
        if res.status == 416 and offset:
            return  # nothing more to send: the caller reports a truncated file
        if res.status not in (200, 206):
            raise ExternalError(
                f"cannot fetch {state.location}: HTTP {res.status}", hint="check the URL, or the mirror that serves it"
            )
        skip = offset if res.status == 200 else 0  # the server ignored Range: drop what we already have
        for chunk in res.stream(CHUNK):
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
                if not chunk:
                    continue
            state.feed(chunk)
    finally:
        release_response(res)
