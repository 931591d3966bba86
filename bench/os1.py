"""Benchmarks of issue 6 (OS-1 download and the image server), each against its named peer in the same run.

- convert: lz4 -> gzip of a 1 GiB disk-like image: ours (``imagebuilder.core.stream.Lz4ToGzip``, one process) against
  the spec's ``lz4 -dc | gzip`` and against ``lz4 -dc | pigz -p2``; wall time and peak RSS (``/usr/bin/time``).
- download: the whole metal download from a TUF repository on loopback (served by nginx): ours
  (``download.bottlerocket``: metadata, verified stream, lz4 -> gzip) against ``tuftool download`` followed by
  ``lz4 -d`` and ``gzip``, against the unverified ``curl | lz4 -dc | pigz -p2`` (target: at least 1.8x, issue 28)
  and against a plain ``curl`` of the same target bytes.
- serve: 16 concurrent ``curl`` clients fetching the .gz from ``image-builder serve`` and from nginx; aggregate
  throughput.

The image is deterministic: 1 MiB blocks of zeros (about half, as in a disk image's free space), of random bytes
(compressed files and binaries) and of repetitive text (configuration, logs). Run with ``bench/run.py --only os1``.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.tufrepo import TufRepo, sha512  # noqa: E402
from tests.support.vcsim import free_port  # noqa: E402

GIB = 1024**3
MIB = 1024**2
K = "1.24"
METAL = f"bottlerocket-metal-k8s-{K}-x86_64-v1.10.1.img.lz4"
#: ./scripts/setup.sh links it here (cargo install, cached under ~/.cache/image-builder)
TUFTOOL = Path(os.environ.get("TUFTOOL", str(ROOT / ".tools" / "bin" / "tuftool")))
IMAGE_BUILDER = Path(sys.executable).parent / "image-builder"


def make_image(path: Path, size: int = GIB) -> Path:
    if path.exists() and path.stat().st_size == size:
        return path
    rng = random.Random(25)  # noqa: S311 -- deterministic content, not secrets
    text = b"".join(f"kubelet --config /etc/kubernetes/kubelet.conf line {i}\n".encode() for i in range(20000))
    with path.open("wb") as fh:
        for _ in range(size // MIB):
            pick = rng.random()
            if pick < 0.5:
                fh.write(b"\0" * MIB)
            elif pick < 0.8:
                fh.write(rng.randbytes(MIB))
            else:
                start = rng.randrange(0, len(text) - MIB)
                fh.write(text[start : start + MIB])
    return path


def timed(cmd: list[str] | str, **kw: object) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of a command, via GNU time."""
    shell = isinstance(cmd, str)
    full = ["/usr/bin/time", "-f", "%M", *(["sh", "-c", cmd] if shell else cmd)]
    t0 = time.monotonic()
    proc = subprocess.run(full, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: {proc.stderr[-2000:]}")
    return elapsed, int(proc.stderr.strip().splitlines()[-1])


def convert_ours(src: Path, dest: Path) -> None:
    from imagebuilder.core.stream import Lz4ToGzip

    t = Lz4ToGzip()
    with src.open("rb") as fin, dest.open("wb") as fout:
        t.start(fout)
        while chunk := fin.read(MIB):
            t.feed(chunk)
        t.finish()


def gunzip_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with subprocess.Popen(["gzip", "-dc", str(path)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        while chunk := p.stdout.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def bench_convert(work: Path, img: Path, lz4: Path, rounds: int) -> dict[str, object]:
    out = work / "out.gz"
    runs: dict[str, list[tuple[float, int]]] = {"ours": [], "lz4_gzip": [], "lz4_pigz": []}
    cmds = {
        "ours": [sys.executable, __file__, "convert", str(lz4), str(out)],
        "lz4_gzip": f"lz4 -dc {lz4} | gzip > {out}",
        "lz4_pigz": f"lz4 -dc {lz4} | pigz -p2 > {out}",
    }
    want = file_sha256(img)
    for _ in range(rounds):
        for side, cmd in cmds.items():
            runs[side].append(timed(cmd))
            assert gunzip_sha256(out) == want, f"{side}: the .gz is not the image"
    med = {k: statistics.median(t for t, _ in v) for k, v in runs.items()}
    return {
        "ours_s": round(med["ours"], 2),
        "lz4_gzip_s": round(med["lz4_gzip"], 2),
        "lz4_pigz_s": round(med["lz4_pigz"], 2),
        "vs_gzip": round(med["lz4_gzip"] / med["ours"], 2),
        "vs_pigz": round(med["lz4_pigz"] / med["ours"], 2),
        "ours_peak_rss_mb": round(max(r for _, r in runs["ours"]) / 1024, 1),
        "ours_gz_bytes": out.stat().st_size,
    }


def nginx(root: Path, port: int, work: Path) -> subprocess.Popen[bytes]:
    conf = work / "nginx.conf"
    conf.write_text(
        "worker_processes 2; daemon off; pid " + str(work / "nginx.pid") + ";\n"
        "error_log " + str(work / "nginx-error.log") + ";\n"
        "events { worker_connections 1024; }\n"
        "http { access_log off; sendfile on; tcp_nopush on; keepalive_timeout 65;\n"
        f"  server {{ listen 127.0.0.1:{port}; root {root}; location / {{ try_files $uri =404; }} }} }}\n"
    )
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(work)])
    _wait_port(port)
    return proc


def _wait_port(port: int) -> None:
    import socket

    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def bench_download(work: Path, img: Path, lz4: Path, rounds: int) -> dict[str, object]:
    www = work / "www"
    shutil.rmtree(www, ignore_errors=True)
    repo = TufRepo(www, f"2020-07-07/metal-k8s-{K}/x86_64").create()
    from tuf.api.metadata import TargetFile

    info = TargetFile.from_file(METAL, str(lz4), ["sha256"])  # the big target, hashed from disk
    repo.targets.signed.targets[METAL] = info  # type: ignore[union-attr]
    os.link(lz4, repo.targets_dir / f"{info.hashes['sha256']}.{METAL}")
    repo.publish()
    # the same bytes published as the OVA target: the download without the conversion
    ova = TufRepo(www, f"2020-07-07/vmware-k8s-{K}/x86_64").create()
    ova_name = f"bottlerocket-vmware-k8s-{K}-x86_64-v1.10.1.ova"
    ova.targets.signed.targets[ova_name] = TargetFile.from_file(ova_name, str(lz4), ["sha256"])  # type: ignore[union-attr]
    os.link(lz4, ova.targets_dir / f"{info.hashes['sha256']}.{ova_name}")
    ova.publish()
    ova_root = ova.metadata_dir / "1.root.json"
    root_file = repo.metadata_dir / "1.root.json"
    port = free_port()
    server = nginx(www, port, work)
    base = f"http://127.0.0.1:{port}"
    meta = f"{base}/2020-07-07/metal-k8s-{K}/x86_64/"
    targets = f"{base}/targets/"
    want = file_sha256(img)
    times: dict[str, list[float]] = {"ours": [], "tuftool": [], "curl": [], "curl_pigz": [], "ours_ova": []}
    try:
        for _ in range(rounds):
            dest = work / "dl-ours"
            shutil.rmtree(dest, ignore_errors=True)
            env = {**os.environ, "IMAGE_BUILDER_WORKSPACE": str(work / f"ws-{time.monotonic_ns()}")}
            t, _ = timed(
                [str(IMAGE_BUILDER), "download.bottlerocket", "--variant", "baremetal", "--kubernetes", K,
                 "--dest", str(dest), "--root", str(root_file), "--root-sha512", sha512(root_file.read_bytes()),
                 "--metadata-url", meta, "--targets-url", targets],
                env=env,
            )  # fmt: skip
            times["ours"].append(t)
            assert gunzip_sha256(dest / METAL.replace(".lz4", ".gz")) == want
            tdest = work / "dl-tuftool"
            shutil.rmtree(tdest, ignore_errors=True)
            script = (
                f"{TUFTOOL} download {tdest} --root {root_file} --target-name {METAL} "
                f"--metadata-url {meta} --targets-url {targets} >/dev/null && "
                f"lz4 -dq {tdest}/{METAL} {tdest}/bottlerocket.img && gzip {tdest}/bottlerocket.img"
            )
            times["tuftool"].append(timed(script)[0])
            url = f"{targets}{info.hashes['sha256']}.{METAL}"
            times["curl"].append(timed(f"curl -sf -o {work}/curl.out {url}")[0])
            # the fastest unverified way to the same .gz (issue 28's peer): no TUF, no hash check, both cores;
            # its output is checked below (sh has no pipefail)
            pigz_out = work / "curl-pigz.gz"
            times["curl_pigz"].append(timed(f"curl -sf {url} | lz4 -dc | pigz -p2 > {pigz_out}")[0])
            assert gunzip_sha256(pigz_out) == want
            odest = work / "dl-ova"
            shutil.rmtree(odest, ignore_errors=True)
            t, _ = timed(
                [str(IMAGE_BUILDER), "download.bottlerocket", "--variant", "vsphere", "--kubernetes", K,
                 "--dest", str(odest), "--root", str(ova_root), "--root-sha512", sha512(ova_root.read_bytes()),
                 "--metadata-url", f"{base}/2020-07-07/vmware-k8s-{K}/x86_64/", "--targets-url", targets],
                env={**os.environ, "IMAGE_BUILDER_WORKSPACE": str(work / f"ws-{time.monotonic_ns()}")},
            )  # fmt: skip
            times["ours_ova"].append(t)
            assert file_sha256(odest / ova_name) == file_sha256(lz4)
    finally:
        server.terminate()
        server.wait(timeout=10)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ours_s": round(med["ours"], 2),
        "tuftool_lz4_gzip_s": round(med["tuftool"], 2),
        "curl_s": round(med["curl"], 2),
        "vs_tuftool": round(med["tuftool"] / med["ours"], 2),
        "vs_curl": round(med["ours"] / med["curl"], 2),
        "curl_lz4_pigz_s": round(med["curl_pigz"], 2),
        "vs_curl_lz4_pigz": round(med["curl_pigz"] / med["ours"], 2),
        "ours_ova_s": round(med["ours_ova"], 2),
        "ova_vs_curl": round(med["ours_ova"] / med["curl"], 2),
        "target_bytes": info.length,
    }


def bench_serve(work: Path, payload: Path, rounds: int, clients: int = 16) -> dict[str, object]:
    root = work / "serve"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    os.link(payload, root / "image.img.gz")
    size = payload.stat().st_size
    script = (
        " & ".join("curl -sf -o /dev/null http://127.0.0.1:{port}/image.img.gz" for _ in range(clients)) + " & wait"
    )
    results: dict[str, list[float]] = {"ours": [], "nginx": []}
    for _ in range(rounds):
        port = free_port()
        ours = subprocess.Popen(
            [str(IMAGE_BUILDER), "serve", "--dir", str(root), "--bind", "127.0.0.1", "--port", str(port),
             "--access-log", str(work / "serve-access.log")],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_port(port)
            results["ours"].append(timed(script.format(port=port))[0])
        finally:
            ours.terminate()
            ours.wait(timeout=10)
        port = free_port()
        server = nginx(root, port, work)
        try:
            results["nginx"].append(timed(script.format(port=port))[0])
        finally:
            server.terminate()
            server.wait(timeout=10)
    med = {k: statistics.median(v) for k, v in results.items()}
    mbps = {k: clients * size / v / MIB for k, v in med.items()}
    return {
        "clients": clients,
        "bytes_each": size,
        "ours_mib_s": round(mbps["ours"], 1),
        "nginx_mib_s": round(mbps["nginx"], 1),
        "ratio": round(mbps["ours"] / mbps["nginx"], 2),
    }


def bench_os1(work: Path, rounds: int = 3) -> dict[str, object]:
    work = work / "os1"
    work.mkdir(parents=True, exist_ok=True)
    img = make_image(work / "bottlerocket.img")
    lz4 = work / "bottlerocket.img.lz4"
    if not lz4.exists():
        subprocess.run(["lz4", "-q", "-f", str(img), str(lz4)], check=True)
    results: dict[str, object] = {"image_bytes": img.stat().st_size, "lz4_bytes": lz4.stat().st_size}
    results["convert"] = bench_convert(work, img, lz4, rounds)
    results["download"] = bench_download(work, img, lz4, rounds)
    results["serve"] = bench_serve(work, work / "out.gz", rounds)
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "convert":
        convert_ours(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        import json

        print(json.dumps(bench_os1(Path(tempfile.mkdtemp(prefix="bench-os1-"))), indent=2))
