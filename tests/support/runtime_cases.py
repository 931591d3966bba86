"""What the in-process tests (tests/unit/test_runtime.py) and the integration tests (tests/integration/test_runtime.py)
of runtime share."""

from __future__ import annotations

from pathlib import Path

STATUS = "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2\n"


BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")


def runtime_tarball(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        dirs = sorted({str(Path(m).parent) for m in members} - {"."})
        for d in dirs:  # the directory entries a tarball made with `tar -C staging .` carries (./sbin/ among them)
            info = tarfile.TarInfo("./" + d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo("./" + name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo("./" + name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


#: aws/eks-anywhere-build-tooling projects/containerd/containerd/build/create_tarballs.sh: usr/local/bin, sbin/runc
REFERENCE = {**{f"usr/local/bin/{b}": b.encode() for b in BINARIES}, "sbin/runc": b"runc",
             "usr/local/bin/CONTAINERD_ATTRIBUTION.txt": b"a", "sbin/RUNC_ATTRIBUTION.txt": b"r"}  # fmt: skip
