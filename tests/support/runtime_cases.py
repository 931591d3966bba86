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


def standin_upstream_runtime(root: Path, channel: str, sums: dict[str, str] | None = None) -> dict[str, bytes]:
    """Line ``channel``'s runtime files at their upstream paths under ``root`` (a directory mirror), stand-in bytes,
    each with the checksum file its project publishes beside it (``sums``: a checksum file's text instead):
    artifact name -> bytes. For plans and mirrors; the real binaries are tests/support/runtime.py's."""
    import hashlib

    from imagebuilder.core.fetch import Mirror
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.upstream import upstream_files

    mirror = Mirror(str(root))
    data = {}
    for part in upstream_files(load_catalog().channel(channel).runtime):
        body = f"{part.name} {part.version} as published".encode()
        path = Path(mirror.locate(part.url))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        name = part.url.rsplit("/", 1)[-1]
        text = (sums or {}).get(part.name, f"{hashlib.sha256(body).hexdigest()}  {name}\n")
        Path(mirror.locate(part.sums_url)).write_text(text)
        data[part.name] = body
    return data
