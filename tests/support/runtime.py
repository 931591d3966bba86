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
