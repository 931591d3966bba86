"""Package a disk into an OVA: streamOptimized VMDK, OVF descriptor, SHA256 manifest, tarred with the OVF first.

The OVF spec (DSP0243) requires the descriptor to be the first file of the tar and the manifest (if any) to
follow it; vSphere's content library and ``govc import.ova`` both read it that way. The disk capacity in the
descriptor is the virtual size of the real disk (``qemu-img info``), and the file size is that of the VMDK.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import partial_prefix, sha256_file
from imagebuilder.core.render import template_env
from imagebuilder.core.safepath import check_relative
from imagebuilder.image.reproducible import source_date


def disk_info(path: Path) -> dict[str, int | str]:
    proc = subprocess.run(
        ["qemu-img", "info", "--output=json", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise ExternalError(f"qemu-img info {path} failed: {proc.stderr.strip()}")
    info: dict[str, int | str] = json.loads(proc.stdout)
    return info


#: the descriptor line qemu-img writes with a random content ID (printed without zero padding: 1 to 8 digits)
_CID = re.compile(rb"\nCID=([0-9a-f]{1,8})\n")
#: a sparse VMDK's header: magic, version, flags, capacity, grain size, descriptor offset and size (sectors)
_VMDK_HEADER = struct.Struct("<4sIIQQQQ")


def _fixed_cid(vmdk: Path, name: str) -> None:
    """Replace the random content ID qemu-img gives a new VMDK (``CID=`` in its embedded descriptor) with one made
    from ``name``, in place: the same disk converted twice gives the same bytes. The descriptor is rewritten whole
    within its area (qemu-img prints the CID without zero padding, so its length varies)."""
    cid = f"{zlib.crc32(name.encode()):08x}".encode()
    with vmdk.open("r+b") as fh:
        magic, _, _, _, _, offset, size = _VMDK_HEADER.unpack(fh.read(_VMDK_HEADER.size))
        if magic != b"KDMV" or not 0 < offset < 1024 or not 0 < size <= 1024:
            raise ExternalError(f"{vmdk.name}: not a sparse VMDK with an embedded descriptor",
                                hint="check qemu-img's version (streamOptimized VMDK)")  # fmt: skip
        fh.seek(offset * 512)
        area = fh.read(size * 512)
        text = area.rstrip(b"\0")
        fixed, count = _CID.subn(b"\nCID=" + cid + b"\n", text, count=1)
        if count != 1 or len(fixed) > len(area):
            raise ExternalError(f"{vmdk.name}: qemu-img wrote no CID= line in the VMDK descriptor",
                                hint="check qemu-img's version (streamOptimized VMDK)")  # fmt: skip
        fh.seek(offset * 512)
        fh.write(fixed.ljust(len(area), b"\0"))


def make_ova(
    disk: Path,
    dest: Path,
    *,
    name: str,
    guest_os_type: str = "ubuntu64Guest",
    cpus: int = 2,
    memory_mb: int = 4096,
    extra_disks: Sequence[Path] = (),
    firmware: str = "bios",
) -> Path:
    """Write ``dest`` (an OVA) from ``disk`` (any format qemu-img reads) and any ``extra_disks`` (Hard disk 2, ...);
    ``firmware="efi"`` marks it for UEFI (VMware's ``firmware`` extra config). Nothing appears at ``dest`` on
    failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    # named like files.atomic_write's temporary files (the pid in the name): a killed run's is found by the next
    with tempfile.TemporaryDirectory(prefix=partial_prefix(dest), suffix=".tmp", dir=dest.parent) as tmp:
        work = Path(tmp)
        disks: list[dict[str, Any]] = []
        for n, source in enumerate((disk, *extra_disks), start=1):
            capacity = int(disk_info(source)["virtual-size"])
            vmdk = work / f"{name}-disk{n}.vmdk"
            proc = subprocess.run(
                ["qemu-img", "convert", "-O", "vmdk", "-o", "subformat=streamOptimized", str(source), str(vmdk)],
                capture_output=True,
                text=True,
                timeout=7200,
                check=False,
            )
            if proc.returncode != 0:
                raise ExternalError(f"converting {source} to a streamOptimized VMDK failed: {proc.stderr.strip()}")
            _fixed_cid(vmdk, f"{name}-disk{n}")
            disks.append(
                {
                    "n": n,
                    "path": vmdk,
                    "file": escape(vmdk.name),
                    "size": vmdk.stat().st_size,
                    "capacity": capacity,
                    # the stream's size, not the blocks it takes on this host's filesystem (which differ between
                    # filesystems, and the OVA must not)
                    "populated": vmdk.stat().st_size,
                }
            )
        ovf = work / f"{name}.ovf"
        ovf.write_text(
            template_env()
            .get_template("templates/ovf/node.ovf.j2")
            .render(
                disks=disks,
                name=escape(name),
                os_id=94 if "ubuntu" in guest_os_type else 80,
                guest_os_type=escape(guest_os_type),
                cpus=cpus,
                memory_mb=memory_mb,
                firmware="efi" if firmware == "efi" else "bios",  # vSphere boots the VM with UEFI when efi
            )
        )
        mf = work / f"{name}.mf"
        files: list[Path] = [ovf, *(d["path"] for d in disks)]
        mf.write_text("".join(f"SHA256({p.name})= {sha256_file(p)}\n" for p in files))
        tmp_ova = work / "out.ova"
        with tarfile.open(tmp_ova, "w", format=tarfile.USTAR_FORMAT) as tar:
            for member in (ovf, mf, *files[1:]):  # the descriptor first, then the manifest (DSP0243)
                info = tar.gettarinfo(str(member), arcname=member.name)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = 0o644
                # the build's SOURCE_DATE_EPOCH, not when this run wrote the file: the same disk, the same OVA
                when = source_date()
                info.mtime = when if when is not None else int(info.mtime)
                with member.open("rb") as fh:
                    tar.addfile(info, fh)
        os.replace(tmp_ova, dest)
    return dest


#: a disk's first bytes by format: sparse/streamOptimized VMDK ("KDMV"), a VMDK text descriptor, qcow2, ISO at 32 KiB
_DISK_MAGIC = (b"KDMV", b"# Disk DescriptorFile", b"QFI\xfb")


def check_ova(path: Path) -> list[str]:
    """Everything that can be known about an OVA without a server, read whole before anything is created there.

    A tar archive whose first member is an OVF descriptor that parses as XML, only plain files with safe names, a
    manifest (when present) whose SHA-1/SHA-256 lines match every file, and disks that start like disks. Returns the
    file names in archive order; raises :class:`InputError` (exit 2) naming the first problem."""
    from defusedxml import ElementTree  # the one XML parser that refuses entity bombs
    from defusedxml.common import DefusedXmlException

    def bad(message: str) -> InputError:
        return InputError(message, source=path, field="--ova", expected="an intact OVA (download it again)")

    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError) as exc:
        raise bad(f"not a tar archive ({exc})") from None
    names: list[str] = []
    sums: dict[str, tuple[str, str]] = {}
    digests: dict[str, dict[str, str]] = {}
    try:
        with tar:
            for n, member in enumerate(tar):
                if not member.isfile():
                    raise bad(f"member {member.name[:60]!r} is not a plain file")
                if "/" in member.name:
                    raise bad(f"member {member.name[:60]!r} is in a folder (an OVA is flat)")
                check_relative(member.name, what="OVA member")
                if n == 0 and not member.name.endswith(".ovf"):
                    raise bad("the OVF descriptor is not the first file")
                stream = tar.extractfile(member)
                assert stream is not None
                hashers = {"SHA1": hashlib.sha1(usedforsecurity=False), "SHA256": hashlib.sha256()}
                head = b""
                data = b""
                while block := stream.read(1024 * 1024):
                    if not head:
                        head = block[:64]
                    if member.name.endswith((".ovf", ".mf")):
                        data += block
                        if len(data) > 16 * 1024 * 1024:
                            raise bad(f"{member.name} is larger than 16 MiB: not a descriptor")
                    for h in hashers.values():
                        h.update(block)
                if n == 0:
                    try:
                        ElementTree.fromstring(data)
                    except (ElementTree.ParseError, DefusedXmlException) as exc:
                        raise bad(f"the OVF descriptor is not valid XML ({exc})") from None
                if member.name.endswith(".mf"):
                    for line in data.decode(errors="replace").splitlines():
                        m = re.fullmatch(r"(SHA1|SHA256)\((.+)\)\s*=\s*([0-9a-fA-F]+)", line.strip())
                        if m:
                            sums[m.group(2)] = (m.group(1), m.group(3).lower())
                if member.name.endswith(".vmdk") and not head.startswith(_DISK_MAGIC):
                    raise bad(f"{member.name} does not start like a VMDK disk")
                digests[member.name] = {k: h.hexdigest() for k, h in hashers.items()}
                names.append(member.name)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise bad(f"the archive is truncated or corrupt ({exc})") from None
    if not names:
        raise bad("the archive is empty")
    if not any(n.endswith(".vmdk") for n in names):
        raise bad("it holds no .vmdk disk")
    for name, (alg, want) in sums.items():
        if name not in digests:
            raise bad(f"the manifest lists {name[:60]!r}, which is not in the archive")
        if digests[name][alg] != want:
            raise bad(f"{name} does not match the OVA's manifest ({alg} {digests[name][alg]}, manifest {want})")
    return names


_VMW = "{http://www.vmware.com/schema/ovf}"


def ova_firmware(path: Path) -> str:
    """What an OVA asks vSphere to boot it with: ``efi`` when its descriptor carries VMware's ``firmware=efi``
    config (as vSphere exports an EFI VM, and :func:`make_ova` writes one), else ``bios``."""
    from defusedxml import ElementTree
    from defusedxml.common import DefusedXmlException

    try:
        with tarfile.open(path, "r:") as tar:
            first = tar.next()
            stream = tar.extractfile(first) if first is not None and first.name.endswith(".ovf") else None
            data = stream.read(16 * 1024 * 1024) if stream is not None else b""
        root = ElementTree.fromstring(data) if data else None
    except (tarfile.TarError, OSError, ElementTree.ParseError, DefusedXmlException) as exc:
        raise InputError(f"cannot read the OVF descriptor ({exc})", source=path) from None
    for config in root.iter(f"{_VMW}Config") if root is not None else ():
        if config.get(f"{_VMW}key") == "firmware" and config.get(f"{_VMW}value") == "efi":
            return "efi"
    return "bios"
