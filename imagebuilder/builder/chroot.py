"""``build --engine chroot``: an image-based build without a VM.

Why: a build from a cloud-style disk image spends most of its time booting that image under QEMU so that Ansible
can reach it over SSH, and without usable KVM (most CI runners and containers) QEMU emulates every instruction.
The image does not need to run to be provisioned: like diskimage-builder and mkosi, this engine mounts it on the
build host and runs the same playbook and roles through Ansible's chroot connection. ``image.verify`` then proves
the result by booting it once.

What it does, in order, in the build's workspace (its working disk in memory when the whole disk fits there:
:func:`imagebuilder.core.disk.scratch_dir`):

1. the source image (already fetched, verified and checked by the runner) is converted to a sparse raw disk and
   grown to the plan's disk size (Packer's ``disk_size`` and cloud-init's growpart do the same in a VM build);
2. its root partition is attached on a loop device at the partition's offset (no nbd, no partition nodes, no
   udev), its filesystem grown, and mounted; the other partitions its fstab mounts are mounted below it;
3. /proc, /sys, /dev, /run and /tmp are provided for the run (:func:`imagebuilder.core.disk.chroot_mounts`: /proc/sys
   and /sys read-only, a private /dev, tmpfs /run and /tmp, policy-rc.d, the host's resolv.conf for the run only);
4. ansible-playbook runs ``ansible/node.yml`` with ``community.general.chroot``; every command it starts in the
   chroot goes through a wrapper that clears the environment, so nothing of the build host's environment (its
   PATH, the build's secrets) reaches a process in the image; secrets reach the controller only, as with Packer;
5. the image is sealed (the seal script Packer runs as its shutdown command, with ``--offline``), everything is
   stopped and unmounted for real, the filesystem checked, and the disk converted to the provider's format where
   the provider's packaging step expects Packer's output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from imagebuilder.builder.chroot_mounts import REFUSED, STATUS
from imagebuilder.builder.packer import controller_env, node_vars
from imagebuilder.core import disk
from imagebuilder.core.arch import arch
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, run_checked
from imagebuilder.core.hostinfo import require_tools, tool_search_path
from imagebuilder.core.progress import Say, follow
from imagebuilder.core.render import ROOT
from imagebuilder.core.untrusted import Redactor
from imagebuilder.customization.model import Customization
from imagebuilder.hardening.run import Hardening
from imagebuilder.image.gzipdisk import Base, MemberStore
from imagebuilder.image.reproducible import TOOLS as REPRODUCIBLE_TOOLS
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers import registry

#: what the engine runs on the build host
TOOLS = ("losetup", "mount", "umount", "chroot", "qemu-img", "sfdisk", "e2fsck", "resize2fs", "dumpe2fs", "blkid",
         "env", *REPRODUCIBLE_TOOLS)  # fmt: skip
#: Ansible's chroot connection (the collection ships with the ``ansible`` package)
CONNECTION = "community.general.chroot"
#: the environment every process in the chroot starts with: nothing of the build host's
CLEAN_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
             "TERM=dumb", "DEBIAN_FRONTEND=noninteractive")  # fmt: skip
SEAL = "/usr/local/sbin/image-builder-seal"


@dataclass(frozen=True)
class Reproducible:
    """What makes a chroot build's image the same bytes on every run: SOURCE_DATE_EPOCH and the filesystem's hash
    seed (from its OS layer's inputs). ``layered``: the image is its OS layer's filesystem with the build's changes
    applied (``build.matrix``'s images, which share their layer's blocks), not its whole tree laid out afresh (a
    single build's); a rebuild of either gives the same bytes."""

    epoch: int
    seed: str
    layered: bool = False


@dataclass(frozen=True)
class OsLayer:
    """A cached OS layer (:mod:`imagebuilder.builder.matrix`) a chroot build starts from instead of its source image.

    ``image`` is the qcow2 in the layer cache that names it; ``disk`` is the file a build copies: the layer's raw
    twin while the run that made it still has one (no conversion on the way), else ``image`` itself. The images
    built on one layer share its :class:`~imagebuilder.image.gzipdisk.MemberStore` when they are compressed."""

    image: Path
    disk: Path
    #: the raw twin's key of each MiB, learnt as its members are made (None once only the qcow2 is left)
    base: Base | None = field(default=None, compare=False)
    #: the Ansible facts the layer's run gathered (Ansible's jsonfile cache), while that run's files are there
    facts: Path | None = field(default=None, compare=False)

    @property
    def members(self) -> MemberStore:
        return MemberStore.beside(self.image)

    @property
    def disk_format(self) -> str:
        """What ``disk`` is, told to qemu-img rather than guessed from the bytes (a raw disk can look like anything)."""
        return "qcow2" if self.disk == self.image else "raw"


def check_engine(machine: str = "amd64") -> None:
    """What the chroot engine needs of this host to build a ``machine`` image (the dry run checks the same): root,
    the tools, the connection, and for another architecture than this host's, its programs run by qemu-user."""
    if os.geteuid() != 0:
        raise ExternalError("--engine chroot needs root (loop devices, mount, chroot)", hint="run it as root")
    require_tools(*TOOLS, "ansible-playbook")
    arch(machine).require_emulation()
    if importlib.util.find_spec("ansible_collections.community.general.plugins.connection.chroot") is None:
        raise ExternalError(
            f"Ansible's {CONNECTION} connection is not installed",
            hint="run ./scripts/setup.sh (installs the ansible package, which carries community.general)",
        )


def _chroot_wrapper(directory: Path) -> Path:
    """The ``chroot`` Ansible runs: the real one, with an environment (and umask) that holds nothing of the build
    host's."""
    chroot = shutil.which("chroot", path=tool_search_path()) or "/usr/sbin/chroot"
    path = directory / "chroot-clean-env"
    with atomic_write(path, perm=0o755) as fh:
        # umask 022 as on a booted system: the build host's umask (077 on a hardened one) must not become the
        # image's file modes (reproducible builds found /etc/machine-id 0600 and /etc/cni 0700 from a 077 host)
        fh.write(f'#!/bin/sh\numask 022\nexec /usr/bin/env -i {" ".join(CLEAN_ENV)} {chroot} "$@"\n')
    return path


def _playbook(plan: BuildPlan, root: Path, directory: Path, customization: Customization | None,
              layers: tuple[str, ...], facts: Path | None = None) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The ansible-playbook command that provisions the image mounted at ``root``, and its environment (the
    controller's: secrets live only there). Its files (variables, inventory, the clean-environment chroot, the
    facts Ansible gathers) are written into ``directory``; none holds a secret. ``facts`` are those an earlier
    run gathered on the OS layer this image was copied from: the same OS, so they are not gathered again."""
    cache = directory / "facts"
    if facts is not None and facts.is_dir():
        shutil.copytree(facts, cache, dirs_exist_ok=True)  # a copy: runs on one layer never share a file
    role_vars, secret_env = node_vars(plan, directory, customization)
    role_vars["node_layers"] = list(layers)
    variables = directory / f"ansible-vars-{'-'.join(layers)}.json"  # a file per phase (reproducible builds)
    with atomic_write(variables) as fh:
        fh.write(json.dumps(role_vars, indent=2) + "\n")
    inventory = {
        "all": {
            "hosts": {
                "image": {
                    "ansible_connection": CONNECTION,
                    "ansible_host": str(root),
                    "ansible_chroot_exe": str(_chroot_wrapper(directory)),
                    "ansible_python_interpreter": "auto_silent",
                    # Ansible's own files go to the chroot's tmpfs /tmp, never into the image
                    "ansible_remote_tmp": "/tmp/.ansible-tmp",  # noqa: S108 (the chroot's own tmpfs)
                    # root already: no sudo in the image for each task
                    "ansible_become": False,
                }
            }
        }
    }
    with atomic_write(directory / "inventory.json") as fh:
        fh.write(json.dumps(inventory, indent=2) + "\n")
    args = [
        shutil.which("ansible-playbook", path=tool_search_path()) or "ansible-playbook",
        "-i", str(directory / "inventory.json"),
        "--extra-vars", f"@{variables}",
        *(["-" + "v" * plan.ansible_verbosity] if plan.ansible_verbosity else []),
        str(ROOT / "ansible" / "node.yml"),
    ]  # fmt: skip
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "PATH": tool_search_path(),
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_LOCAL_TEMP": str(directory / "ansible-local"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        # facts are kept beside the run; a run on a copy of an OS layer finds the layer's and does not gather
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "0",
        "ANSIBLE_GATHERING": "smart",
        **controller_env(plan),
        **secret_env,
    }
    return args, env


def provision(
    plan: BuildPlan,
    raw: Path,
    directory: Path,
    *,
    customization: Customization | None,
    log: IO[str],
    redact: Redactor,
    status: Say,
    layers: tuple[str, ...] = ("os", "kubernetes"),
    facts: Path | None = None,
    reproducible: Reproducible | None = None,
    hardening: Hardening | None = None,
) -> None:
    """Mount ``raw``, run the node playbook in it (and the seal script when the build ends here), unmount; with
    ``reproducible``, the sealed root filesystem is made again from its tree (:mod:`imagebuilder.image.reproducible`).

    All of it runs in a child process in a mount namespace of its own (``unshare --mount``, private
    propagation): the image's mounts exist nowhere else, so a mount namespace that another program creates on this
    host meanwhile (a container, a service with PrivateTmp, ``ip netns exec``) cannot take a copy that keeps the
    filesystem mounted, and unclean, after the build unmounted it; and if the child dies, the kernel releases every
    mount with its namespace."""
    root = directory / "root"
    seal_command = [str(_chroot_wrapper(directory)), str(root), SEAL, "--offline"]
    work = str(directory / "reproducible")
    phases: list[dict[str, Any]] = []
    # a layered image is its OS layer's filesystem (laid out afresh from the layer's tree) with the build's own
    # changes applied to it (imagebuilder.image.fsdelta); rebuilt without the layer's cache, the OS part runs, and is
    # sealed, as a phase of its own first. A single build's image is its whole tree laid out afresh.
    split = reproducible is not None and reproducible.layered and "os" in layers and "kubernetes" in layers
    for part in (("os",), ("kubernetes",)) if split else (layers,):
        args, env = _playbook(plan, root, directory, customization, part, facts)
        commands = [args, seal_command] if "kubernetes" in part else [args]
        if hardening is not None and "kubernetes" in part:  # the image's part: its OS layer stays as it was
            # node.yml's two parts with the remediation between them: the SBOM lists what it installed, sysprep
            # seals it too
            ansible = ROOT / "ansible"
            commands = [[*args[:-1], str(ansible / "node-provision.yml")], hardening.command(root, args),
                        [*args[:-1], str(ansible / "node-finish.yml")], seal_command]  # fmt: skip
        seal = None
        if reproducible is not None:
            mode = "layer" if "kubernetes" not in part else "image" if "os" not in part else "whole"
            seal = {"mode": mode, "epoch": reproducible.epoch, "seed": reproducible.seed, "work": work}
        phases.append({"commands": commands, "seal": seal})
    spec = directory / "chroot-run.json"
    with atomic_write(spec) as fh:
        json.dump({"raw": str(raw), "root": str(root), "arch": plan.arch, "phases": phases}, fh)
    unshare = shutil.which("unshare", path=tool_search_path()) or "unshare"
    inner = [
        unshare,
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "imagebuilder.builder.chroot_mounts",
        str(spec),
    ]
    mark = STATUS.strip()
    refused: list[str] = []

    def pick(text: str) -> str | None:
        if text.startswith(mark + " " + REFUSED):
            refused.append(text.removeprefix(mark + " " + REFUSED))
        if text.startswith(mark):
            return text.removeprefix(mark).strip()
        return text if "TASK [" in text or "PLAY [" in text else None

    try:
        code = follow(inner, env=env, log=log, redact=redact, say=status, pick=pick)
    finally:
        # the child's mounts died with its namespace; its loop devices are the kernel's and outlive it if it was
        # killed before it could detach them
        for dev in disk.detach_backing(raw):
            log.write(f"detached {dev}, which the chroot build left attached\n")
    if code == 2 and refused:  # the image itself is the bad input (e.g. its fstab)
        raise InputError(f"the source image cannot be provisioned: {refused[-1]}", field="source_image_url")
    if code != 0:
        raise ExternalError(
            f"the chroot build failed (exit {code}); see {log.name}",
            hint="read the log's last lines; rerun with --keep-on-error to keep the workspace for inspection",
        )


def prepare_disk(source: Path, raw: Path, size_gb: int, status: Say, *, source_format: str | None = None) -> None:
    """``source`` (any format qemu-img reads, or ``source_format``) as a sparse raw disk of ``size_gb`` GiB at
    ``raw``: a scratch file of the workspace, so qemu-img does not flush it to the device (``-t unsafe``); what is
    made of it is."""
    status(f"converting the source image to a raw disk of {size_gb} GiB")
    raw.parent.mkdir(parents=True, exist_ok=True)
    if source_format == "raw":  # an OS layer's raw twin: copied extent by extent, within the kernel where it can be
        disk.copy_sparse(source, raw)
    else:
        fmt = ["-f", source_format] if source_format else []
        run_checked("qemu-img", "convert", "-t", "unsafe", *fmt, "-O", "raw", str(source), str(raw))
    disk.grow_last_partition(raw, size_gb * 1024**3, log=status)


def finish_disk(raw: Path, dest: Path, disk_format: str, status: Say) -> Path:
    """The sealed raw disk as ``dest`` in ``disk_format`` (raw: moved; others converted)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if disk_format == "raw":
        os.replace(raw, dest)
    else:
        status(f"converting the disk to {disk_format}")
        run_checked("qemu-img", "convert", "-O", disk_format, str(raw), str(dest))
        raw.unlink()
    return dest


def run_chroot_build(
    plan: BuildPlan,
    source: Path,
    directory: Path,
    *,
    customization: Customization | None,
    log: IO[str],
    redact: Redactor,
    status: Say,
    layers: tuple[str, ...] = ("os", "kubernetes"),
    output: Path | None = None,
    output_format: str | None = None,
    source_format: str | None = None,
    facts: Path | None = None,
    reproducible: Reproducible | None = None,
    hardening: Hardening | None = None,
) -> Path:
    """Build ``plan`` from ``source`` (of ``source_format`` where the caller knows it) in ``directory`` without a
    VM; returns the disk, written where the provider's packaging step finds Packer's (``directory/output/<vm
    name>``) unless ``output`` says otherwise. ``facts`` are the Ansible facts of the OS layer ``source`` is
    (:attr:`OsLayer.facts`)."""
    check_engine(plan.arch)
    raw = directory / "disk.raw"
    prepare_disk(source, raw, plan.disk_gb, status, source_format=source_format)
    if hardening is not None:
        hardening.prepare(raw, directory, status)
    status("attaching the image (loop devices) and mounting it")
    provision(plan, raw, directory, customization=customization, log=log, redact=redact, status=status,
              layers=layers, facts=facts, reproducible=reproducible, hardening=hardening)  # fmt: skip
    provider = registry.get(plan.provider)
    dest = output or directory / "output" / plan.output_stem
    return finish_disk(raw, dest, output_format or provider.disk_format, status)
