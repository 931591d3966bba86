"""python-tuf's network interface over :mod:`imagebuilder.core.fetch`'s HTTP stack (proxies, timeouts, one connection
pool): TUF metadata travels the way every other download does. Kept apart from the fetcher so that only the OS-1
download imports python-tuf (and the cloud signers it pulls in); every other command starts without them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from tuf.api import exceptions as tuf_exceptions
from tuf.ngclient.fetcher import FetcherInterface

from imagebuilder.core.fetch import _done, _get
from imagebuilder.core.stream import CHUNK

if TYPE_CHECKING:
    import urllib3


class TufFetcher(FetcherInterface):
    """python-tuf's network interface over this module's HTTP stack (proxies, timeouts, one connection pool)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    def _fetch(self, url: str) -> Iterator[bytes]:
        res = _get(url, timeout=self.timeout)
        if res.status != 200:
            _done(res)
            raise tuf_exceptions.DownloadHTTPError(f"HTTP {res.status} for {url}", res.status)
        return self._chunks(res)

    @staticmethod
    def _chunks(res: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
        try:
            yield from res.stream(CHUNK)
        finally:
            _done(res)
