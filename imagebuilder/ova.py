"""Package a disk into an OVA: streamOptimized VMDK, OVF descriptor, SHA256 manifest, tarred with the OVF first.

The OVF spec (DSP0243) requires the descriptor to be the first file of the tar and the manifest (if any) to
follow it; vSphere's content library and ``govc import.ova`` both read it that way. The disk capacity in the
descriptor is the virtual size of the real disk (``qemu-img info``), and the file size is that of the VMDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from imagebuilder.errors import ExternalError
from imagebuilder.files import sha256_file
from imagebuilder.render import template_env


def disk_info(path: Path) -> dict[str, int | str]:
    proc = subprocess.run(
        ["qemu-img", "info", "--output=json", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise ExternalError(f"qemu-img info {path} failed: {proc.stderr.strip()}")
    info: dict[str, int | str] = json.loads(proc.stdout)
    return info


def make_ova(
    disk: Path,
    dest: Path,
    *,
    name: str,
    guest_os_type: str = "ubuntu64Guest",
    cpus: int = 2,
    memory_mb: int = 4096,
    extra_disks: Sequence[Path] = (),
) -> Path:
    """Write ``dest`` (an OVA) from ``disk`` (any format qemu-img reads) and any ``extra_disks`` (Hard disk 2, ...);
    nothing appears at ``dest`` on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
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
            disks.append(
                {
                    "n": n,
                    "path": vmdk,
                    "file": escape(vmdk.name),
                    "size": vmdk.stat().st_size,
                    "capacity": capacity,
                    "populated": int(disk_info(vmdk).get("actual-size", 0)),
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
                with member.open("rb") as fh:
                    tar.addfile(info, fh)
        os.replace(tmp_ova, dest)
    return dest
