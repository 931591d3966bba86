"""The reference's runtime tarballs, packed from a runtime built from source, for stand-in releases to carry.

Its containerd tarball is laid out as aws/eks-anywhere-build-tooling's ``projects/containerd/containerd/build/
create_tarballs.sh`` makes it: containerd's binaries and its attribution under ``usr/local/bin/``, runc and its
attribution under ``sbin/`` (so a merged-/usr image must not get it extracted over ``/``), no systemd unit; every
entry ``./``-prefixed, directories included, as ``tar -C staging .`` writes them. Its cri-tools tarball holds
``./crictl``.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from imagebuilder.release.catalog import ReleaseChannel
from imagebuilder.release.source import RuntimeBuild


def _pack(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for d in sorted({"/".join(n.split("/")[:i]) for n in files for i in range(1, n.count("/") + 1)}):
            info = tarfile.TarInfo(f"./{d}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode = len(data), 0o755 if not name.endswith(".txt") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def reference_tarballs(runtime: RuntimeBuild) -> tuple[bytes, bytes]:
    """(containerd tarball, cri-tools tarball) of ``runtime``, in the reference bundle's layouts."""
    files = {f"usr/local/bin/{b}": (runtime.containerd_bin / b).read_bytes()
             for b in ("containerd", "ctr", "containerd-shim-runc-v2")}  # fmt: skip
    files["usr/local/bin/CONTAINERD_ATTRIBUTION.txt"] = f"containerd {runtime.containerd}\n".encode()
    files["sbin/runc"] = (runtime.runc_bin / "runc").read_bytes()
    files["sbin/RUNC_ATTRIBUTION.txt"] = f"runc {runtime.runc}\n".encode()
    return _pack(files), _pack({"crictl": (runtime.crictl_bin / "crictl").read_bytes()})


def _pack_upstream(files: dict[str, bytes]) -> bytes:
    """A tarball as containerd's and cri-tools' release scripts write theirs: entries without a ``./`` prefix."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_upstream_runtime(root: Path, channel: ReleaseChannel, runtime: RuntimeBuild) -> dict[str, Path]:
    """``runtime`` (which must be ``channel``'s) as each project publishes it, under ``root`` at the upstream paths
    config/release-channels.yaml names: containerd's tarball (``bin/``, no runc, no unit) with its ``.sha256sum``
    (``<hex>  <name>``), runc's binary with ``runc.sha256sum`` (a line per architecture) and crictl's tarball
    (``crictl``) with its ``.sha256`` (the digest alone). Returns artifact name -> the file written."""
    import hashlib

    from imagebuilder.core.fetch import Mirror
    from imagebuilder.release.upstream import upstream_files

    want = {"containerd": runtime.containerd, "runc": runtime.runc, "crictl": runtime.crictl}
    parts = upstream_files(channel.runtime)
    assert {p.name: p.version for p in parts} == want, (channel.name, want)
    data = {
        "containerd": _pack_upstream({f"bin/{b}": (runtime.containerd_bin / b).read_bytes()
                                      for b in ("containerd", "ctr", "containerd-shim-runc-v2")}),
        "runc": (runtime.runc_bin / "runc").read_bytes(),
        "crictl": _pack_upstream({"crictl": (runtime.crictl_bin / "crictl").read_bytes()}),
    }  # fmt: skip
    mirror = Mirror(str(root))
    written: dict[str, Path] = {}
    for part in parts:
        path = Path(mirror.locate(part.url))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[part.name])
        digest, name = hashlib.sha256(data[part.name]).hexdigest(), part.url.rsplit("/", 1)[-1]
        sums = {
            "containerd": f"{digest}  {name}\n",
            "runc": f"{'0' * 64}  runc.arm64\n{digest}  {name}\n{'1' * 64}  runc.ppc64le\n",
            "crictl": f"{digest}\n",
        }[part.name]
        Path(mirror.locate(part.sums_url)).write_text(sums)
        written[part.name] = path
    return written
