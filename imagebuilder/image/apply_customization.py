"""``image.customize``: spec 4.8 on a local image (a bare-metal ``.gz`` or raw disk, a qcow2, a local OVA).

The image is never touched: a working qcow2 is made from it, booted under QEMU (KVM when usable, else TCG) with a
NoCloud seed holding the same two documents ``template.customize`` writes into guestinfo (plus NoCloud's own
``network-config``, which the VMware datasource takes from the metadata), customized over SSH exactly as a vSphere
clone is (:mod:`imagebuilder.customization.roles`), and powered off by its seal. The result is checked to boot (boot
sectors, clean filesystems) and written to the destination in the input's format, atomically, with its ``.sha256``
and the input's build manifest extended by what was customized (never a secret), so ``image.verify`` checks it like
a build. A destination that exists is left alone unless ``force``.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.core.disk import image_format, leftovers, raw_view, release
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, parse_json, partial_prefix, read_text, run_checked, sha256_file
from imagebuilder.core.hostinfo import ovmf_firmware
from imagebuilder.core.progress import Say, silent
from imagebuilder.customization import roles
from imagebuilder.customization.model import Customization
from imagebuilder.image import qemu
from imagebuilder.image.outputs import Packaged, compress, place, require_bootable
from imagebuilder.image.ova import make_ova, ova_firmware
from imagebuilder.release.catalog import Firmware

#: the output formats, by how the input is recognised
KINDS = ("gz", "ova", "raw", "qcow2")


@dataclass(frozen=True)
class Result:
    dest: Path
    sha256: str | None
    manifest: Path | None
    kept: bool = False  # the destination existed and was left alone
    warnings: tuple[str, ...] = ()


def image_kind(image: Path) -> str:
    """``gz`` (a compressed raw disk), ``ova``, or what qemu-img reads (raw or qcow2)."""
    if image.name.endswith(".gz"):
        return "gz"
    if image.name.endswith(".ova"):
        return "ova"
    fmt = image_format(image)
    if fmt not in KINDS:
        raise InputError(f"a {fmt} image cannot be customized here", source=image, expected="a .gz, .ova, raw or qcow2")
    if fmt == "raw":  # qemu-img calls any file raw: a disk has a boot signature (MBR, or GPT's protective MBR)
        with image.open("rb") as fh:
            fh.seek(510)
            if fh.read(2) != b"\x55\xaa":
                raise InputError("not a disk image (no partition table)", source=image,
                                 expected="a .gz, .ova, raw or qcow2 disk image")  # fmt: skip
    return fmt


def check_request(image: Path, dest: Path) -> str:
    """What the dry run and the real run both check first; returns the image kind."""
    if not image.is_file():
        raise InputError("image not found", source=image, expected="a .gz, .ova, raw or qcow2 disk image")
    kind = image_kind(image)
    suffix = {"gz": ".gz", "ova": ".ova"}.get(kind)
    if suffix and not dest.name.endswith(suffix):
        raise InputError(
            f"{dest.name} does not end in {suffix}", field="--dest", expected=f"a {suffix} file (the input's format)"
        )
    if dest.resolve() == image.resolve():
        raise InputError("the destination is the input image", field="--dest", expected="a new file")
    return kind


def manifest_beside(image: Path) -> Path:
    stem = image.name
    for ext in (".gz", ".ova", ".qcow2"):
        stem = stem.removesuffix(ext)
    return image.with_name(f"{stem}.build-manifest.json")


def input_firmware(image: Path) -> Firmware:
    """What the input boots with: its build manifest's firmware (a ``--firmware efi`` build), else an OVA's own
    (its descriptor's), else BIOS. The guest is booted with it, and an OVA output keeps it."""
    source = manifest_beside(image)
    if not source.is_file():
        return "efi" if image.name.endswith(".ova") and ova_firmware(image) == "efi" else "bios"
    data = parse_json(read_text(source, "build manifest"), source)
    plan = data.get("plan") if isinstance(data, dict) else None
    return "efi" if isinstance(plan, dict) and plan.get("firmware") == "efi" else "bios"


def _write_output(kind: str, disk: Path, dest: Path, work: Path, say: Say, firmware: Firmware) -> Packaged:
    if kind == "ova":
        say("packing the OVA (streamOptimized VMDK, new OVF and manifest)")
        out = make_ova(disk, work / "out.ova", name=dest.name.removesuffix(".ova"), firmware=firmware)
        return place(out, dest)
    raw = work / "out.raw"
    run_checked("qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(disk), str(raw), timeout=7200)
    if kind == "gz":
        return compress(raw, dest, say)
    if kind == "raw":
        return place(raw, dest)
    out = work / "out.qcow2"
    run_checked("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out), timeout=7200)
    return place(out, dest)


def customize_image(
    image: Path,
    customization: Customization,
    dest: Path,
    *,
    keep_user: bool = False,
    force: bool = False,
    timeout: float = 1800,
    say: Say = silent,
) -> Result:
    kind = check_request(image, dest)
    if dest.exists() and not force:
        return Result(dest, None, None, kept=True)
    warnings = (roles.KEEP_USER_WARNING,) if keep_user else ()
    firmware = input_firmware(image)
    if firmware == "efi":
        ovmf_firmware()  # a missing OVMF fails here, before any copy is made
    dest.parent.mkdir(parents=True, exist_ok=True)
    # what a killed run left: its working copy beside dest, its QEMU guest still running, its temp folders
    release(leftovers(outputs=(dest.parent,)))
    with tempfile.TemporaryDirectory(prefix=partial_prefix(dest), suffix=".tmp", dir=dest.parent) as tmp:
        work = Path(tmp)
        disk = work / "disk.qcow2"
        say(f"copying {image.name} into a working qcow2")
        with raw_view(image, work_dir=work) as raw:
            run_checked("qemu-img", "convert", "-O", "qcow2", str(raw), str(disk), timeout=7200)
        log = roles.log_path(dest.parent, dest.name)
        with roles.run(customization, keep_user=keep_user) as run:
            seed = qemu.seed_iso(run.documents.nocloud_files(), work)
            port = qemu.free_port()
            with qemu.running(
                disk,
                fmt="qcow2",
                serial=work / "serial.log",
                cdrom=seed,
                ssh_port=port,
                memory_mb=2048,
                firmware=firmware,
            ) as guest:
                say(f"booting {image.name} under QEMU ({guest.accelerator}{', UEFI' if firmware == 'efi' else ''})")
                try:
                    roles.apply(run, "127.0.0.1", port, log=log, timeout=timeout, say=say, gone=guest.exited)
                except ExternalError as exc:
                    raise ExternalError(
                        f"customizing {image.name} failed: {exc.message}; console ends: "
                        + guest.console(300).replace("\n", " | "),
                        hint=exc.hint,
                    ) from None
                say("waiting for the guest to seal itself and power off")
                if not guest.wait(600):
                    raise ExternalError(
                        "the guest did not power off within 600 s after its seal",
                        hint="console ends: " + guest.console(300).replace("\n", " | "),
                    )
        say("checking the customized disk's boot sectors and filesystems")
        require_bootable(disk, "the customized image", work_dir=work)
        packaged = _write_output(kind, disk, dest, work, say, firmware)
    assert packaged.sha256 is not None and packaged.size is not None
    with atomic_write(dest.with_name(dest.name + ".sha256")) as fh:
        fh.write(f"{packaged.sha256}  {dest.name}\n")
    manifest = _write_manifest(image, customization, dest, packaged, keep_user)
    return Result(dest, packaged.sha256, manifest, warnings=warnings)


def _write_manifest(
    image: Path, customization: Customization, dest: Path, packaged: Packaged, keep_user: bool
) -> Path | None:
    """The input's build manifest, with the new artifact and what was customized (no secret: hosts only)."""
    source = manifest_beside(image)
    if not source.is_file():
        return None
    data: dict[str, Any] = parse_json(read_text(source, "build manifest"), source)
    if not isinstance(data, dict):
        return None
    data["customized_from"] = {"image": image.name, "artifact": data.get("artifact")}
    data["artifact"] = {"name": dest.name, "sha256": packaged.sha256, "size": packaged.size}
    data["customization"] = {
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "file_sha256": sha256_file(customization.source),
        **customization.summary(),
        "user_kept": keep_user,
    }
    path = manifest_beside(dest)
    with atomic_write(path) as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    return path


__all__ = ["Result", "check_request", "customize_image", "image_kind"]
