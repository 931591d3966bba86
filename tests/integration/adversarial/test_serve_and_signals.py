"""``serve`` against hostile requests (raw bytes on a real socket), and Ctrl-C on a running task."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imagebuilder.host.serve import FileServer
from tests.support.common import BIN, ROOT, STARTUP

DATA = bytes(range(256)) * 4  # 1024 bytes


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[FileServer, io.StringIO, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "image.gz").write_bytes(DATA)
    (root / "loop").symlink_to(root / "loop")
    (root / "out").symlink_to(tmp_path)
    (tmp_path / "secret.txt").write_text("outside\n")
    log = io.StringIO()
    srv = FileServer(root, "127.0.0.1", 0, log=log)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv, log, root
    finally:
        srv.shutdown()
        srv.server_close()


def raw(srv: FileServer, request: bytes) -> bytes:
    with socket.create_connection(srv.server_address[:2], timeout=5) as s:  # type: ignore[arg-type]
        s.sendall(request)
        chunks = []
        while True:
            try:
                block = s.recv(65536)
            except TimeoutError:
                break
            if not block:
                break
            chunks.append(block)
        return b"".join(chunks)


def get(path: str, *headers: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


CASES = [
    (get("/" + "a" * 300), 403),  # a name no filesystem can hold
    (get("/" + "/".join(["a" * 255] * 20)), 403),  # longer than a relative name may be
    (get("/loop"), 404),
    (get("/loop/x"), 404),
    (get("/out/secret.txt"), 403),
    (get("/../secret.txt"), 403),
    (get("/%2e%2e/secret.txt"), 403),
    (get("/image.gz%00.txt"), 403),
    (get("/%ff%fe"), 404),
    (get("http://evil.example/image.gz"), 200),
    (get("/image.gz", "Range: bytes=5-1"), 200),
    (get("/image.gz", "Range: bytes=1_0-2_0"), 200),
    (get("/image.gz", "Range: bytes=-0"), 416),
    (get("/image.gz", "Range: bytes=2000-"), 416),
    (get("/image.gz", "Range: bytes=10-20"), 206),
    (get("/image.gz", "Range: bytes=0-99999999999999999999999"), 200),
    (get("/image.gz", "If-Modified-Since: not a date"), 200),
    (get("/image.gz", method="DELETE"), 501),
    (get("/image.gz", method="BREW"), 501),
    (get("/\x1b[2J\x1b]0;pwned\x07"), 403),
    (b"GET /\r\n\r\n", 0),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64), 0),  # TLS to a plain port
    (b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n", 431),
    (b"GET /image.gz HTTP/9.9\r\nHost: x\r\n\r\n", 0),  # answered as HTTP/0.9: an error page, no status line
]


@pytest.mark.slow
@pytest.mark.parametrize(("request_bytes", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_no_request_breaks_serve(
    server: tuple[FileServer, io.StringIO, Path], request_bytes: bytes, expected: int
) -> None:
    srv, log, _ = server
    response = raw(srv, request_bytes)
    if expected:
        assert status(response) == expected, response[:200]
    assert b"outside" not in response
    text = log.getvalue()
    assert "Traceback" not in text
    assert "\x1b" not in text and "\x07" not in text, "control characters are escaped in the access log"
    # the server still answers afterwards
    assert status(raw(srv, get("/image.gz"))) == 200


def test_ranges_answer_exact_bytes(server: tuple[FileServer, io.StringIO, Path]) -> None:
    srv, _, _ = server
    response = raw(srv, get("/image.gz", "Range: bytes=10-20"))
    assert response.endswith(DATA[10:21]) and b"Content-Range: bytes 10-20/1024" in response
    whole = raw(srv, get("/image.gz", "Range: bytes=5-1"))
    assert whole.endswith(DATA) and b"Content-Range" not in whole


def _interrupt(
    args: list[str], ready: str, tmp_path: Path, started: Callable[[], object] | None = None,
    signum: int = signal.SIGINT,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a task and press Ctrl-C (or send ``signum``) once it printed ``ready`` (or once ``started`` returns: the
    task is at work)."""
    proc = subprocess.Popen(
        [str(BIN / "image-builder"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell without job control (CI) starts background commands with SIGINT ignored, and children inherit
        # that: give this one the disposition a terminal user's process has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + STARTUP  # a loaded run's light worker, at nice 10, starts the CLI slowly
    assert proc.stdout is not None
    seen = ""
    if started is not None:
        started()
    while time.monotonic() < deadline and ready not in seen:
        seen += proc.stdout.readline()
    time.sleep(0.5)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(args, proc.returncode, seen + out, err)


def test_ctrl_c_exits_130_with_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A download stuck on a server that never answers: Ctrl-C ends it with 130, one line, no partial file."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    port = listener.getsockname()[1]
    manifest = tmp_path / "bundle.yaml"
    sha = "0" * 64
    entry = f'{{amd: {{uri: "http://127.0.0.1:{port}/vmlinuz", sha256: "{sha}"}}}}'
    manifest.write_text(
        "spec:\n  versionsBundles:\n  - tinkerbell:\n      tinkerbellStack:\n        hook:\n"
        f"          vmlinuz: {entry}\n          initramfs: {entry}\n"
    )
    dest = tmp_path / "hook"
    try:
        listener.settimeout(60)  # Ctrl-C once the download is under way (a loaded CI host starts Python slowly)
        held: list[object] = []  # the accepted connection stays open, silent
        res = _interrupt(["download.hook", "--manifest", str(manifest), "--dest", str(dest)], "", tmp_path,
                         started=lambda: held.append(listener.accept()))  # fmt: skip
    finally:
        listener.close()
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert res.stderr.strip().splitlines() == ["interrupted"], res.stderr
    assert not dest.exists() or not any(dest.iterdir())


def test_sigterm_runs_the_cleanups_too(tmp_path: Path) -> None:
    """serve exits on SIGTERM without a traceback (the handler turns it into SystemExit)."""
    (tmp_path / "f").write_text("x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _interrupt(["serve", "--dir", str(tmp_path), "--bind", "127.0.0.1", "--port", str(port)], "serving",
                     tmp_path, signum=signal.SIGTERM)  # fmt: skip
    out, err = res.stdout, res.stderr
    assert "serving" in out and res.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err
