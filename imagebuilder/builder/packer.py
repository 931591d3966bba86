"""Render a build plan into a Packer workspace, and run Packer's own checks on it.

Layout of a rendered build (one directory per build, under the workspace root):

    node.pkr.hcl          the Packer template (from packer/<builder>/node.pkr.hcl.j2)
    http/                 install seed served by Packer's HTTP server (autoinstall user-data or kickstart)
    ssh/id_ed25519(.pub)  a key pair made for this build; the seed authorises it, Packer logs in with it
    ansible-vars.json     node role variables (no secrets)

Secrets never enter these files: the template declares them as ``sensitive`` variables with no default, and
:attr:`RenderedBuild.env` carries them as ``PKR_VAR_*`` environment variables for the Packer process only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.builder.attestations import INVENTORY
from imagebuilder.builder.packer_plugins import PackerInfo, PluginCheck, prepare_plugins, requirements_for
from imagebuilder.core.arch import arch
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.files import atomic_write
from imagebuilder.core.hostinfo import KvmStatus, kvm_status, tool_search_path
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.render import ROOT, template_env
from imagebuilder.core.ssh import keypair
from imagebuilder.customization.model import Customization
from imagebuilder.image import emulation
from imagebuilder.plan.config import BuildExtras, Os3Fields, SourceImageFields
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers import registry
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.manifest import RUNTIME_BINARIES


def builder_for(plan: BuildPlan) -> str:
    """The Packer builder directory (``packer/<builder>/``) of the plan's provider and config."""
    return registry.get(plan.provider).builder_for(plan.config)


#: builders the installed Packer cannot load (a plugin not installable here): validated with -syntax-only
EXTERNAL_ONLY = {"nutanix"}


def prepare_packer(
    plans: Sequence[BuildPlan],
    *,
    packer: str | None = None,
    plugins: Path | None = None,
    install: bool = True,
    say: Say = silent,
) -> PluginCheck | None:
    """The Packer that runs these plans (``--packer PATH``, else ``packer`` on PATH) and the plugins their templates
    require, checked before anything starts; with ``install`` the missing ones are installed (``--packer-plugins
    DIR``, else the mirror's copy, else ``packer init`` unless the build is offline). None when no plan runs
    Packer (the chroot engine)."""
    builders = sorted({builder_for(p) for p in plans if p.engine == "packer"})
    if not builders:
        return None
    mirror = next((p.mirror for p in plans if p.mirror is not None), None)
    offline = any(p.offline for p in plans)
    return packer_check(builders, packer=packer, plugins=plugins, mirror=mirror, offline=offline, install=install,
                        say=say)  # fmt: skip


def packer_check(
    builders: Sequence[str],
    *,
    packer: str | None = None,
    plugins: Path | None = None,
    mirror: Mirror | None = None,
    offline: bool = False,
    install: bool = True,
    say: Say = silent,
) -> PluginCheck:
    """:func:`prepare_packer` for the builder folders themselves (what ``build`` knows before the plan is
    complete: see :func:`imagebuilder.builder.resolve.make_plan`'s ``before_fetch``)."""
    info = PackerInfo.detect(packer)
    return prepare_plugins(info, builders, binaries=plugins, mirror=mirror, offline=offline, install=install, say=say)


@dataclass
class RenderedBuild:
    directory: Path
    template: Path
    builder: str
    #: PKR_VAR_* secrets for the Packer process; never written to disk
    env: dict[str, str] = field(default_factory=dict, repr=False)
    #: ``packer build -only`` stages, run in order (vsphere: base install, then the node clone)
    stages: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()


def build_user(plan: BuildPlan) -> str:
    """The user Packer logs in as (the provider's: ours, or the one a source AMI brings)."""
    return registry.get(plan.provider).build_user


def ansible_vars(plan: BuildPlan) -> dict[str, Any]:
    """Variables of the node playbook. Artifacts come from the plan (mirror-resolved); no secrets."""

    def location(uri: str) -> dict[str, str]:
        if plan.mirror is None:
            return {"url": uri}
        where = plan.mirror.locate(uri)
        return {"src": where} if plan.mirror.is_local else {"url": where}

    # the runtime's own binaries (runc, where containerd's tarball holds none) are staged for the containerd role;
    # the kubernetes role installs the others
    every_binary = [
        {"name": a.name, "sha256": a.sha256 or "", **location(a.uri)} for a in plan.artifacts if a.kind == "binary"
    ]
    binaries = [b for b in every_binary if b["name"] not in RUNTIME_BINARIES]
    archives = [
        {"name": a.name, "sha256": a.sha256 or "", **location(a.uri)} for a in plan.artifacts if a.kind == "archive"
    ]
    images: list[dict[str, Any]] = [
        {
            "name": a.name,
            "ref": a.uri,
            "sha256": a.sha256 or "",
            **({"archive": location(a.archive_uri)} if a.archive_uri else {}),
        }
        for a in plan.artifacts
        if a.kind == "image"
    ]
    # every file the image receives, under the name it is staged as, with the manifest's sha256
    stage: list[dict[str, Any]] = [{"stage": b["name"], **b} for b in every_binary]
    stage += [{"stage": f"{a['name']}.tar.gz", **a} for a in archives]
    stage += [
        {"stage": f"images/{i['name']}.tar", "name": i["name"], "sha256": i["sha256"], **i["archive"]}
        for i in images
        if "archive" in i
    ]
    return {
        "kubernetes_stage_items": stage,
        "node_os": plan.os,
        "node_os_version": plan.os_version.version,
        "node_provider": plan.provider,
        "kubernetes_version": plan.kubernetes_version,
        "kubernetes_release": plan.release_name,
        "kubernetes_binaries": binaries,
        "kubernetes_archives": archives,
        "kubernetes_runtime_binaries": [b["name"] for b in every_binary if b["name"] in RUNTIME_BINARIES],
        "kubernetes_images": images,
        "build_user": build_user(plan),
        "redhat_subscription": plan.os == "redhat",
        "custom_roles": [],
        **_subscription_vars(plan),
        # images the release ships no tarball for are pulled from their registry, which an offline build lacks
        "kubernetes_pull_images": not plan.offline,
        **registry.get(plan.provider).ansible_vars(plan),
    }


def _qemu_machine(plan: BuildPlan, kvm: KvmStatus) -> dict[str, Any]:
    """The QEMU build VM of the plan's architecture: its UEFI firmware (OVMF, or AAVMF for arm64, whose machines boot
    UEFI only), and for a foreign architecture its system emulator, machine and CPU (what ``image.verify`` boots the
    image with: :func:`imagebuilder.image.emulation.machine_args`) under TCG. ``cdrom_interface``: QEMU's ``virt``
    machine has no IDE bus, and its default drive interface (virtio-blk) cannot be a CD-ROM, which cloud-init's seed
    is (a SCSI CD on virtio-scsi is what Packer's own arm64 installs use)."""
    machine = arch(plan.arch)
    ctx: dict[str, Any] = {"ovmf": str(machine.firmware())} if plan.firmware == "efi" else {}
    if machine.native:
        return ctx
    args = emulation.machine_args(machine, kvm)
    options = dict(zip(args[::2], args[1::2], strict=True))
    return {**ctx, "accelerator": "tcg", "qemu_binary": machine.qemu, "machine_type": options["-machine"],
            "qemu_cpu": options.get("-cpu"), "cdrom_interface": "virtio-scsi"}  # fmt: skip


def check_emulator(plan: BuildPlan) -> None:
    """A Packer build VM of another architecture than this host's needs its system emulator and UEFI firmware here
    (exit 1 naming them; the dry run checks the same)."""
    machine = arch(plan.arch)
    if plan.engine != "packer" or machine.native:
        return
    if shutil.which(machine.qemu, path=tool_search_path()) is None:
        raise ExternalError(
            f"{machine.qemu} is not installed: the {machine.name} build VM runs in it",
            hint="run ./scripts/setup.sh (it installs QEMU's system emulators and their firmware)",
        )
    machine.firmware()


#: what a Packer builder folder needs from this host to boot the build VM (QEMU: the firmware of the plan's
#: architecture, and its emulator when that is not this host's); the others render the firmware themselves
#: (vsphere-iso's ``firmware``; a cloned template keeps its own)
BUILDER_MACHINE: dict[str, Callable[[BuildPlan, KvmStatus], dict[str, Any]]] = {"qemu": _qemu_machine}


def _context(
    plan: BuildPlan, directory: Path, packer: PackerInfo, kvm: KvmStatus, source_image: Path | None = None
) -> dict[str, Any]:
    catalog = load_catalog()
    provider = registry.get(plan.provider)
    builder = provider.builder_for(plan.config)
    pair = keypair(directory / "ssh")
    key, public_key = pair.private, pair.public
    config = plan.config
    os_version = plan.os_version
    ctx: dict[str, Any] = {
        "plan": plan,
        "builder": builder,
        "name": plan.output_name,
        "vm_name": plan.output_stem,
        "os": plan.os,
        "os_version": os_version,
        "provider": plan.provider,
        "config": config,
        "vm": {**catalog.build_vm, "disk_gb": plan.disk_gb},
        "disk_format": provider.disk_format,
        "source_image": None,
        "seed_files": [],
        "build_user": provider.build_user,
        "ssh_private_key": str(key),
        "ssh_public_key": public_key,
        "http_directory": str(directory / "http"),
        "output_directory": str(directory / "output"),
        "ansible_playbook": str(ROOT / "ansible" / "node.yml"),
        "ansible_roles_path": str(ROOT / "ansible" / "roles"),
        "ansible_vars_file": str(directory / "ansible-vars.json"),
        "ansible_extra_vars": [],
        "ansible_verbosity": plan.ansible_verbosity,
        "accelerator": kvm.accelerator,
        "qemu_binary": None,
        "qemu_cpu": None,
        "firmware": plan.firmware,
        "boot_command": list(os_version.boot_command_for(plan.firmware)),
        **(BUILDER_MACHINE[builder](plan, kvm) if builder in BUILDER_MACHINE else {}),
        "required_plugins": list(requirements_for([builder])) if packer.has_plugin_blocks else [],
        "secrets": [],
        "manifest_output": str(provider.packer_manifest_path(plan, directory)),
        "stages": (),
    }
    if isinstance(config, Os3Fields) and plan.os == "redhat" and config.enterprise_username:
        ctx["secrets"] += ["enterprise_username", "enterprise_password"]  # a Satellite activation key replaces them
    if isinstance(config, SourceImageFields) and config.uses_source_image:
        # the local, already verified and checked copy when the build fetched it (Packer checks the checksum again)
        url = str(source_image) if source_image else config.source_image_url
        ctx["source_image"] = {"url": url, "checksum": config.source_image_checksum}
        ctx["seed_files"] = [str(directory / "seed" / "meta-data"), str(directory / "seed" / "user-data")]
    elif isinstance(config, Os3Fields) and config.iso_url and config.iso_checksum:
        # the config's ISO: OS-3's always (validation requires it, unless the build clones a template), OS-2's own
        ctx["iso_url"] = config.iso_url
        ctx["iso_checksum"] = f"{config.iso_checksum_type or 'sha256'}:{config.iso_checksum}"
    elif plan.os != "redhat":
        ctx["iso_url"] = os_version.iso_url
        ctx["iso_checksum"] = os_version.iso_checksum
    provider.packer_context(plan, ctx)
    return ctx


#: the build VM's proxy environment, as JSON in the Ansible controller's environment (node.yml reads it)
BUILD_PROXY_ENV = "IMAGE_BUILDER_BUILD_PROXY"
#: the Satellite activation key, in the Ansible controller's environment (the redhat_subscription role reads it)
ACTIVATION_KEY_ENV = "RHSM_ACTIVATION_KEY"


def _secret_env(plan: BuildPlan) -> dict[str, str]:
    """What the Packer process (and the ansible-playbook it starts) gets in its environment and nowhere else."""
    config = plan.config
    env: dict[str, str] = {}
    if isinstance(config, BuildExtras):
        proxies = config.proxies()
        env.update(proxies)  # Packer's own downloads and the controller's
        if proxies:
            env[BUILD_PROXY_ENV] = json.dumps(proxies)
        if plan.os == "redhat" and config.rhsm_activation_key is not None:
            env[ACTIVATION_KEY_ENV] = config.rhsm_activation_key.get_secret_value()
    if isinstance(config, Os3Fields) and plan.os == "redhat" and config.enterprise_username:
        assert config.enterprise_password
        env["PKR_VAR_enterprise_username"] = config.enterprise_username
        env["PKR_VAR_enterprise_password"] = config.enterprise_password.get_secret_value()
    return {**env, **registry.get(plan.provider).secret_env(plan)}


def _subscription_vars(plan: BuildPlan) -> dict[str, Any]:
    """How the build registers with Red Hat: a user (RHSM_USERNAME) or a Satellite activation key."""
    config = plan.config
    if plan.os != "redhat" or not isinstance(config, BuildExtras):
        return {}
    return {
        "redhat_subscription_method": "activation_key" if config.uses_activation_key else "username",
        "redhat_subscription_org_id": config.rhsm_org_id or "",
        "redhat_subscription_server": config.rhsm_server_hostname or "",
        "redhat_subscription_release": config.rhsm_server_release_version or "",
    }


def _write(path: Path, text: str, perm: int = 0o644) -> Path:
    with atomic_write(path, perm=perm) as fh:
        fh.write(text)
    return path


def effective_customization(plan: BuildPlan, customization: Customization | None) -> Customization | None:
    """What the customize role applies: the config's build options (the reference tool's extra packages,
    repositories and files) and ``build --customize``'s file, through one role."""
    return plan.extras.merged(customization) if plan.extras is not None else customization


def check_buildable(plan: BuildPlan) -> None:
    """What a real build needs beyond a valid plan: the node artifacts (a resolved release manifest, and the
    runtime's files where they come from upstream)."""
    if not plan.artifacts:
        raise InputError(
            "the release manifest is not resolved, so the node artifacts are unknown",
            field="--release-manifest",
            expected="a reachable manifest, --mirror DIR|URL, or --release-manifest PATH",
        )
    if plan.runtime.unresolved:
        raise ExternalError(
            f"the container runtime's files are unknown: {plan.runtime.unresolved}",
            hint="a mirror made by mirror.create carries them (--mirror DIR|URL), or build with --runtime os",
        )


def node_vars(
    plan: BuildPlan, directory: Path, customization: Customization | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The node playbook's variables (no secrets) and what the customize role needs in the controller's
    environment (its secrets), for either engine. ``directory`` is the build's workspace."""
    customization = effective_customization(plan, customization)
    # the sbom role hands the image's package database to this host there (build/attestations.py)
    role_vars = {**ansible_vars(plan), "artifact_cache": str(directory / "artifacts"),
                 "sbom_inventory": str(directory / INVENTORY)}  # fmt: skip
    secret_env: dict[str, str] = {}
    if customization is not None:  # build --customize: the same role as template.customize, before sysprep
        role_vars.update(customization.role_vars(user=role_vars["build_user"]))
        role_vars["custom_roles"] = [*role_vars["custom_roles"], "customize"]
        secret_env.update(customization.secret_env())
    return role_vars, secret_env


def controller_env(plan: BuildPlan) -> dict[str, str]:
    """What ansible-playbook needs in its environment when no Packer runs it (the chroot engine): the proxies, the
    activation key, and the Red Hat user under the names the role reads (Packer passes those as PKR_VAR_*)."""
    env = {k: v for k, v in _secret_env(plan).items() if not k.startswith("PKR_VAR_")}
    config = plan.config
    if isinstance(config, Os3Fields) and plan.os == "redhat" and config.enterprise_username:
        assert config.enterprise_password
        env["RHSM_USERNAME"] = config.enterprise_username
        env["RHSM_PASSWORD"] = config.enterprise_password.get_secret_value()
    return env


def render_build(
    plan: BuildPlan,
    directory: Path,
    packer: PackerInfo,
    *,
    kvm: KvmStatus | None = None,
    require_artifacts: bool = True,
    source_image: Path | None = None,
    customization: Customization | None = None,
    playbook: Path | None = None,
) -> RenderedBuild:
    """Render every file of a Packer build into ``directory``.

    ``require_artifacts`` is False only for linting: a real build needs the release manifest resolved.
    ``source_image`` is the local copy of a fetched source image (see :func:`runner.prepare_source_image`).
    ``playbook`` replaces ``ansible/node.yml`` (a hardened build's: the node's, with the remediation inside).
    """
    if require_artifacts:
        check_buildable(plan)
    check_emulator(plan)
    kvm = kvm or kvm_status()
    provider = registry.get(plan.provider)
    directory.mkdir(parents=True, exist_ok=True)
    ctx = _context(plan, directory, packer, kvm, source_image)
    if playbook is not None:
        ctx["ansible_playbook"] = str(playbook)
    env = template_env()
    files: list[Path] = []

    if ctx["source_image"]:
        # a cloud-style disk image: cloud-init reads this NoCloud seed from a CD labelled cidata
        files.append(_write(directory / "seed" / "meta-data", f"instance-id: {plan.output_name}\n"))
        files.append(
            _write(directory / "seed" / "user-data", env.get_template("cloud-init/build-user-data.yaml.j2").render(ctx))
        )
    elif provider.http_seed:
        if plan.pair.os.install == "kickstart":
            ks = env.get_template("templates/kickstart/redhat.ks.j2").render(ctx)
            files.append(_write(directory / "http" / "ks.cfg", ks))
        else:
            files.append(
                _write(directory / "http" / "user-data", env.get_template("cloud-init/autoinstall.yaml.j2").render(ctx))
            )
            files.append(_write(directory / "http" / "meta-data", f"instance-id: {plan.output_name}\n"))
    if provider.inline_user_data:
        ctx["user_data"] = env.get_template("cloud-init/build-user-data.yaml.j2").render(ctx)
    role_vars, secret_env = node_vars(plan, directory, customization)
    secret_env = {**_secret_env(plan), **secret_env}
    files.append(_write(directory / "ansible-vars.json", json.dumps(role_vars, indent=2) + "\n"))
    template = _write(
        directory / "node.pkr.hcl", env.get_template(f"packer/{ctx['builder']}/node.pkr.hcl.j2").render(ctx)
    )
    files.append(template)
    (directory / "http").mkdir(exist_ok=True)
    return RenderedBuild(directory, template, ctx["builder"], secret_env, ctx["stages"], tuple(files))


def packer_env(rendered: RenderedBuild) -> dict[str, str]:
    """Environment of a Packer child: ours plus the build's secrets, with the venv's ansible on PATH."""
    env = dict(os.environ)
    env["PATH"] = tool_search_path()
    env["PACKER_NO_COLOR"] = "1"
    env["CHECKPOINT_DISABLE"] = "1"
    env.update(rendered.env)
    return env


def validate(rendered: RenderedBuild, packer: PackerInfo) -> subprocess.CompletedProcess[str]:
    """``packer validate`` (``-syntax-only`` for builders the installed Packer cannot load)."""
    args = [packer.path, "validate"]
    if rendered.builder in EXTERNAL_ONLY and not packer.has_plugin_blocks:
        args.append("-syntax-only")
    args.append(rendered.template.name)
    return subprocess.run(
        args, cwd=rendered.directory, env=packer_env(rendered), capture_output=True, text=True, timeout=300, check=False
    )


def fmt_check(path: Path, packer: PackerInfo) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [packer.path, "fmt", "-check", "-diff", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
