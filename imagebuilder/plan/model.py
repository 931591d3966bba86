"""The build plan's types: the request as the user gave it, and the plan made of it (see :mod:`.resolve`).

``build --dry-run`` prints it; a real build executes it. Building the plan touches nothing but the config files
and, when reachable, the release manifest, so a user learns in seconds what a 40-minute build would do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from imagebuilder.core.fetch import Mirror
from imagebuilder.customization.model import Customization
from imagebuilder.hardening.model import HardeningRequest
from imagebuilder.plan.config import ProviderConfig
from imagebuilder.release.catalog import BuildPair, Firmware, OsVersion, ReleaseChannel, config_version_of
from imagebuilder.release.manifest import NodeArtifact


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
    files_config: str | None = None  # the reference tool's --files-config (files.json)
    ansible_verbosity: int = 0  # the reference tool's --ansible-verbosity (0-6)
    eksa_release: str | None = None  # the reference tool's --<product>-release: the product release to pin
    firmware: str | None = None  # the reference tool's --firmware: bios or efi (None: the matrix's default)
    engine: str | None = None  # packer (default), chroot (image-based builds, no VM) or auto
    runtime: str | None = None  # release (default: the release line's containerd) or os (the OS's package)
    arch: str | None = None  # amd64 (default) or arm64 (issue 46)
    #: the config of a provider for one architecture (``--baremetal-config arm64=FILE``): arch -> provider -> path
    arch_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    #: ``--hardening PROFILE`` with its content and threshold (issue 62); None: not hardened
    hardening: HardeningRequest | None = None

    def for_arch(self, arch: str) -> BuildRequest:
        """This request for ``arch``, each provider's config that architecture's where one is named for it
        (``--baremetal-config FILE,arm64=ARM64-FILE``): a matrix of both architectures builds each from its own
        source image."""
        configs = {**self.configs, **self.arch_configs.get(arch, {})}
        return dataclasses.replace(self, arch=arch, configs=configs, arch_configs={})


@dataclass(frozen=True)
class ManifestState:
    source: str
    resolved: bool
    note: str | None = None
    #: the document's SHA-256, when it was read
    sha256: str | None = None
    #: the URL the manifest is known by (a mirror only changes where it was read from: ``source``)
    upstream: str | None = None
    #: the release's date (``status.date``): a reproducible build's SOURCE_DATE_EPOCH
    date: str | None = None


@dataclass(frozen=True)
class RuntimePlan:
    """The container runtime the image gets: the release's (its containerd tarball, with the runc it pins) or the
    OS's package (asked for, or the release names none), and the versions known before the build."""

    source: Literal["release", "os"]
    containerd: str | None
    runc: str | None
    crictl: str | None
    why: str
    #: why the runtime's files are not known yet (its checksum files could not be fetched); empty: known
    unresolved: str = ""

    @property
    def config_version(self) -> int | None:
        """containerd's config.toml version for a known containerd (2 for 1.x, 3 for 2.0-2.2, 4 from 2.3 on)."""
        return config_version_of(self.containerd) if self.containerd else None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "containerd": self.containerd, "runc": self.runc, "crictl": self.crictl,
                "config_version": self.config_version, "why": self.why,
                **({"unresolved": self.unresolved} if self.unresolved else {})}  # fmt: skip

    def describe(self) -> str:
        if self.source == "os":
            return f"the OS's containerd package ({self.why})"
        parts = [f"containerd {self.containerd}"] + ([f"runc {self.runc}"] if self.runc else [])
        parts += [f"crictl {self.crictl}"] if self.crictl else []
        note = f"  [not resolved: {self.unresolved}]" if self.unresolved else ""
        return f"{', '.join(parts)} from the release (config version {self.config_version}; {self.why}){note}"


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
    #: the reference tool's build options (extra packages, repositories, additional files) as a customization
    extras: Customization | None = None
    ansible_verbosity: int = 0
    #: what the image boots with: BIOS, or UEFI (an EFI system partition; the build VM runs OVMF)
    firmware: Firmware = "bios"
    #: who provisions the image: ``packer`` (a VM) or ``chroot`` (the image mounted on this host, no VM)
    engine: str = "packer"
    #: why that engine (``--engine auto`` says what it found)
    engine_reason: str = "the default"
    runtime: RuntimePlan = RuntimePlan("os", None, None, None, "not resolved")
    #: what the user is told and the build goes on with (an end-of-life line, a runtime that may not fit)
    warnings: tuple[str, ...] = ()
    #: the architecture the image is for (its binaries, its boot loader; the output name ends with it)
    arch: str = "amd64"
    #: the hardening profile applied in the build and scanned for (issue 62); None: not hardened
    hardening: HardeningRequest | None = None

    @property
    def os(self) -> str:
        return self.pair.os.name

    @property
    def provider(self) -> str:
        return self.pair.provider.name

    @property
    def output_stem(self) -> str:
        """The output name without the provider's extension (``ubuntu-v1.24.17-eks-36-amd64``)."""
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
                **({"sha256": self.manifest.sha256} if self.manifest.sha256 else {}),
                **({"note": self.manifest.note} if self.manifest.note else {}),
                **({"date": self.manifest.date} if self.manifest.date else {}),
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
            "firmware": self.firmware,
            "arch": self.arch,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "build_options": self.extras.summary() if self.extras else None,
            "runtime": self.runtime.to_json(),
            "hardening": self.hardening.to_json() if self.hardening else None,
            "warnings": list(self.warnings),
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
        lines.append(f"  firmware            {'UEFI (efi)' if self.firmware == 'efi' else 'BIOS (bios)'}")
        lines.append(f"  architecture        {self.arch}")
        lines.append(f"  engine              {self.engine} ({self.engine_reason})")
        lines.append(f"  container runtime   {self.runtime.describe()}")
        if self.hardening:
            h = self.hardening
            origin = f"the data streams in {h.content}" if h.content else "ComplianceAsCode built from source, cached"
            lines.append(
                f"  hardening           {h.profile}, tailored for a node ({origin}); the scan must pass"
                f" {h.min_pass:g}% of the applicable rules"
            )
        lines.append(f"  config file         {self.config_path or '(none)'}")
        for key, value in (data["config"] or {}).items():
            if value is not None:
                lines.append(f"    {key:<22}{value}")
        lines.append(f"  node artifacts (linux/{self.arch}):")
        if self.artifacts:
            for a in self.artifacts:
                sha = a.sha256 or "(no digest in manifest: pulled by tag)"
                lines.append(f"    {a.kind:<8}{a.name:<24}{sha}")
                lines.append(f"            {a.uri}")
        else:
            lines.append(f"    not resolved offline: see {self.manifest.source}")
        lines.append("  steps:")
        lines += [f"    {i}. {s}" for i, s in enumerate(self.steps, 1)]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


__all__ = ["BuildPlan", "BuildRequest", "ManifestState", "RuntimePlan"]
