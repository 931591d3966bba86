"""Make a build plan: every input of ``image-builder build`` resolved and validated, before anything runs.

Building the plan touches nothing but the config files and, when reachable, the release manifest, so a user learns
in seconds what a 40-minute build would do. What the build does on its provider comes from the provider.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

from imagebuilder.core.arch import ARCH_NAMES, check_arch
from imagebuilder.core.arch import arch as arch_facts
from imagebuilder.core.errors import ExternalError, InputError, did_you_mean, require_flags
from imagebuilder.core.fetch import Mirror, is_url
from imagebuilder.core.paths import workspace_root
from imagebuilder.plan.config import (
    BuildExtras,
    ConfigContext,
    ProviderConfig,
    SourceImageFields,
    load_provider_config,
)
from imagebuilder.plan.model import BuildPlan, BuildRequest, ManifestState, RuntimePlan
from imagebuilder.providers import registry
from imagebuilder.providers.base import SUBSCRIPTION, SYSPREP
from imagebuilder.release.catalog import CONTAINERD_2_FROM_MINOR, ReleaseChannel, load_catalog, runtime_problem
from imagebuilder.release.manifest import NodeArtifact, ReleaseManifest, load_manifest
from imagebuilder.release.product import Pinned, flag, pinned_for
from imagebuilder.release.profile import load_profile

#: how long a dry run waits for the upstream manifest before planning without it
MANIFEST_TIMEOUT = 1.5

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _artifact_name(
    plan_os: str,
    version: str,
    release: int,
    extension: str,
    override: str | None,
    distro: str | None = None,
    arch: str = ARCH_NAMES[0],
) -> str:
    if override is not None:
        base = override.removesuffix(extension) if extension else override
        if not _NAME.fullmatch(base):
            raise InputError(
                f"'{override}' is not a usable image name",
                field="--name",
                expected="letters, digits, '.', '_' and '-', starting with a letter or digit",
            )
        return base + extension
    template = load_catalog().artifact_name
    return (
        template.format(
            os=plan_os,
            kubernetes_version=version,
            distro=distro or load_profile().distro.name,
            release=release,
            arch=arch,
        )
        + extension
    )


ENGINES = ("packer", "chroot", "auto")


def image_based(provider: str, config: ProviderConfig | None) -> bool:
    """Whether the build starts from a disk image it can provision without booting (a QEMU build from a
    ``source_image_url``), rather than an ISO install or a platform's VM."""
    builder = registry.get(provider).builder_for(config)
    return builder == "qemu" and isinstance(config, SourceImageFields) and config.uses_source_image


def choose_engine(
    requested: str | None, provider: str, config: ProviderConfig | None, arch: str = ARCH_NAMES[0]
) -> tuple[str, str]:
    """(engine, why) for ``--engine``: packer by default; chroot only for image-based builds; auto picks chroot
    for those when KVM is unusable here (QEMU would emulate every instruction) or the image is not amd64 (its
    default: a foreign machine is emulated by either engine, and the chroot engine emulates far less), and packer
    otherwise."""
    from imagebuilder.core.hostinfo import kvm_status

    # another architecture than amd64 is emulated on this project's hosts: the chroot engine runs only the image's
    # programs under qemu-user, where Packer's VM emulates a whole machine (minutes against tens of minutes)
    engine = requested or ("packer" if arch == ARCH_NAMES[0] else "auto")
    if engine not in ENGINES:
        raise InputError(
            f"{engine[:40]!r} is not one of them{did_you_mean(engine, ENGINES)}",
            field="--engine",
            expected=" or ".join(ENGINES),
        )
    if engine == "packer":
        return "packer", "--engine packer" if requested else "the default"
    if not image_based(provider, config):
        if engine == "auto":
            return "packer", "auto: this build installs from an ISO or runs on its platform, which needs a VM"
        raise InputError(
            f"--engine chroot provisions a disk image without a VM; this {provider} build installs from an ISO or"
            " runs on its platform, which needs one",
            field="--engine",
            expected="packer or auto here; chroot with a source_image_url (bare metal, the local OVA)",
        )
    if engine == "chroot":
        return "chroot", "--engine chroot"
    if arch != ARCH_NAMES[0]:
        why = f"{arch} machines are emulated here: the chroot engine emulates only their programs"
        return "chroot", f"auto: the build starts from a disk image, and {why}"
    kvm = kvm_status()
    if kvm.usable:
        return "packer", f"auto: KVM is usable ({kvm.reason})"
    return "chroot", f"auto: the build starts from a disk image and KVM is unusable ({kvm.reason})"


def _steps(plan: BuildPlan) -> list[str]:
    install = "kickstart" if plan.pair.os.install == "kickstart" else "cloud-init seed"
    provider_steps = registry.get(plan.provider).steps(plan)
    if plan.engine == "chroot":
        render = f"render the Ansible variables and inventory into {plan.workspace}/<build-id>"
        # the provider's first step is its Packer builder's; the chroot engine does that part
        provider_steps[0] = (
            f"chroot: the source image as a {plan.disk_gb} GiB raw disk on loop devices, mounted, provisioned by"
            " Ansible's chroot connection (no VM; services enabled, not started)"
        )
    else:
        render = f"render the Packer template, {install} and Ansible variables into {plan.workspace}/<build-id>"
    steps = [
        "preflight: host OS, architecture, CPUs, memory, disk, tools, /dev/kvm (spec 4.3, 8)",
        render,
        *provider_steps,
    ]
    config = plan.config if isinstance(plan.config, BuildExtras) else None
    if config is not None and (config.http_proxy or config.https_proxy):
        proxies = ", ".join(f"{k}={v}" for k, v in config.public_dict().items() if k.endswith("_proxy") and v)
        steps.insert(2, f"proxy for Packer, Ansible and the build VM (not kept in the image): {proxies}")
    if config is not None and config.uses_activation_key:
        where = config.rhsm_server_hostname or "the Red Hat CDN"
        steps = [
            f"register with Satellite {where} (org {config.rhsm_org_id}, activation key); unregister before sealing"
            if s == SUBSCRIPTION
            else s
            for s in steps
        ]
    if plan.extras is not None:
        e = plan.extras.summary()
        detail = [
            f"sources {e['repositories'] or 'as configured'}, public {e['public_repositories']}",
            f"packages {' '.join(e['packages']) or 'none'}",
            f"files {', '.join(e['files']) or 'none'}",
        ]
        at = next((i for i, s in enumerate(steps) if s == SYSPREP), len(steps))
        steps.insert(at, "build options through the customize role: " + "; ".join(detail))
    if config is not None and (config.eksa_build_tooling_repo_url or config.image_builder_repo_url):
        steps.append("eksa_build_tooling_repo_url/image_builder_repo_url: not cloned (this tool ships its templates)")
    if plan.hardening is not None:
        h = plan.hardening
        at = next((i for i, s in enumerate(steps) if s == SYSPREP), len(steps))
        steps.insert(
            at,
            f"hardening: the {h.profile} remediation, tailored for a Kubernetes node, "
            + ("in the chroot" if plan.engine == "chroot" else "by Packer's Ansible, in the build VM")
            + " (the content's product read from the source image's os-release, or the OS an ISO installs)",
        )
        steps.insert(
            at + 2,
            f"scan the finished image with OpenSCAP (read-only, offline): {h.min_pass:g}% of the"
            " applicable rules must pass; ARF, HTML report and summary beside the image",
        )
    if plan.output_path is not None:
        steps.append(
            f"write {plan.output_name}.sha256 and the build manifest (inputs without secrets, tool versions, checksums)"
        )
    return steps


def _unreachable(exc: ExternalError) -> str:
    """Why a document could not be fetched, in a few words (the fetcher's message's last part: "HTTP 404 ...",
    "Name or service not known"): what a plan notes for what it could not resolve."""
    return str(exc).splitlines()[0].rsplit(": ", 1)[-1]


def _load_manifest_for(
    request: BuildRequest, channel: ReleaseChannel, mirror: Mirror | None, arch: str
) -> tuple[ReleaseManifest | None, ManifestState]:
    if request.release_manifest:
        if request.offline and mirror is None and is_url(request.release_manifest):
            raise InputError("is a URL, and --offline reads nothing from the network", field="--release-manifest",
                             expected="the manifest as a file, a --mirror that holds it, or no --offline")  # fmt: skip
        manifest = load_manifest(request.release_manifest, mirror, arch=arch)
        if manifest.channel != channel.name:
            raise InputError(
                f"spec.channel is {manifest.channel}, but --release-channel is {channel.name}",
                source=manifest.source,
                field="spec.channel",
                expected=f"a manifest of channel {channel.name}",
            )
        return manifest, ManifestState(
            manifest.source, True, sha256=manifest.sha256, upstream=request.release_manifest, date=manifest.date
        )
    url = channel.manifest_url
    location = mirror.locate(url) if mirror else url
    if mirror is None and request.offline:
        return None, ManifestState(url, False, "not resolved offline (--offline)")
    try:
        manifest = load_manifest(url, mirror, timeout=MANIFEST_TIMEOUT, arch=arch)
    except ExternalError as exc:
        return None, ManifestState(location, False, f"not resolved offline ({_unreachable(exc)})")
    return manifest, ManifestState(manifest.source, True, sha256=manifest.sha256, upstream=url, date=manifest.date)


#: what a caller checks once the plan's Packer builder is known and before the release manifest is fetched: the
#: builder folder, the mirror and whether the build is offline (``build`` checks Packer's plugins there)
BeforeFetch = Callable[[str, Mirror | None, bool], None]


def make_plan(request: BuildRequest, *, before_fetch: BeforeFetch | None = None) -> BuildPlan:
    """Resolve and validate every input of a build; raises :class:`InputError` (exit 2) on any bad input.
    ``before_fetch`` runs for a Packer build once its builder is known, before anything is downloaded."""
    catalog = load_catalog()
    require_flags(("--os", request.os), ("--hypervisor", request.hypervisor),
                  ("--release-channel", request.release_channel))  # fmt: skip
    assert request.os and request.hypervisor and request.release_channel
    os_ = catalog.os(request.os)
    provider = catalog.provider(request.hypervisor)
    channel = catalog.channel(request.release_channel)
    pair = catalog.build_pair(os_, provider)
    arch = check_arch(request.arch or ARCH_NAMES[0])
    pair.check_built_for(arch)
    os_version = os_.version_for(request.os_version or channel.default_os_version(os_), provider.name)
    channel.check_os_version(os_.name, os_version.version)
    firmware = os_.firmware_for(request.firmware, provider.name)
    if not arch_facts(arch).bios and firmware != "efi":
        raise InputError(f"{arch} machines boot by UEFI only", field="--firmware", expected=f"efi (or none: {arch}"
                         " images are UEFI images)")  # fmt: skip

    for name, path in request.configs.items():
        if name != provider.name and path:
            other = catalog.providers[name]
            hint = f"; use {provider.config_flag}" if pair.config else ""
            raise InputError(
                f"is for {other.name} builds, but --hypervisor is {provider.name}{hint}", field=other.config_flag
            )
    config_path = request.configs.get(provider.name) or None
    config: ProviderConfig | None = None
    if config_path is None and pair.config == "required":
        raise InputError(
            f"{os_.name} on {provider.name} needs a config file",
            field=provider.config_flag,
            expected=f"{provider.config_flag} PATH (examples in config/examples/)",
        )
    if config_path is not None:
        ctx = ConfigContext(os=os_.name, os_version=os_version, source=Path(config_path))
        config = load_provider_config(registry.get(provider.name).config_model, config_path, ctx)

    mirror = Mirror.parse(request.mirror) if request.mirror else None
    extras_config = config if isinstance(config, BuildExtras) else None
    private = extras_config.private_artifacts_eksd_fqdn if extras_config else None
    if private and mirror:
        raise InputError(
            "private_artifacts_eksd_fqdn and --mirror both name where the artifacts come from",
            field="--mirror",
            expected="one of them",
        )
    if private:
        mirror = Mirror.parse(private, "private_artifacts_eksd_fqdn")  # the reference's air-gapped host is a mirror
    files_config = Path(request.files_config) if request.files_config else None  # the CLI checked it exists
    if files_config and extras_config and extras_config.additional_files_list_file:
        raise InputError(
            "--files-config and additional_files_list_file both name the additional files",
            field="--files-config",
            expected="one of them",
        )
    # a build without a config file (ubuntu on bare metal) may still bring --files-config
    source = Path(config_path) if config_path else (files_config or Path("."))
    extras = (extras_config or BuildExtras()).customization(os_.name, source, files_config)
    disk_gb = catalog.build_vm["disk_gb"] if request.disk_gb is None else request.disk_gb
    if not 4 <= disk_gb <= 2048:
        raise InputError(f"{disk_gb} GiB is not a usable disk size", field="--disk-gb", expected="4 to 2048")
    engine, engine_reason = choose_engine(request.engine, provider.name, config, arch)
    if request.hardening is not None and engine == "packer" and not registry.get(provider.name).disk_comes_here(config):
        # the scan that proves the hardening reads the finished disk; this platform keeps it
        here = [name for name, p in registry.PROVIDERS.items() if p.disk_comes_here(None)]
        raise InputError(f"--hardening proves the image by scanning its finished disk on this host, and a"
                         f" {provider.name} build leaves its disk on the platform", field="--hardening",
                         expected=f"a {' or '.join(here)} build (their disks come here), or no --hardening; then"
                         " image.verify --hardening on the disk exported from the platform")  # fmt: skip
    if before_fetch is not None and engine == "packer":
        before_fetch(registry.get(provider.name).builder_for(config), mirror, request.offline)
    pinned: Pinned | None = None
    if request.eksa_release:
        if request.release_manifest:
            raise InputError(
                f"{flag()} and --release-manifest both choose the release manifest",
                field=flag(),
                expected="one of them",
            )
        if request.offline and mirror is None:
            raise InputError(
                f"{flag()} reads the product's release index: offline, it needs a mirror that holds it",
                field=flag(),
                expected="--mirror DIR|URL, or no --offline",
            )
        pinned = pinned_for(request.eksa_release, channel, mirror)
        request = dataclasses.replace(request, release_manifest=pinned.manifest_url)
    manifest, state = _load_manifest_for(request, channel, mirror, arch)
    version = manifest.kubernetes_version if manifest else channel.kubernetes_version
    release = manifest.number if manifest else channel.release
    # a manifest names its release (kubernetes-1-34-source-1 for one built from source: never passed off as the
    # distro's); the distro part of the image's name follows it
    release_name = manifest.name if manifest else load_profile().release_name(channel.name, release)
    distro = manifest.distro if manifest else None
    runtime, upstream = _runtime(request.runtime, manifest, channel, pinned, mirror, arch)
    artifacts = (manifest.artifacts if manifest else ()) + upstream
    if pinned is not None and pinned.runtime and runtime.source == "release":  # the bundle's runtime, in their place
        bundled = {a.name for a in pinned.runtime}
        artifacts = tuple(a for a in artifacts if not (a.kind == "archive" and a.name in bundled)) + pinned.runtime
    if runtime.source == "os":  # the release's runtime tarball is not staged
        artifacts = tuple(a for a in artifacts if not (a.kind == "archive" and a.name == "containerd"))
    warnings = tuple(w for w in (channel.support_warning, _runtime_warning(runtime, version)) if w)
    if arch != ARCH_NAMES[0] and not image_based(provider.name, config):  # after its release artifacts are found
        raise InputError(f"{arch} images are built from an {arch} disk image, and this build installs from the OS's"
                         " installer ISO", field="--arch",
                         expected=f"an {arch} source_image_url in {provider.config_flag}"
                         f" (image-builder image.base --arch {arch} makes one)")  # fmt: skip
    name = _artifact_name(os_.name, version, release, provider.extension, request.name, distro, arch)
    local = registry.get(provider.name).local_artifact
    output_path = Path(request.output_dir).resolve() / name if local else None
    ws = workspace_root()
    plan = BuildPlan(
        pair=pair,
        os_version=os_version,
        channel=channel,
        kubernetes_version=version,
        release=release,
        release_name=release_name,
        manifest=state,
        artifacts=artifacts,
        mirror=mirror,
        config=config,
        config_path=str(Path(config_path).resolve()) if config_path else None,
        output_name=name,
        output_path=output_path,
        workspace=ws,
        steps=(),
        disk_gb=disk_gb,
        offline=request.offline,
        extras=extras,
        ansible_verbosity=request.ansible_verbosity,
        firmware=firmware,
        engine=engine,
        engine_reason=engine_reason,
        runtime=runtime,
        warnings=warnings,
        arch=arch,
        hardening=request.hardening,
    )
    return dataclasses.replace(plan, steps=tuple(_steps(plan)))


RUNTIMES = ("release", "os")


def _runtime(
    choice: str | None,
    manifest: ReleaseManifest | None,
    channel: ReleaseChannel,
    pinned: Pinned | None = None,
    mirror: Mirror | None = None,
    arch: str = ARCH_NAMES[0],
) -> tuple[RuntimePlan, tuple[NodeArtifact, ...]]:
    """The runtime the product release's bundle ships for the line (``--<product>-release``), else the release's
    when its manifest ships one (exit 2 when it cannot run the release's Kubernetes), else the line's own from its
    projects' releases (config/release-channels.yaml ``upstream_runtime``); the OS's package only when asked for
    with ``--runtime os``. With it, the artifacts the plan adds for it (the upstream runtime's files)."""
    value = choice or "release"
    if value not in RUNTIMES:
        raise InputError(f"{value[:40]!r} is not a runtime source{did_you_mean(value, RUNTIMES)}", field="--runtime",
                         expected="release (the release line's containerd) or os (the OS's package)")  # fmt: skip
    ships = manifest is not None and manifest.ships_runtime
    if value == "os":
        return RuntimePlan("os", None, None, None, "build --runtime os"), ()
    if pinned is not None and pinned.ships_runtime:
        if arch != ARCH_NAMES[0]:  # the bundle names one runtime per line, its linux/amd64 tarball
            raise InputError(f"the bundle ships its runtime for linux/amd64 only, and the build is for {arch}",
                             source=pinned.bundle_url, field="eksD.containerd.uri",
                             expected=f"a {arch} build without {flag()} (the line's runtime from its projects), or"
                             " --runtime os")  # fmt: skip
        containerd = pinned.version_of("containerd")
        kubernetes = manifest.kubernetes_version if manifest else channel.kubernetes_version
        problem = runtime_problem(containerd, int(kubernetes.split(".")[1])) if containerd else None
        if problem:
            raise InputError(problem, source=pinned.bundle_url, field="eksD.containerd.uri",
                             expected="a bundle whose containerd can run its Kubernetes")  # fmt: skip
        crictl = pinned.version_of("cri-tools") or (manifest.version_of("cri-tools") if manifest else None)
        return RuntimePlan("release", containerd, None, crictl,
                           f"product release {pinned.version}'s bundle (eksD.containerd)"), ()  # fmt: skip
    if not ships:
        from imagebuilder.release.upstream import upstream_files, upstream_runtime

        line = channel.runtime
        why = f"line {channel.name}'s, from containerd's, runc's and cri-tools' own releases (the release names none)"
        runc = next(p.version for p in upstream_files(line, arch) if p.name == "runc")
        if manifest is None:  # the plan is not complete without the manifest: nothing is read for the runtime either
            return RuntimePlan("release", line.containerd, runc, line.crictl, why), ()
        try:
            up = upstream_runtime(line, mirror, arch)
        except ExternalError as exc:  # unreachable, as an unreachable manifest is: a real build stops on it
            return RuntimePlan("release", line.containerd, runc, line.crictl, why, unresolved=_unreachable(exc)), ()
        return RuntimePlan("release", line.containerd, runc, line.crictl, why), up.artifacts
    assert manifest is not None
    containerd = manifest.version_of("containerd")
    if containerd is not None:
        problem = runtime_problem(containerd, int(manifest.kubernetes_version.split(".")[1]))
        if problem:
            raise InputError(problem, source=manifest.source, field="status.components[containerd].gitTag",
                             expected="a release whose containerd can run its Kubernetes")  # fmt: skip
    return RuntimePlan("release", containerd, manifest.version_of("runc"), manifest.version_of("cri-tools"),
                       f"{manifest.name}'s containerd tarball"), ()  # fmt: skip


def _runtime_warning(runtime: RuntimePlan, kubernetes: str) -> str | None:
    minor = int(kubernetes.split(".")[1])
    if runtime.source == "os" and minor >= CONTAINERD_2_FROM_MINOR:
        return (
            f"the image gets the OS's containerd package ({runtime.why}): Kubernetes {kubernetes} needs "
            "containerd 2, which Debian 12 and Ubuntu 24.04 do not package; the kubelet will not run on 1.x"
        )
    return None


__all__ = ["make_plan"]
