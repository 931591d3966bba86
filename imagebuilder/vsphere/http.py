"""A small keep-alive HTTPS client for vCenter's REST and SSO endpoints, on the standard library.

Why not ``requests``: a template import makes a few hundred small calls, and requests' per-call work (environment,
proxies, netrc, adapters) cost more than vcsim's answer; its import alone is a noticeable part of a command's
start. This client keeps one TLS connection per host, reads the environment once (the proxy for the host,
``HTTPS_PROXY``/``NO_PROXY`` as spec 8 asks, and a CA bundle from ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``/
``SSL_CERT_FILE``), and streams request bodies with a known length.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from imagebuilder.core import untrusted
from imagebuilder.core.errors import ExternalError
from imagebuilder.vsphere.connection import PIN_HINT, Target, sha1_thumbprint, ssl_context


@dataclass
class Response:
    status: int
    reason: str
    headers: http.client.HTTPMessage
    data: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The reply's JSON, bounded in size and depth before it is parsed (vCenter's reply is another machine's);
        a reply that is not JSON is :class:`~imagebuilder.core.errors.InputError` naming the reply."""
        return untrusted.parse_json(self.data, "vCenter's reply") if self.data else None

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


@dataclass
class HttpClient:
    target: Target
    timeout: float = 60.0
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.context = self._context()
        # one connection per host and thread: template imports run in parallel threads (http.client is not shared)
        self._local = threading.local()
        self._all: list[http.client.HTTPSConnection] = []
        self._lock = threading.Lock()

    def _context(self) -> ssl.SSLContext:
        ctx = ssl_context(self.target)
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if ctx.verify_mode != ssl.CERT_NONE and bundle:
            ctx.load_verify_locations(cafile=bundle)
        return ctx

    def _connection(self, host: str, port: int) -> http.client.HTTPSConnection:
        key = (host, port)
        conns: dict[tuple[str, int], http.client.HTTPSConnection] = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(key)
        if conn is None:
            proxy = urllib.request.getproxies().get("https")
            if proxy and not urllib.request.proxy_bypass(host):
                p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
                conn = http.client.HTTPSConnection(
                    p.hostname or "", p.port or 3128, timeout=self.timeout, context=self.context
                )
                conn.set_tunnel(host, port)
            else:
                conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self.context)
            conns[key] = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _check_pin(self, conn: http.client.HTTPSConnection) -> None:
        """A pinned target: the certificate of every connection is compared with the pin before anything is sent."""
        pin = self.target.thumbprint
        if pin and not self.target.insecure:
            der = conn.sock.getpeercert(binary_form=True) if isinstance(conn.sock, ssl.SSLSocket) else None
            actual = sha1_thumbprint(der) if der else "none"
            if actual != pin:
                conn.close()
                raise ExternalError(
                    f"the certificate of {self.target.server} has thumbprint {actual}, not the pinned {pin}",
                    hint=PIN_HINT,
                )

    def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        body: bytes | Iterable[bytes] | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """``url`` is a path on the target or an absolute URL (an upload endpoint may name another host)."""
        parts = urlsplit(url)
        host = parts.hostname or self.target.host
        port = parts.port or (self.target.port if not parts.hostname else 443)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if params:
            path += ("&" if "?" in path else "?") + urlencode(params)
        send = {**self.headers, **(headers or {})}
        if self.cookies:
            send["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if json_body is not None:
            body = json.dumps(json_body).encode()
            send["Content-Type"] = "application/json"
        if isinstance(body, bytes):
            send["Content-Length"] = str(len(body))
        elif body is None and method in ("POST", "PUT"):
            send["Content-Length"] = "0"
        conn = self._connection(host, port)
        conn.timeout = timeout or self.timeout  # this request's (an upload may take long); the socket follows
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        for attempt in (1, 2):
            reused = conn.sock is not None
            try:
                if not reused:
                    conn.connect()
                    self._check_pin(conn)
                conn.request(method, path, body=body, headers=send)
                res = conn.getresponse()
                data = res.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                # a kept-alive connection the server closed meanwhile: once more on a new one, if the body allows
                if attempt == 2 or not reused or not (body is None or isinstance(body, bytes)):
                    raise
        for header in res.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0].strip().strip('"')
        if res.will_close:
            conn.close()
        return Response(res.status, res.reason, res.headers, data)

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
