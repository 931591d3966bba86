"""OS-1 over TUF (spec 4.5) against a repository the tests build with tuf.api.metadata, served by our own
``serve`` on 127.0.0.1; and the server itself (spec 1.8)."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import lz4.frame
import pytest

from imagebuilder.host.serve import FileServer, Handler
from tests.support.common import BIN, ROOT, reference, run, stop
from tests.support.tufrepo import TufRepo, sha512
from tests.support.vcsim import free_port

K = "1.24"
METAL = f"bottlerocket-metal-k8s-{K}-x86_64-v1.10.1.img.lz4"
OVA = f"bottlerocket-vmware-k8s-{K}-x86_64-v1.10.1.ova"


def disk_like(size: int) -> bytes:
    """Bytes shaped like a disk image: runs of zeros between incompressible and text-like blocks."""
    out = bytearray()
    block = 0
    while len(out) < size:
        kind = block % 4
        out += os.urandom(65536) if kind == 0 else (b"\0" * 65536 if kind in (1, 3) else (b"kubelet config " * 4370))
        block += 1
    return bytes(out[:size])


class _DroppingHandler(Handler):
    """Drops the connection halfway through the first full GET of a target, as a flaky network would."""

    dropped: ClassVar[set[str]] = set()

    def _send_file(self, fd: int, offset: int, count: int) -> None:
        path = self.path
        if "/targets/" in path and offset == 0 and path not in self.dropped:
            self.dropped.add(path)
            super()._send_file(fd, 0, count // 2)
            self.close_connection = True
            self.connection.shutdown(2)
            return
        super()._send_file(fd, offset, count)


@dataclass
class Repo:
    tuf: TufRepo
    url: str
    image: bytes
    ova: bytes
    server: FileServer
    log: Path
    vmware: TufRepo

    def args(self, variant: str, dest: Path, *extra: str, root_sha512: str | None = None) -> list[str]:
        kind = "metal" if variant == "baremetal" else "vmware"
        root = (self.tuf if variant == "baremetal" else self.vmware).metadata_dir / "1.root.json"
        return [
            "download.bottlerocket", "--variant", variant, "--kubernetes", K, "--dest", str(dest),
            "--root", str(root), "--root-sha512", root_sha512 or sha512(root.read_bytes()),
            "--metadata-url", f"{self.url}/2020-07-07/{kind}-k8s-{K}/x86_64/", "--targets-url", f"{self.url}/targets/",
            *extra,
        ]  # fmt: skip


def _serve(root: Path, log: Path, handler: type[Handler] = Handler) -> FileServer:
    server = FileServer(root, "127.0.0.1", 0, log=log.open("a"))
    server.RequestHandlerClass = handler
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repo]:
    monkeypatch.setenv("IMAGE_BUILDER_WORKSPACE", str(tmp_path / "ws"))
    www = tmp_path / "www"
    metal = TufRepo(www, f"2020-07-07/metal-k8s-{K}/x86_64").create()
    image = disk_like(16 * 1024 * 1024)
    metal.add_target(METAL, lz4.frame.compress(image))
    metal.publish()
    vmware = TufRepo(www, f"2020-07-07/vmware-k8s-{K}/x86_64").create()
    ova = os.urandom(3 * 1024 * 1024)
    vmware.add_target(OVA, ova)
    vmware.publish()
    log = tmp_path / "access.log"
    server = _serve(www, log, _DroppingHandler)
    _DroppingHandler.dropped = set()
    try:
        yield Repo(metal, f"http://127.0.0.1:{server.server_address[1]}", image, ova, server, log, vmware)
    finally:
        server.shutdown()
        server.server_close()


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir()) if dest.exists() else []


def test_both_variants_end_to_end_and_resume(repo: Repo, tmp_path: Path) -> None:
    dest = tmp_path / "os1"
    dest.mkdir()  # the destination may already exist (tuftool refuses that)
    dry = run(*repo.args("baremetal", dest, "--dry-run"), env={"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")})
    assert dry.code == 0 and "verified: " in dry.out and "(not written: --dry-run)" in dry.out
    assert leftovers(dest) == []
    res = run(*repo.args("baremetal", dest), env={"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")})
    assert res.code == 0, res.err
    gz = dest / METAL.replace(".lz4", ".gz")
    assert gzip.decompress(gz.read_bytes()) == repo.image  # lz4 -> gzip in the stream, the same image
    assert (
        f":8080/{gz.name} (once 'image-builder serve --dir {dest}' runs)" in res.out
        and "osImageURL: http://" in res.out
    )
    log = repo.log.read_text()
    assert "/targets/" in log and '" 206 ' in log  # the dropped first GET was resumed with a Range request
    res = run(*repo.args("vsphere", dest), env={"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")})
    assert res.code == 0, res.err
    assert (dest / OVA).read_bytes() == repo.ova  # byte-identical
    assert leftovers(dest) == sorted([gz.name, OVA])  # no temp files


def _env(tmp_path: Path) -> dict[str, str]:
    return {"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")}


def _tamper_json(path: Path, change: dict[str, object]) -> None:
    data = json.loads(path.read_text())
    data["signed"].update(change)  # the signature no longer covers the content
    path.write_text(json.dumps(data))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("target", "failed verification: sha256"),
        ("targets", "not properly signed"),
        ("snapshot", "not properly signed"),
        ("timestamp", "not properly signed"),
        ("expired", "expired"),
        ("root-sha512", "not the pinned"),
        ("oversize", "larger than"),
        ("truncated", "truncated"),
    ],
)
def test_rejected_with_nothing_at_the_final_path(repo: Repo, tmp_path: Path, case: str, expected: str) -> None:
    t = repo.tuf
    pin = None
    target = t.target_file(METAL)
    data = target.read_bytes()
    if case == "target":
        target.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif case in ("targets", "snapshot"):
        version = getattr(t, case).signed.version  # type: ignore[union-attr]
        _tamper_json(t.metadata_dir / f"{version}.{case}.json", {"expires": "2099-01-01T00:00:00Z"})
    elif case == "timestamp":
        _tamper_json(t.metadata_dir / "timestamp.json", {"expires": "2099-01-01T00:00:00Z"})
    elif case == "expired":
        from datetime import UTC, datetime, timedelta

        t.publish(timestamp_expires=(datetime.now(UTC) - timedelta(days=1)).replace(microsecond=0))
    elif case == "root-sha512":
        pin = "0" * 128
    elif case == "oversize":
        target.write_bytes(data + b"more")
    elif case == "truncated":
        target.write_bytes(data[: len(data) // 3])
    dest = tmp_path / "os1"
    res = run(*repo.args("baremetal", dest, root_sha512=pin), env=_env(tmp_path))
    assert res.code == 1, res.out + res.err
    assert expected in res.err, res.err
    assert leftovers(dest) == []


def test_rollback_is_refused(repo: Repo, tmp_path: Path) -> None:
    dest = tmp_path / "os1"
    old = (repo.tuf.metadata_dir / "timestamp.json").read_bytes()
    repo.tuf.publish()
    assert run(*repo.args("baremetal", dest), env=_env(tmp_path)).code == 0  # this host has now seen version 3
    (dest / METAL.replace(".lz4", ".gz")).unlink()
    (repo.tuf.metadata_dir / "timestamp.json").write_bytes(old)  # a mirror serves the older, validly signed one
    res = run(*repo.args("baremetal", dest), env=_env(tmp_path))
    assert res.code == 1 and "rollback refused" in res.err
    assert leftovers(dest) == []


def test_root_rotation_is_followed(repo: Repo, tmp_path: Path) -> None:
    repo.tuf.rotate_root()
    repo.tuf.publish()
    res = run(*repo.args("baremetal", tmp_path / "os1"), env=_env(tmp_path))  # starts from the pinned version 1
    assert res.code == 0, res.err
    assert "/2.root.json" in repo.log.read_text()


def test_the_real_root_json_loads_and_its_signatures_verify() -> None:
    from tuf.api.metadata import Metadata, Root

    data = reference("bottlerocket", "root.json").read_bytes()
    pinned = [
        line.split()[0]
        for line in reference("bottlerocket", "root.json.sha512.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert hashlib.sha512(data).hexdigest() == pinned[0]  # the "MATCHES root.json here" line
    root = Metadata[Root].from_bytes(data)
    assert root.signed.consistent_snapshot and root.signed.version == 2
    # a threshold of valid RSA signatures by its own root keys, over the canonical signed part
    root.signed.verify_delegate(Root.type, root.signed_bytes, root.signatures)
    result = root.signed.get_verification_result(Root.type, root.signed_bytes, root.signatures)
    assert result.verified and len(result.signed) >= 1


# -- the server ----------------------------------------------------------------------------------------------------


def _get(port: int, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, headers=headers)
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, {k.lower(): v for k, v in res.getheaders()}, body


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, bytes, Path]]:
    root = tmp_path / "www"
    (root / "hook").mkdir(parents=True)
    data = disk_like(8 * 1024 * 1024)
    (root / "image.img.gz").write_bytes(data)
    (root / "hook" / "vmlinuz-x86_64").write_bytes(b"kernel")
    (root / "hook" / "initramfs-x86_64").write_bytes(b"ramdisk")
    (tmp_path / "secret").write_text("outside")
    (root / "escape").symlink_to(tmp_path / "secret")
    server = _serve(root, tmp_path / "access.log")
    try:
        yield server.server_address[1], data, tmp_path / "access.log"
    finally:
        server.shutdown()
        server.server_close()


def test_server_ranges_head_conditional_and_traversal(served: tuple[int, bytes, Path]) -> None:
    port, data, log = served
    status, h, body = _get(port, "/image.img.gz", Range="bytes=100-199")
    assert status == 206 and body == data[100:200] and h["content-range"] == f"bytes 100-199/{len(data)}"
    status, h, body = _get(port, "/image.img.gz", Range="bytes=-10")
    assert status == 206 and body == data[-10:]
    status, h, _ = _get(port, "/image.img.gz", Range=f"bytes={len(data)}-")
    assert status == 416 and h["content-range"] == f"bytes */{len(data)}"
    status, h, body = _get(port, "/image.img.gz", "HEAD")
    assert status == 200 and body == b"" and h["content-length"] == str(len(data)) and h["accept-ranges"] == "bytes"
    status, _, _ = _get(port, "/image.img.gz", **{"If-None-Match": h["etag"]})
    assert status == 304
    status, _, _ = _get(port, "/image.img.gz", **{"If-Modified-Since": h["last-modified"]})
    assert status == 304
    for bad in ("/../secret", "/%2e%2e/secret", "/hook/../../secret", "/escape", "/hook/%2e%2e/%2e%2e/secret"):
        status, _, body = _get(port, bad)
        assert status in (403, 404) and b"outside" not in body, bad
    assert _get(port, "/hook/")[0] == 404  # no listing unless asked
    assert _get(port, "/nope")[0] == 404
    assert '"GET /image.img.gz HTTP/1.1" 206 100' in log.read_text()


def test_server_sixteen_concurrent_downloads(served: tuple[int, bytes, Path]) -> None:
    port, data, _ = served
    want = hashlib.sha256(data).hexdigest()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: _get(port, "/image.img.gz"), range(16)))
    assert all(s == 200 and hashlib.sha256(b).hexdigest() == want for s, _, b in results)


def test_serve_task_prints_cluster_values_and_renders_nginx(tmp_path: Path) -> None:
    root = tmp_path / "www"
    (root / "hook").mkdir(parents=True)
    (root / "bottlerocket.img.gz").write_bytes(b"x")
    for name in ("vmlinuz-x86_64", "initramfs-x86_64"):
        (root / "hook" / name).write_bytes(b"y")
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "image-builder"), "serve", "--dir", str(root), "--bind", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        assert f"osImageURL: http://127.0.0.1:{port}/bottlerocket.img.gz\n" in lines
        assert f"hookImagesURLPath: http://127.0.0.1:{port}/hook\n" in lines
        assert _get(port, "/bottlerocket.img.gz")[2] == b"x"
    finally:
        stop(proc)
    conf = tmp_path / "site.conf"
    dry = run("serve", "--dir", str(root), "--port", "8081", "--nginx-config", str(conf), "--dry-run")
    assert dry.code == 0 and "listen 8081;" in dry.out and not conf.exists()
    res = run("serve", "--dir", str(root), "--port", "8081", "--nginx-config", str(conf))
    assert res.code == 0 and f'root "{root.resolve()}";' in conf.read_text() and "listen 8081;" in conf.read_text()


def _hook_manifest(tmp_path: Path, base: str, files: dict[str, bytes], with_sums: bool) -> Path:
    """The real sample manifest with its hook URIs pointing at the test server (and, optionally, checksums in the
    entries, written the way the manifest writes them for its archives)."""
    import yaml

    data = yaml.safe_load(reference("eksa", "bundles-testdata.yaml").read_text())
    hook = data["spec"]["versionsBundles"][-1]["tinkerbell"]["tinkerbellStack"]["hook"]
    for key, name in (("vmlinuz", "vmlinuz-x86_64"), ("initramfs", "initramfs-x86_64")):
        entry = hook[key]["amd"]
        assert entry["name"] == name
        entry["uri"] = f"{base}/artifacts/hook/{name}"
        if with_sums:
            entry["sha256"] = hashlib.sha256(files[name]).hexdigest()
            entry["sha512"] = hashlib.sha512(files[name]).hexdigest()
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_download_hook_verified(tmp_path: Path) -> None:
    www = tmp_path / "www" / "artifacts" / "hook"
    www.mkdir(parents=True)
    files = {"vmlinuz-x86_64": os.urandom(300_000), "initramfs-x86_64": os.urandom(900_000)}
    for name, data in files.items():
        (www / name).write_bytes(data)
    server = _serve(tmp_path / "www", tmp_path / "access.log")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        dest = tmp_path / "assets" / "hook"
        listed = _hook_manifest(tmp_path, base, files, True)
        dry = run("download.hook", "--dest", str(dest), "--manifest", str(listed), "--dry-run")
        assert dry.code == 0 and f"{base}/artifacts/hook/vmlinuz-x86_64 -> {dest}/vmlinuz-x86_64" in dry.out
        assert not dest.exists()
        res = run("download.hook", "--dest", str(dest), "--manifest", str(listed))
        assert res.code == 0, res.err
        assert {p.name: p.read_bytes() for p in dest.iterdir()} == files
        # no checksums in the entries: the published sidecar files vouch for them, or nothing is written
        bare = _hook_manifest(tmp_path, base, files, False)
        res = run("download.hook", "--dest", str(tmp_path / "h2"), "--manifest", str(bare))
        assert res.code == 1 and "nothing vouches for" in res.err and leftovers(tmp_path / "h2") == []
        for name, data in files.items():
            (www / f"{name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
        res = run("download.hook", "--dest", str(tmp_path / "h3"), "--manifest", str(bare))
        assert res.code == 0, res.err
        (www / "initramfs-x86_64").write_bytes(b"tampered" + files["initramfs-x86_64"][8:])
        res = run("download.hook", "--dest", str(tmp_path / "h4"), "--manifest", str(bare))
        assert res.code == 1 and "failed verification" in res.err
        assert not (tmp_path / "h4" / "initramfs-x86_64").exists()
    finally:
        server.shutdown()
        server.server_close()


class _StallingHandler(Handler):
    """Sends half of a target, then holds the connection: the moment a run is killed with a partial download."""

    def _send_file(self, fd: int, offset: int, count: int) -> None:
        if "/targets/" in self.path:
            super()._send_file(fd, offset, count // 2)
            time.sleep(120)
            return
        super()._send_file(fd, offset, count)


def test_a_download_killed_halfway_is_completed_by_the_rerun_and_leaves_no_part(repo: Repo, tmp_path: Path) -> None:
    """download.bottlerocket killed (SIGKILL to its process group) with half the image on the disk, in its
    ``.part`` file named with the run's pid: the rerun releases it, downloads and verifies the image, and nothing
    partial is left beside it (issue 29)."""
    dest = tmp_path / "os1"
    name = METAL.replace(".lz4", ".gz")
    env = {**os.environ, "IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")}
    repo.server.RequestHandlerClass = _StallingHandler
    proc = subprocess.Popen([str(BIN / "image-builder"), *repo.args("baremetal", dest)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (parts := list(dest.glob(f".{name}.{proc.pid}-*.part"))) or parts[0].stat().st_size == 0:
        assert time.monotonic() < deadline and proc.poll() is None, "no partial download seen"
        time.sleep(0.05)
    time.sleep(random.Random(29).uniform(0, 1))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert parts[0].exists(), "the killed run left its partial download (no clean-up of its own ran)"
    repo.server.RequestHandlerClass = Handler
    res = run(*repo.args("baremetal", dest), env={"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")})
    assert res.code == 0, res.err
    assert gzip.decompress((dest / name).read_bytes()) == repo.image
    assert leftovers(dest) == [name], "the killed run's .part is released, nothing else is left"
