"""The build plan: every input of ``image-builder build`` resolved and validated, before anything runs.

``build --dry-run`` prints it; a real build executes it. Building the plan touches nothing but the config files
and, when reachable, the release manifest, so a user learns in seconds what a 40-minute build would do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.errors import ExternalError, InputError
from imagebuilder.mirror import Mirror
from imagebuilder.model import BuildPair, OsVersion, ReleaseChannel, load_catalog
from imagebuilder.profile import load_profile
from imagebuilder.provider_config import (
    AmiConfig,
    BaremetalConfig,
    CloudstackConfig,
    ConfigContext,
    NutanixConfig,
    Os3Fields,
    ProviderConfig,
    SourceImageFields,
    VsphereConfig,
    load_provider_config,
)
from imagebuilder.release_manifest import NodeArtifact, ReleaseManifest, load_manifest
from imagebuilder.workspace import workspace_root

#: how long a dry run waits for the upstream manifest before planning without it
MANIFEST_TIMEOUT = 1.5


@dataclass
class BuildRequest:
    """The build flags as given: names may be aliases, paths unchecked."""

    os: str | None
    hypervisor: str | None
    release_channel: str | None
    os_version: str | None = None
    configs: dict[str, str] = field(default_factory=dict)  # provider name -> config path
    release_manifest: str | None = None
    mirror: str | None = None
    name: str | None = None
    output_dir: str = "output"
    offline: bool = False
    disk_gb: int | None = None


@dataclass(frozen=True)
class ManifestState:
    source: str
    resolved: bool
    note: str | None = None


@dataclass(frozen=True)
class BuildPlan:
    pair: BuildPair
    os_version: OsVersion
    channel: ReleaseChannel
    kubernetes_version: str
    release: int
    release_name: str
    manifest: ManifestState
    artifacts: tuple[NodeArtifact, ...]
    mirror: Mirror | None
    config: ProviderConfig | None
    config_path: str | None
    output_name: str
    output_path: Path | None
    workspace: Path
    steps: tuple[str, ...]
    disk_gb: int
    offline: bool = False

    @property
    def os(self) -> str:
        return self.pair.os.name

    @property
    def provider(self) -> str:
        return self.pair.provider.name

    @property
    def output_stem(self) -> str:
        """The output name without the provider's extension (``ubuntu-v1.24.8-eks-5-amd64``)."""
        ext = self.pair.provider.extension
        return self.output_name.removesuffix(ext) if ext else self.output_name

    def to_json(self) -> dict[str, Any]:
        def artifact(a: NodeArtifact) -> dict[str, Any]:
            out = a.to_json()
            if self.mirror is not None and a.kind != "image":
                out["fetch_from"] = self.mirror.locate(a.uri)
            return out

        return {
            "os": self.os,
            "os_kind": self.pair.os.kind,
            "os_version": self.os_version.version,
            "provider": self.provider,
            "provider_kind": self.pair.provider.kind,
            "release_channel": self.channel.name,
            "kubernetes_version": self.kubernetes_version,
            "distro_release": self.release,
            "release_name": self.release_name,
            "release_manifest": {
                "source": self.manifest.source,
                "resolved": self.manifest.resolved,
                **({"note": self.manifest.note} if self.manifest.note else {}),
            },
            "mirror": self.mirror.base if self.mirror else None,
            "artifacts": [artifact(a) for a in self.artifacts],
            "output": {
                "kind": self.pair.provider.output,
                "description": self.pair.provider.description,
                "name": self.output_name,
                "path": str(self.output_path) if self.output_path else None,
            },
            "config_file": self.config_path,
            "config": self.config.public_dict() if self.config else None,
            "workspace": str(self.workspace),
            "disk_gb": self.disk_gb,
            "steps": list(self.steps),
        }

    def render_text(self) -> str:
        data = self.to_json()
        lines = [
            f"Build plan: {self.os} {self.os_version.version} ({self.pair.os.kind}) for {self.provider}"
            f" ({self.pair.provider.kind})",
            f"  release channel     {self.channel.name}",
            f"  kubernetes          {self.kubernetes_version}",
            f"  distro release      {self.release_name} (release {self.release})",
            f"  release manifest    {self.manifest.source}"
            + ("" if self.manifest.resolved else f"  [{self.manifest.note}]"),
        ]
        if self.mirror:
            lines.append(f"  mirror              {self.mirror.base}")
        out = data["output"]
        lines.append(f"  output              {out['kind']}: {out['path'] or out['name']}  ({out['description']})")
        lines.append(f"  config file         {self.config_path or '(none)'}")
        for key, value in (data["config"] or {}).items():
            if value is not None:
                lines.append(f"    {key:<22}{value}")
        lines.append("  node artifacts (linux/amd64):")
        if self.artifacts:
            for a in self.artifacts:
                sha = a.sha256 or "(no digest in manifest: pulled by tag)"
                lines.append(f"    {a.kind:<8}{a.name:<24}{sha}")
                lines.append(f"            {a.uri}")
        else:
            lines.append(f"    not resolved offline: see {self.manifest.source}")
        lines.append("  steps:")
        lines += [f"    {i}. {s}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _artifact_name(plan_os: str, version: str, release: int, extension: str, override: str | None) -> str:
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
        template.format(os=plan_os, kubernetes_version=version, distro=load_profile().distro.name, release=release)
        + extension
    )


def _steps(pair: BuildPair, config: ProviderConfig | None, name: str, version: str, ws: Path) -> list[str]:
    os_name = pair.os.name
    steps = [
        "preflight: host OS, architecture, CPUs, memory, disk, tools, /dev/kvm (spec 4.3, 8)",
        f"render the Packer template, {'kickstart' if os_name == 'redhat' else 'cloud-init seed'}"
        f" and Ansible variables into {ws}/<build-id>",
    ]
    node = f"ansible: OS packages, containerd, Kubernetes {version} binaries and images (sha256-verified)"
    subscription = "register the OS-3 subscription for the build; unregister it before the image is sealed"
    sysprep = "sysprep: empty machine-id, remove SSH host keys, cloud-init clean, logs, build user"
    source_image = config.source_image_url if isinstance(config, SourceImageFields) else None
    if isinstance(config, VsphereConfig) and config.is_local:
        steps.append(f"packer: qemu builder, qcow2 disk, from the source image {source_image} (local OVA, no vCenter)")
        steps += [node + ", open-vm-tools, VMware guestinfo datasource", sysprep]
        steps.append(f"convert the disk to a streamOptimized VMDK and package {name} (OVF descriptor, SHA256 manifest)")
    elif isinstance(config, VsphereConfig):
        place = f"cluster {config.cluster}" if config.cluster else f"resource pool {config.resource_pool}"
        steps.append(
            f"packer: vsphere-iso on {config.platform_server} (datacenter {config.datacenter}, {place},"
            f" datastore {config.datastore}, network {config.network}, folder {config.folder},"
            f" linked clone {str(config.linked_clone).lower()},"
            f" TLS {'not verified' if config.insecure_connection else 'verified'})"
        )
        if os_name == "redhat":
            steps.append(subscription)
        steps += [node + ", open-vm-tools, VMware guestinfo datasource", sysprep, f"export OVA {name}"]
        steps.append(f"upload {name} to content library {config.platform_library_name}")
        if config.create_snapshot:
            steps.append("snapshot the base VM")
        if config.convert_to_template:
            steps.append("convert the VM to a template")
    elif pair.provider.name == "baremetal":
        iso = config.iso_url if isinstance(config, Os3Fields) else None
        if os_name == "redhat":
            source = f"the OS-3 ISO {iso}"
        else:
            source = f"the source image {source_image}" if source_image else "the OS-2 live-server ISO (autoinstall)"
        steps.append(f"packer: qemu builder, raw disk, from {source}")
        if os_name == "redhat":
            steps.append(subscription)
            if isinstance(config, BaremetalConfig) and config.extra_rpms:
                steps.append(f"install extra RPMs: {config.extra_rpms}")
        steps += [node + ", bare-metal cloud-init datasources", sysprep, f"compress raw -> {name} (gzip)"]
    elif isinstance(config, CloudstackConfig):
        steps += [f"packer: qemu builder, qcow2 disk, from the OS-3 ISO {config.iso_url}", subscription]
        steps += [node + ", CloudStack cloud-init datasource", sysprep, f"write {name}"]
        if config.registers_template:
            steps.append(
                f"register {name} as a template in zone {config.cloudstack_zone} via {config.cloudstack_api_url}"
            )
        else:
            steps.append("template registration skipped: no CloudStack access fields in the config")
    elif isinstance(config, AmiConfig):
        steps.append(
            f"packer: amazon-ebs in {config.cloud_region}, source AMI '{config.image_filter_name}'"
            f" owned by {config.image_filter_owners}, instance {config.builder_instance_type},"
            f" root {config.root_device_name} {config.volume_size} GiB {config.volume_type}"
        )
        extra = f" with --extra-vars {config.config_mgmt_extra_vars}" if config.config_mgmt_extra_vars else ""
        steps.append(node + extra)
        if config.custom_role:
            roles = config.custom_role_names or " ".join(config.custom_role_name_list or [])
            steps.append(f"custom roles before sysprep: {roles}")
        steps += [sysprep, f"register AMI {name}; copy to {', '.join(config.image_regions)}"]
        steps.append(f"write the Packer manifest to {config.manifest_output or '<output dir>/packer-manifest.json'}")
    elif isinstance(config, NutanixConfig):
        steps.append(
            f"packer: nutanix on {config.hci_endpoint}:{config.hci_port} (cluster {config.hci_cluster_name},"
            f" subnet {config.hci_subnet_name}) from source image {config.source_image_name}"
        )
        steps += [node + ", Nutanix cloud-init datasource", sysprep]
        steps.append(f"import the qcow2 into the image service as {config.image_name or name}")
    if pair.provider.output != "ami":
        steps.append(f"write {name}.sha256 and the build manifest (inputs without secrets, tool versions, checksums)")
    return steps


def _load_manifest_for(
    request: BuildRequest, channel: ReleaseChannel, mirror: Mirror | None
) -> tuple[ReleaseManifest | None, ManifestState]:
    if request.release_manifest:
        manifest = load_manifest(request.release_manifest, mirror)
        if manifest.channel != channel.name:
            raise InputError(
                f"spec.channel is {manifest.channel}, but --release-channel is {channel.name}",
                source=manifest.source,
                field="spec.channel",
                expected=f"a manifest of channel {channel.name}",
            )
        return manifest, ManifestState(manifest.source, True)
    url = channel.manifest_url
    location = mirror.locate(url) if mirror else url
    if mirror is None and request.offline:
        return None, ManifestState(url, False, "not resolved offline (--offline)")
    try:
        manifest = load_manifest(url, mirror, timeout=MANIFEST_TIMEOUT)
    except ExternalError as exc:
        reason = str(exc).splitlines()[0].rsplit(": ", 1)[-1]
        return None, ManifestState(location, False, f"not resolved offline ({reason})")
    return manifest, ManifestState(manifest.source, True)


def make_plan(request: BuildRequest) -> BuildPlan:
    """Resolve and validate every input of a build; raises :class:`InputError` (exit 2) on any bad input."""
    catalog = load_catalog()
    missing = [
        flag
        for flag, value in (
            ("--os", request.os),
            ("--hypervisor", request.hypervisor),
            ("--release-channel", request.release_channel),
        )
        if not value
    ]
    if missing:
        raise InputError(f"required flag{'s' if len(missing) > 1 else ''} missing: {', '.join(missing)}")
    assert request.os and request.hypervisor and request.release_channel
    os_ = catalog.os(request.os)
    provider = catalog.provider(request.hypervisor)
    channel = catalog.channel(request.release_channel)
    pair = catalog.build_pair(os_, provider)
    os_version = os_.version(request.os_version)

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
        config = load_provider_config(provider.name, config_path, ctx)

    mirror = Mirror.parse(request.mirror) if request.mirror else None
    manifest, state = _load_manifest_for(request, channel, mirror)
    version = manifest.kubernetes_version if manifest else channel.kubernetes_version
    release = manifest.number if manifest else channel.release
    release_name = load_profile().release_name(channel.name, release)
    name = _artifact_name(os_.name, version, release, provider.extension, request.name)
    output_path = None if provider.output == "ami" else Path(request.output_dir).resolve() / name
    ws = workspace_root()
    disk_gb = catalog.build_vm["disk_gb"] if request.disk_gb is None else request.disk_gb
    if not 4 <= disk_gb <= 2048:
        raise InputError(f"{disk_gb} GiB is not a usable disk size", field="--disk-gb", expected="4 to 2048")
    return BuildPlan(
        pair=pair,
        os_version=os_version,
        channel=channel,
        kubernetes_version=version,
        release=release,
        release_name=release_name,
        manifest=state,
        artifacts=manifest.artifacts if manifest else (),
        mirror=mirror,
        config=config,
        config_path=str(Path(config_path).resolve()) if config_path else None,
        output_name=name,
        output_path=output_path,
        workspace=ws,
        steps=tuple(_steps(pair, config, name, version, ws)),
        disk_gb=disk_gb,
        offline=request.offline,
    )


__all__ = ["BuildPlan", "BuildRequest", "make_plan"]
