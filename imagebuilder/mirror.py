"""Where a URL's bytes come from: upstream, a local mirror directory, or a mirror web server.

A mirror keeps the upstream URL paths (``https://host/a/b.yaml`` is ``<mirror>/a/b.yaml``), so one mirror
directory, copied to an air-gapped site and served or used in place, answers for every upstream URL.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from imagebuilder.errors import ExternalError, InputError

MAX_DOCUMENT = 32 * 1024 * 1024


@dataclass(frozen=True)
class Mirror:
    """A local directory or an http(s) base URL that mirrors upstream paths."""

    base: str

    @classmethod
    def parse(cls, value: str, flag: str = "--mirror") -> Mirror:
        if value.startswith(("http://", "https://")):
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
        return str(Path(self.base) / path) if self.is_local else f"{self.base}/{path}"


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
                data = fh.read(MAX_DOCUMENT + 1)
        except FileNotFoundError:
            raise InputError(f"{what} not found", source=path) from None
        except OSError as exc:
            raise InputError(f"cannot read {what}: {exc.strerror}", source=path) from None
    else:
        try:
            with urllib.request.urlopen(location, timeout=timeout) as resp:  # noqa: S310 (http(s) only)
                data = resp.read(MAX_DOCUMENT + 1)
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
    if len(data) > MAX_DOCUMENT:
        raise InputError(f"{what} is larger than {MAX_DOCUMENT // (1024 * 1024)} MiB", source=location)
    return data
