"""``serve``: the local web server of spec 1.8 for OS images and boot assets.

Bare-metal machines fetch the OS image (``osImageURL``) and the boot kernel and ramdisk (``hookImagesURLPath``)
over HTTP while they provision, several at once, and ISO boot reads by byte ranges. So: GET and HEAD, single byte
ranges (206/416), Content-Length, ETag/Last-Modified with conditional requests (304), keep-alive, ``sendfile`` from
the page cache, one thread per client, an access log. Nothing outside the served directory is reachable (``..``,
encoded or not, and symlinks that leave it are refused) and directories are not listed unless asked.
"""

from __future__ import annotations

import contextlib
import email.utils
import mimetypes
import os
import re
import socket
import sys
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit

from imagebuilder.core.errors import InputError
from imagebuilder.core.safepath import safe_join

HOOK_FILES = ("vmlinuz-x86_64", "initramfs-x86_64")
DEFAULT_PORT = 8080
#: machines being provisioned fetch from this host over the network: all interfaces by default (spec 1.8)
ALL_INTERFACES = "0.0.0.0"  # noqa: S104


class FileServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, root: Path, bind: str, port: int, *, listing: bool = False, log: TextIO | None = None):
        self.root = root.resolve()
        self.listing = listing
        self.log = log
        self._log_lock = threading.Lock()
        super().__init__((bind, port), Handler)

    @property
    def base_url(self) -> str:
        """The URL other machines use: this host's address when listening on all interfaces."""
        host, port = str(self.server_address[0]), int(self.server_address[1])
        if host in (ALL_INTERFACES, "::"):
            host = local_address()
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def access(self, line: str) -> None:
        if self.log is not None:
            with self._log_lock:
                self.log.write(printable(line) + "\n")
                self.log.flush()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line, never a traceback: a request must not be able to print one."""
        exc = sys.exc_info()[1]
        self.access(f"{client_address[0]} error: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


_RANGE = re.compile(r"bytes=(?:([0-9]{1,19})-([0-9]{0,19})|-([0-9]{1,19}))")


def parse_range(header: str | None, size: int) -> ByteRange | str | None:
    """None: serve it all; a ByteRange; or "unsatisfiable" (RFC 9110, 14.1.2 and 14.2).

    Digits only (no signs, no ``1_0``); a range whose last position is before its first is invalid and ignored, like
    any header we cannot parse (the whole file is served); several ranges are answered with the whole file."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None:
        return None
    first, last, suffix = match.groups()
    if suffix is not None:  # the last N bytes
        n = int(suffix)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return ByteRange(max(0, size - n), size - 1)
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return ByteRange(start, min(end, size - 1))


def hidden(name: str) -> bool:
    """A name ``serve`` never serves nor lists: a dot file (a temporary file a writer renames into place when
    complete), not ``.`` and ``..``, which the safe join judges."""
    return name.startswith(".") and name not in (".", "..")


def printable(text: str) -> str:
    """``text`` with control characters (terminal escapes among them) and non-ASCII escaped, for a log line."""
    return "".join(ch if 0x20 <= ord(ch) < 0x7F and ch != "\\" else ch.encode("unicode_escape").decode() for ch in text)


class Handler(BaseHTTPRequestHandler):
    server: FileServer
    protocol_version = "HTTP/1.1"
    _length: int | str = "-"
    server_version = "image-builder-serve"

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _resolve(self) -> Path | None:
        """The file a request names, inside the served directory; None: forbidden. Raises OSError: not found, as
        for a hidden name: a writer's temporary file (``.<name>.<pid>-<random>.tmp``, half an image or a repository's
        next metadata) is never served."""
        path = unquote(urlsplit(self.path).path, errors="strict")
        if any(hidden(part) for part in path.split("/")):
            raise FileNotFoundError(path)
        try:
            return safe_join(self.server.root, path.lstrip("/") or ".", what="request path")
        except InputError:
            return None

    def _serve(self, body: bool) -> None:
        try:
            self._serve_file(body)
        except (OSError, RuntimeError, ValueError):
            # over-long names, symbolic link loops, undecodable escapes: nothing we can serve
            if not self.wfile.closed:
                with contextlib.suppress(OSError):
                    self._plain(HTTPStatus.NOT_FOUND, "not found\n", body)

    def _serve_file(self, body: bool) -> None:
        target = self._resolve()
        if target is None:
            self._plain(HTTPStatus.FORBIDDEN, "forbidden\n", body)
            return
        if target.is_dir():
            if self.server.listing:
                self._listing(target, body)
            else:
                self._plain(HTTPStatus.NOT_FOUND, "not found\n", body)
            return
        try:
            fh = target.open("rb")
        except OSError:
            self._plain(HTTPStatus.NOT_FOUND, "not found\n", body)
            return
        with fh:
            st = os.fstat(fh.fileno())
            size = st.st_size
            etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
            modified = email.utils.formatdate(st.st_mtime, usegmt=True)
            if self._not_modified(etag, st.st_mtime):
                self._length = 0
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            wanted = parse_range(self.headers.get("Range"), size)
            if self.headers.get("If-Range") not in (None, etag, modified):
                wanted = None  # the file changed since the client's first part: send it whole
            if wanted == "unsatisfiable":
                self._length = 0
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            part = wanted if isinstance(wanted, ByteRange) else ByteRange(0, size - 1)
            self._length = max(part.length, 0) if body else 0
            self.send_response(HTTPStatus.PARTIAL_CONTENT if isinstance(wanted, ByteRange) else HTTPStatus.OK)
            self.send_header("Content-Type", mimetypes.guess_type(target.name)[0] or "application/octet-stream")
            self.send_header("Content-Length", str(max(part.length, 0)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
            if isinstance(wanted, ByteRange):
                self.send_header("Content-Range", f"bytes {part.start}-{part.end}/{size}")
            self.end_headers()
            if body and size:
                self._send_file(fh.fileno(), part.start, part.length)

    def _not_modified(self, etag: str, mtime: float) -> bool:
        match = self.headers.get("If-None-Match")
        if match is not None:
            return etag in [m.strip() for m in match.split(",")] or match.strip() == "*"
        since = self.headers.get("If-Modified-Since")
        if since:
            try:
                parsed = email.utils.parsedate_to_datetime(since).timestamp()
            except (TypeError, ValueError):
                return False
            return int(mtime) <= parsed
        return False

    def _send_file(self, fd: int, offset: int, count: int) -> None:
        self.wfile.flush()
        sock = self.connection
        try:
            while count > 0:
                sent = os.sendfile(sock.fileno(), fd, offset, min(count, 1 << 30))
                if sent == 0:
                    break
                offset += sent
                count -= sent
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _plain(self, status: HTTPStatus, text: str, body: bool) -> None:
        data = text.encode()
        self._length = len(data) if body else 0
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _listing(self, directory: Path, body: bool) -> None:
        base = urlsplit(self.path).path.rstrip("/") + "/"
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir() if not hidden(p.name))
        items = "".join(f'<li><a href="{quote(base + n)}">{n}</a></li>' for n in names)
        self._plain(HTTPStatus.OK, f"<ul>{items}</ul>\n", body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """One access-log line per request, in the common log format."""
        status = code.value if isinstance(code, HTTPStatus) else code
        length = self._length if size == "-" else size
        self.server.access(
            f'{self.client_address[0]} - - [{self.log_date_time_string()}] "{self.requestline}" {status} {length}'
        )

    def log_message(self, format: str, *args: object) -> None:
        self.server.access(f"{self.client_address[0]} - - [{self.log_date_time_string()}] {format % args}")


def cluster_values(base_url: str, root: Path) -> dict[str, str]:
    """The cluster spec values (spec 2.5) for what ``root`` holds: ``osImageURL`` for a gzip image (one per image,
    named, when it holds several: the amd64 and arm64 images of a build are two, and a machine boots its own
    architecture's) and ``hookImagesURLPath`` for the directory with the boot kernel and ramdisk."""
    values: dict[str, str] = {}
    images = sorted(p for p in root.rglob("*.gz") if p.is_file())
    for image in images:
        key = "osImageURL" if len(images) == 1 else f"osImageURL ({image.relative_to(root).as_posix()})"
        values[key] = f"{base_url}/{quote(image.relative_to(root).as_posix())}"
    for directory in sorted({p.parent for p in root.rglob(HOOK_FILES[0])}):
        if all((directory / f).is_file() for f in HOOK_FILES):
            rel = directory.relative_to(root).as_posix()
            values["hookImagesURLPath"] = f"{base_url}/{quote(rel)}" if rel != "." else base_url
            break
    return values


def repository_values(base_url: str, root: Path) -> list[tuple[str, str]]:
    """What ``serve --repo`` prints for a repository ``image.publish`` made in ``root``: its metadata and targets URLs
    (for ``download.image`` and tuftool) and, for each bare-metal image it lists, the ``osImageURL`` a machine that
    knows nothing of TUF boots from: the hash-prefixed file, whose name changes with every new image. The
    repository is read and verified first (every signature, by its newest root), so a damaged one is not served."""
    from imagebuilder.publish.repository import load
    from imagebuilder.publish.storage import FolderStore

    state = load(FolderStore(root), purpose="serve")
    values = [("metadata URL", f"{base_url}/metadata/"), ("targets URL", f"{base_url}/targets/")]
    for name, info in sorted(state.targets.signed.targets.items()):
        if name.endswith((".gz", ".img")):
            values.append((f"osImageURL ({name})", f"{base_url}/targets/{quote(info.get_prefixed_paths()[0])}"))
    return values


def local_address() -> str:
    """An address of this host that other machines can reach (for printed URLs when binding 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def served_url(path: str, port: int = DEFAULT_PORT) -> str:
    """Where ``path`` (relative to the served directory) will be, once ``serve`` runs on this host."""
    return f"http://{local_address()}:{port}/{quote(path)}"


def nginx_site(root: Path, bind: str, port: int, listing: bool) -> str:
    """The nginx site that serves ``root`` the way ``serve`` does, for production."""
    from imagebuilder.core.render import template_env

    try:
        return (
            template_env()
            .get_template("templates/nginx/site.conf.j2")
            .render(
                root=str(root.resolve()),
                listen=f"{bind}:{port}" if bind != ALL_INTERFACES else str(port),
                listing=listing,
            )
        )
    except ValueError as exc:
        raise InputError(
            str(exc), field="--dir", expected="a directory path without '$' or control characters"
        ) from None
