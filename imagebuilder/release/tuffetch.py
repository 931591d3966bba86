"""python-tuf's network interface over :mod:`imagebuilder.core.fetch`'s HTTP stack (proxies, timeouts, one connection
pool): TUF metadata travels the way every other download does; a repository in a folder is read from ``file://``
URLs. Kept apart from the fetcher so that only the TUF downloads import python-tuf (and the cloud signers it pulls
in); every other command starts without them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import unquote

from tuf.api import exceptions as tuf_exceptions
from tuf.ngclient.fetcher import FetcherInterface

from imagebuilder.core.fetch import get_response, release_response
from imagebuilder.core.stream import CHUNK

if TYPE_CHECKING:
    import urllib3


class TufFetcher(FetcherInterface):
    """python-tuf's network interface over this module's HTTP stack (proxies, timeouts, one connection pool)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    def _fetch(self, url: str) -> Iterator[bytes]:
        if url.startswith("file://"):  # a repository in a folder (image.publish --repo DIR)
            return self._file(Path(unquote(url.removeprefix("file://"))))
        res = get_response(url, timeout=self.timeout)
        if res.status != 200:
            release_response(res)
            raise tuf_exceptions.DownloadHTTPError(f"HTTP {res.status} for {url}", res.status)
        return self._chunks(res)

    @staticmethod
    def _file(path: Path) -> Iterator[bytes]:
        try:
            fh = path.open("rb")
        except FileNotFoundError:  # as a server's 404: python-tuf's walk to the newest root stops there
            raise tuf_exceptions.DownloadHTTPError(f"{path} does not exist", 404) from None
        except OSError as exc:
            raise tuf_exceptions.DownloadError(f"cannot read {path}: {exc.strerror}") from None
        return TufFetcher._read(fh)

    @staticmethod
    def _read(fh: BinaryIO) -> Iterator[bytes]:
        with fh:
            while block := fh.read(CHUNK):
                yield block

    @staticmethod
    def _chunks(res: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
        try:
            yield from res.stream(CHUNK)
        finally:
            release_response(res)
