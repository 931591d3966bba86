"""The child of a chroot build (:func:`imagebuilder.builder.chroot.provision`), in a mount namespace of its own:
attach the image's partitions on loop devices, mount them, provide /proc, /sys, /dev, /run and /tmp, run each
command of its spec, and release everything for real on the way out (also when asked to stop).

It is a module apart so that the child starts in a few hundredths of a second: it imports only the disk helpers,
not the planner, the fetcher and the cloud clients the parent needs (about half a second of CPU per build)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from imagebuilder.core import disk
from imagebuilder.core.arch import arch, root_arch
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.progress import Say
from imagebuilder.core.safepath import safe_join


def _fstab_mounts(root: Path) -> list[tuple[str, str, str]]:
    """(source, mount point, type) of the image's fstab entries below / that name a filesystem by UUID or LABEL."""
    fstab = root / "etc" / "fstab"
    if not fstab.is_file():
        return []
    out = []
    for line in fstab.read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#") or fields[1] in ("/", "none") or fields[2] == "swap":
            continue
        if fields[0].startswith(("UUID=", "LABEL=")):
            out.append((fields[0], fields[1], fields[2]))
    return out


@contextlib.contextmanager
def attached(raw: Path, mountpoint: Path, *, log: Say, devices_out: dict[int, str] | None = None) -> Iterator[Path]:
    """The image's root filesystem mounted read-write at ``mountpoint`` (grown to its partition first), with the
    image's other partitions that its fstab mounts below it. Everything is released for real on the way out.
    ``devices_out`` is given each partition's loop device (by partition number)."""
    _, parts = disk.partitions(raw)
    root_part = disk.root_partition(raw)
    with contextlib.ExitStack() as stack:
        devices = {p.number: stack.enter_context(disk.loop_device(raw, p.offset, p.length)) for p in parts}
        if devices_out is not None:
            devices_out.update(devices)
        disk.grow_filesystem(devices[root_part.number])
        root = stack.enter_context(disk.mounted(devices[root_part.number], mountpoint, log=log))
        ids: dict[str, str] = {}
        for dev in devices.values():
            for key in ("UUID", "LABEL"):
                # -p: probe the device itself. blkid's cache trusts an entry probed moments ago, and loop devices are
                # reused at once (builds and tests in parallel): it named this device by the last one's label
                value = subprocess.run(["blkid", "-p", "-s", key, "-o", "value", dev], capture_output=True, text=True)
                if value.stdout.strip():
                    ids[f"{key}={value.stdout.strip()}"] = dev
        for source, where, fstype in _fstab_mounts(root):
            part_dev = ids.get(source)
            if part_dev is None or part_dev == devices[root_part.number]:
                continue
            # the image's fstab is the image's text: its mount point must stay inside the image
            target = safe_join(root, where.lstrip("/"), what="fstab mount point")
            try:
                stack.enter_context(disk.mounted(part_dev, target, log=log))
            except ExternalError:
                if fstype != "vfat":
                    raise
                # an EFI system partition the host kernel cannot mount (no vfat): nothing the roles write goes there
                log(f"not mounted: {where} (this kernel cannot mount vfat; the roles do not write to it)")
        yield root


#: how the inner process's own progress lines start (the rest of its output is the commands')
STATUS = "::image-builder:: "
#: how the inner process says the image was refused as input (it then exits 2)
REFUSED = "refused: "


#: what the child says as it makes a phase's root filesystem again, by the phase's seal mode
_SEALING = {
    "layer": "making the OS layer's root filesystem again from its tree (reproducible)",
    "image": "applying the build's changes to the OS layer's filesystem (reproducible)",
    "whole": "making the root filesystem again from the sealed tree (reproducible)",
}


def _check_arch(root: Path, name: str) -> None:
    """Refuse a source image whose programs are for another architecture than the build's: the playbook would run
    them through whatever emulator the host has and install the build's binaries into a system that cannot run them."""
    want = arch(name)
    found = root_arch(root)
    if found is not None and found != want.name:
        raise InputError(f"its programs are for {found} (/usr/bin/env), and the build is for {want.name}",
                         field="source_image_url", expected=f"a {want.name} source image (image-builder image.base"
                         f" --arch {want.name} makes one)")  # fmt: skip


def _inner(spec_path: Path) -> int:
    """The child of :func:`provision`, in its own mount namespace: for each phase of the spec, attach and mount,
    run its commands, make its root filesystem again when it says so (reproducible images), release."""
    spec = json.loads(spec_path.read_text())
    os.umask(0o022)  # what this process creates in the image (its mount points, a rewritten database) as any system

    def say(text: str) -> None:
        print(STATUS + text, flush=True)

    raw = Path(spec["raw"])
    part = disk.root_partition(raw)
    base: Path | None = None  # the filesystem an image's changes are applied to: its OS layer's
    for phase in spec["phases"]:
        seal = phase.get("seal")
        mode = seal["mode"] if seal else None
        if seal and mode == "image" and base is None:
            Path(seal["work"]).mkdir(parents=True, exist_ok=True)
            base = Path(seal["work"]) / "base.ext4"
            disk.read_partition(raw, part.offset, part.length, base)  # the layer this build was copied from
        devices: dict[int, str] = {}
        rebuilt: Path | None = None
        with attached(raw, Path(spec["root"]), log=say, devices_out=devices) as root:
            _check_arch(root, str(spec.get("arch") or "amd64"))
            with disk.chroot_mounts(root, log=say):
                for command in phase["commands"]:
                    sealing = command[-1] == "--offline"
                    say("sealing the image" if sealing else "running the node playbook in the chroot")
                    if subprocess.run(command, check=False).returncode != 0:
                        return 1
            if seal:
                from imagebuilder.image.reproducible import layer_epoch, rebuild_root

                say(_SEALING[seal["mode"]])
                # a layer's time is its source filesystem's: it is shared by channels whose SOURCE_DATE_EPOCHs differ
                epoch = layer_epoch(devices[part.number]) if mode == "layer" else int(seal["epoch"])
                rebuilt = rebuild_root(raw, part, root, devices[part.number], Path(seal["work"]), epoch=epoch,
                                       seed=str(seal["seed"]), base=base if mode == "image" else None,
                                       log=lambda text: print(text, flush=True))  # fmt: skip
        if rebuilt is not None:
            disk.write_partition(rebuilt, raw, part.offset, part.length)
            if mode == "layer":  # what the next phase's changes are applied to
                base = rebuilt.replace(rebuilt.with_name("base.ext4"))
            else:
                rebuilt.unlink()
        say("unmounted; the filesystem is released")
    if base is not None:
        base.unlink(missing_ok=True)
    return 0


def _inner_main(spec: Path) -> int:
    try:
        return _inner(spec)
    except InputError as exc:
        print(STATUS + REFUSED + str(exc).replace("\n", " "), flush=True)
        return 2


if __name__ == "__main__":
    # asked to stop (the parent stopped following): leave through the clean-ups, which stop the command running in
    # the chroot, unmount and detach, instead of dying with the image attached
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(_inner_main(Path(sys.argv[1])))
