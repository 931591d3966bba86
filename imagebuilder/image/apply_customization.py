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
from typing import TYPE_CHECKING, Any

from imagebuilder import __version__
from imagebuilder.attest import provenance, sbom
from imagebuilder.attest.packages import Inventory, load_inventory
from imagebuilder.core.arch import Arch, recorded
from imagebuilder.core.disk import gunzip_sparse, image_format, leftovers, raw_view, release
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, parse_json, partial_prefix, read_text, run_checked, sha256_file
from imagebuilder.core.progress import Say, silent
from imagebuilder.customization import roles
from imagebuilder.customization.model import Customization
from imagebuilder.image import qemu
from imagebuilder.image.gzipdisk import Origin
from imagebuilder.image.outputs import Packaged, compress, place, require_bootable
from imagebuilder.image.ova import make_ova, ova_firmware
from imagebuilder.release.catalog import Firmware

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

#: the output formats, by how the input is recognised
KINDS = ("gz", "ova", "raw", "qcow2")


@dataclass(frozen=True)
class Result:
    dest: Path
    sha256: str | None
    manifest: Path | None
    kept: bool = False  # the destination existed and was left alone
    warnings: tuple[str, ...] = ()
    sbom: Path | None = None
    provenance: Path | None = None


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


def _input_plan(image: Path) -> dict[str, Any] | None:
    """The plan of the input's build manifest, when it has one beside it."""
    source = manifest_beside(image)
    if not source.is_file():
        return None
    data = parse_json(read_text(source, "build manifest"), source)
    plan = data.get("plan") if isinstance(data, dict) else None
    return plan if isinstance(plan, dict) else None


def input_firmware(image: Path) -> Firmware:
    """What the input boots with: its build manifest's firmware (a ``--firmware efi`` build), else an OVA's own
    (its descriptor's), else BIOS. The guest is booted with it, and an OVA output keeps it."""
    plan = _input_plan(image)
    if plan is None:
        return "efi" if image.name.endswith(".ova") and ova_firmware(image) == "efi" else "bios"
    return "efi" if plan.get("firmware") == "efi" or not recorded(plan, manifest_beside(image)).bios else "bios"


def input_arch(image: Path) -> Arch:
    """The input's architecture, as its build manifest records it (an image without one is amd64): its guest boots
    under that architecture's QEMU and firmware."""
    plan = _input_plan(image)
    return recorded(plan or {}, manifest_beside(image))


def _working_copy(image: Path, kind: str, disk: Path, work: Path) -> Origin | None:
    """The input as the working qcow2 ``disk``. A .gz input is decompressed once, and where its gzip members lie,
    found in that pass, is returned: the output's MiBs that the customization left as they were take them."""
    if kind != "gz":
        with raw_view(image, work_dir=work) as raw:
            run_checked("qemu-img", "convert", "-O", "qcow2", str(raw), str(disk), timeout=7200)
        return None
    raw = work / "input.raw"
    members = gunzip_sparse(image, raw)
    run_checked("qemu-img", "convert", "-O", "qcow2", str(raw), str(disk), timeout=7200)
    raw.unlink()
    return Origin.of(image, members)


def _write_output(
    kind: str, disk: Path, dest: Path, work: Path, say: Say, firmware: Firmware, origin: Origin | None
) -> Packaged:  # fmt: skip
    if kind == "ova":
        say("packing the OVA (streamOptimized VMDK, new OVF and manifest)")
        out = make_ova(disk, work / "out.ova", name=dest.name.removesuffix(".ova"), firmware=firmware)
        return place(out, dest)
    raw = work / "out.raw"
    run_checked("qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(disk), str(raw), timeout=7200)
    if kind == "gz":
        # a .gz input of one member per MiB (as builds write it) gives its members to the MiBs the customization
        # left as they were: a few changed MiBs are compressed, not the whole disk again
        return compress(raw, dest, say, origin=origin)
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
    signer: Signer | None = None,
) -> Result:
    """See the module docstring. The output's SBOM is written beside it from its own package database (the sbom
    role reads it in the guest before the seal), carrying the input's Kubernetes components and naming the input
    as what it descends from; with ``signer``, a provenance of the customization is signed too."""
    started = dt.datetime.now(dt.UTC)
    kind = check_request(image, dest)
    if dest.exists() and not force:
        return Result(dest, None, None, kept=True)
    warnings = (roles.KEEP_USER_WARNING,) if keep_user else ()
    firmware, machine = input_firmware(image), input_arch(image)
    if firmware == "efi":
        machine.firmware()  # a missing OVMF (AAVMF) fails here, before any copy is made
    dest.parent.mkdir(parents=True, exist_ok=True)
    # what a killed run left: its working copy beside dest, its QEMU guest still running, its temp folders
    release(leftovers(outputs=(dest.parent,)))
    with tempfile.TemporaryDirectory(prefix=partial_prefix(dest), suffix=".tmp", dir=dest.parent) as tmp:
        work = Path(tmp)
        disk = work / "disk.qcow2"
        say(f"copying {image.name} into a working qcow2")
        origin = _working_copy(image, kind, disk, work)
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
                machine=machine,
            ) as guest:
                say(f"booting {image.name} under QEMU ({guest.accelerator}{', UEFI' if firmware == 'efi' else ''})")
                try:
                    roles.apply(run, "127.0.0.1", port, log=log, timeout=timeout, say=say, gone=guest.exited,
                                extra_vars={"sbom_inventory": str(work / INVENTORY)})  # fmt: skip
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
        packaged = _write_output(kind, disk, dest, work, say, firmware, origin)
        assert packaged.sha256 is not None and packaged.size is not None
        inventory = load_inventory(work / INVENTORY)
    with atomic_write(dest.with_name(dest.name + ".sha256")) as fh:
        fh.write(f"{packaged.sha256}  {dest.name}\n")
    attested = _write_attestations(image, dest, packaged.sha256, inventory, customization, signer, started, machine)
    manifest = _write_manifest(image, customization, dest, packaged, keep_user, attested)
    prov = provenance.companion(dest, provenance.SUFFIX) if attested["provenance"] else None
    return Result(dest, packaged.sha256, manifest, warnings=warnings, sbom=provenance.companion(dest, ".spdx.json"),
                  provenance=prov)  # fmt: skip


#: where the sbom role leaves the guest's package database in the working folder
INVENTORY = "sbom-inventory.json"


def _write_attestations(image: Path, dest: Path, sha256: str, inventory: Inventory, customization: Customization,
                        signer: Signer | None, started: dt.datetime, machine: Arch) -> dict[str, Any]:  # fmt: skip
    """The customized image's SBOM (and, with ``signer``, its provenance); returns what its manifest records."""
    old_sbom = provenance.companion(image, ".spdx.json")
    old = parse_json(read_text(old_sbom, "SBOM"), old_sbom) if old_sbom.is_file() else {}
    before = sbom.package_names(old) if isinstance(old, dict) else {}
    after = {p.name: p.version for p in inventory.packages}
    added = sorted(set(after) - set(before)) if before else []
    changed = sorted(n for n in set(after) & set(before) if after[n] != before[n])
    notes = [f"customized by image.customize from {image.name}: CA certificates "
             f"{customization.summary()['ca_certificates'] or 'none'}, registries "
             f"{customization.summary()['registries'] or 'none'}; packages added: {', '.join(added) or 'none'}"
             + (f"; packages changed: {', '.join(changed)}" if changed else "")]  # fmt: skip
    doc = sbom.document(
        name=dest.name, sha256=sha256, inventory=inventory, carry=sbom.carried(old) if isinstance(old, dict) else [],
        origin=sbom.Origin(image.name, {"sha256": sha256_file(image)}, "the image this one was customized from"),
        annotations=notes, arch=machine.name,
    )  # fmt: skip
    sbom_path = provenance.companion(dest, ".spdx.json")
    with atomic_write(sbom_path) as fh:
        fh.write(json.dumps(doc, indent=1) + "\n")
    recorded: dict[str, Any] = {"sbom": {"name": sbom_path.name, "sha256": sha256_file(sbom_path),
                                         "packages": len(inventory.packages), "added": added}}  # fmt: skip
    stale = provenance.companion(dest, provenance.SUFFIX)
    if signer is None:
        stale.unlink(missing_ok=True)  # a provenance of an earlier output at this name would be a false statement
        recorded["provenance"] = None
        return recorded
    deps = [
        provenance.Dependency("customized-image", {"sha256": sha256_file(image)}, image.name),
        provenance.Dependency(f"config:{customization.source.name}", {"sha256": sha256_file(customization.source)}),
    ]
    old_prov = provenance.companion(image, provenance.SUFFIX)
    if old_prov.is_file():
        deps.append(provenance.Dependency(old_prov.name, {"sha256": sha256_file(old_prov)}))
    statement = provenance.statement(
        image=dest, sha256=sha256, parameters={"task": "image.customize", "input": image.name,
                                               **customization.summary()},
        dependencies=deps, tools={"image-builder": __version__}, invocation=f"{dest.name}-{started:%Y%m%dT%H%M%SZ}",
        started=started, finished=dt.datetime.now(dt.UTC), sbom=sbom_path,
    )  # fmt: skip
    provenance.write(stale, provenance.sign(statement, signer))
    recorded["provenance"] = {"name": stale.name, "signed_by": signer.public_key.keyid}
    return recorded


def _write_manifest(
    image: Path, customization: Customization, dest: Path, packaged: Packaged, keep_user: bool, attested: dict[str, Any]
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
    data.pop("gzip_members", None)  # the input's: the output's own, when it is a .gz, replace them
    data.update(packaged.extra)
    data["customization"] = {
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "file_sha256": sha256_file(customization.source),
        **customization.summary(),
        "user_kept": keep_user,
    }
    data.update(attested)
    path = manifest_beside(dest)
    with atomic_write(path) as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    return path


__all__ = ["Result", "check_request", "customize_image", "image_kind"]
