"""The catalog: the one model of OS x provider x release channel, loaded from ``config/matrix.yaml`` and
``config/release-channels.yaml``.

Validation, plan building, naming, rendering and the tests all ask this module; none of them keeps its own list
of operating systems, providers or channels. Real names are canonical; the spec's kind names (``os2``,
``platform``...) resolve to them everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, TypeVar

from imagebuilder.core.errors import InputError, did_you_mean
from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.paths import config_dir

ConfigNeed = Literal["required", "optional"]
Firmware = Literal["bios", "efi"]
FIRMWARES: tuple[Firmware, ...] = ("bios", "efi")


@dataclass(frozen=True)
class OsVersion:
    """An installable OS version and the facts its install needs (from config/matrix.yaml)."""

    version: str
    default: bool = False
    ami_filter_name: str | None = None
    iso_url: str | None = None
    iso_checksum: str | None = None
    guest_os_type: str | None = None
    boot_command: tuple[str, ...] = ()
    #: the keys Packer types when the ISO boots under UEFI (GRUB's menu, not isolinux's); empty: the same keys
    boot_command_efi: tuple[str, ...] = ()
    #: the providers it is built for (empty: every provider of the OS)
    providers: tuple[str, ...] = ()

    def boot_command_for(self, firmware: str) -> tuple[str, ...]:
        return (self.boot_command_efi or self.boot_command) if firmware == "efi" else self.boot_command


@dataclass(frozen=True)
class TemplateDisk:
    """A disk of an imported template that must be grown: ``label`` (as vSphere names it) to ``size_gb``."""

    label: str
    size_gb: int


@dataclass(frozen=True)
class OperatingSystem:
    name: str
    kind: str
    aliases: tuple[str, ...]
    buildable: bool
    versions: tuple[OsVersion, ...] = ()
    #: how a build installs it from its ISO: the seed Packer serves (``autoinstall`` or ``kickstart``)
    install: Literal["autoinstall", "kickstart"] | None = None
    download_task: str | None = None
    #: Kubernetes minor ("1.21") or "newer" -> the disk template.import resizes (spec 3)
    template_disks: tuple[tuple[str, TemplateDisk], ...] = ()
    #: the providers that build UEFI images of it (the reference tool's ``--firmware efi``), and where efi is the
    #: default; BIOS is built everywhere
    efi_providers: tuple[str, ...] = ()
    efi_default: tuple[str, ...] = ()

    def firmware_for(self, value: str | None, provider: str, flag: str = "--firmware") -> Firmware:
        """Resolve ``--firmware`` for a build on ``provider``: bios or efi, as the matrix allows; None: the default."""
        if value is None:
            return "efi" if provider in self.efi_default else "bios"
        if value not in FIRMWARES:
            raise InputError(
                f"{value[:40]!r} is not a firmware{did_you_mean(value, FIRMWARES)}", field=flag, expected="bios or efi"
            )
        if value == "efi" and provider not in self.efi_providers:
            where = f"on {', '.join(self.efi_providers)} only" if self.efi_providers else "on no provider"
            raise InputError(
                f"UEFI {self.name} images are built {where}, not on {provider}", field=flag, expected="bios"
            )
        return "efi" if value == "efi" else "bios"

    def template_disk(self, kubernetes_minor: str) -> TemplateDisk | None:
        """The disk to resize for a template of this OS on ``kubernetes_minor`` (``1.24``), if any."""
        table = dict(self.template_disks)
        if kubernetes_minor in table:
            return table[kubernetes_minor]
        listed = [tuple(int(x) for x in k.split(".")) for k in table if k != "newer"]
        version = tuple(int(x) for x in kubernetes_minor.split("."))
        if "newer" in table and listed and all(version > v for v in listed):
            return table["newer"]
        return None

    @property
    def default_version(self) -> OsVersion | None:
        return next((v for v in self.versions if v.default), self.versions[0] if self.versions else None)

    def version_for(self, value: str | None, provider: str, flag: str = "--os-version") -> OsVersion:
        """Resolve ``--os-version`` for a build on ``provider`` (the matrix says which versions each supports)."""
        version = self.version(value, flag)
        if version.providers and provider not in version.providers:
            usable = [v.version for v in self.versions if not v.providers or provider in v.providers]
            raise InputError(
                f"{self.name} {version.version} is built for {', '.join(version.providers)} only, not {provider}",
                field=flag,
                expected=f"one of {', '.join(usable)}",
            )
        return version

    def version(self, value: str | None, flag: str = "--os-version") -> OsVersion:
        """Resolve ``--os-version``; None gives the default."""
        if value is None:
            default = self.default_version
            assert default is not None, f"{self.name} has no versions"
            return default
        for v in self.versions:
            if v.version == value:
                return v
        versions = [v.version for v in self.versions]
        raise InputError(
            f"'{value}' is not a supported {self.name} version{did_you_mean(value, versions)}",
            field=flag,
            expected=f"one of {', '.join(versions)}",
        )


@dataclass(frozen=True)
class Provider:
    name: str
    kind: str
    aliases: tuple[str, ...]
    output: str
    extension: str
    description: str

    @property
    def config_flag(self) -> str:
        return f"--{self.name}-config"


@dataclass(frozen=True)
class ReleaseChannel:
    """A supported channel: ``1-24`` -> Kubernetes v1.24.8, distro release 5."""

    name: str
    kubernetes_version: str
    release: int
    #: OS name -> the versions this channel's images are built on; an OS not named here: every version it has
    os_versions: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def check_os_version(self, os: str, version: str, flag: str = "--os-version") -> None:
        """Exit 2 when ``os`` ``version`` is not built for this channel (kubeadm refuses RHEL 8 from 1.32 on...)."""
        allowed = dict(self.os_versions).get(os)
        if allowed is not None and version not in allowed:
            raise InputError(
                f"{os} {version} is not built for Kubernetes {self.minor}",
                field=flag,
                expected=f"one of {', '.join(allowed)} for channel {self.name}",
            )

    def default_os_version(self, os: OperatingSystem) -> str | None:
        """The version a build without ``--os-version`` gets: the OS's default, or this channel's first version when
        the channel no longer builds the default (Ubuntu 20.04 on 1-34); None: the OS's default."""
        allowed = dict(self.os_versions).get(os.name)
        default = os.default_version
        if allowed and default is not None and default.version not in allowed:
            return allowed[0]
        return None

    @property
    def minor(self) -> str:
        """``1.24``, the form used by ``--kubernetes`` and KUBEVERSION."""
        return self.name.replace("-", ".")

    @property
    def manifest_url(self) -> str:
        from imagebuilder.release.profile import (
            load_profile,  # pydantic: imported when a manifest is named, not at start-up
        )

        return load_profile().manifest_url(self.name, self.release)

    @property
    def release_name(self) -> str:
        from imagebuilder.release.profile import load_profile

        return load_profile().release_name(self.name, self.release)


@dataclass(frozen=True)
class BuildPair:
    os: OperatingSystem
    provider: Provider
    config: ConfigNeed


@dataclass(frozen=True)
class Catalog:
    operating_systems: dict[str, OperatingSystem]
    providers: dict[str, Provider]
    channels: dict[str, ReleaseChannel]
    builds: tuple[BuildPair, ...]
    downloads: tuple[tuple[str, str], ...]
    artifact_name: str
    ami_defaults: dict[str, Any] = field(default_factory=dict)
    nutanix_defaults: dict[str, Any] = field(default_factory=dict)
    build_vm: dict[str, int] = field(default_factory=dict)

    # --- name resolution -------------------------------------------------------------------------------------
    def os(self, value: str, flag: str = "--os") -> OperatingSystem:
        return _resolve(value, self.operating_systems, flag, "operating system")

    def provider(self, value: str, flag: str = "--hypervisor") -> Provider:
        return _resolve(value, self.providers, flag, "provider")

    def channel(self, value: str, flag: str = "--release-channel") -> ReleaseChannel:
        if value in self.channels:
            return self.channels[value]
        if re.fullmatch(r"\d+\.\d+", value) and value.replace(".", "-") in self.channels:
            return self.channels[value.replace(".", "-")]  # the reference tool's current docs write 1.24
        valid = ", ".join(self.channels)
        raise InputError(f"'{value}' is not a supported release channel", field=flag, expected=f"one of {valid}")

    def channel_for_kubernetes(self, value: str, flag: str = "--kubernetes") -> ReleaseChannel:
        """Accept ``1.24`` (or ``1-24``, ``v1.24``) and return its channel."""
        norm = value.lstrip("v").replace(".", "-")
        if norm in self.channels:
            return self.channels[norm]
        valid = ", ".join(c.minor for c in self.channels.values())
        raise InputError(f"'{value}' is not a supported Kubernetes version", field=flag, expected=f"one of {valid}")

    # --- support matrix --------------------------------------------------------------------------------------
    def build_pair(self, os: OperatingSystem, provider: Provider) -> BuildPair:
        """The buildable pair, or an error that says what to do instead."""
        for pair in self.builds:
            if pair.os == os and pair.provider == provider:
                return pair
        if not os.buildable:
            where = ", ".join(p for o, p in self.downloads if o == os.name)
            raise InputError(
                f"{os.name} ({os.kind}) images are published by the project and are not built; "
                f"download them with 'image-builder {os.download_task}' (providers: {where})",
                field="--os",
            )
        valid = ", ".join(p.provider.name for p in self.builds if p.os == os)
        raise InputError(
            f"{os.name} ({os.kind}) cannot be built for {provider.name}",
            field="--hypervisor",
            expected=f"one of {valid} for {os.name}",
        )


_Named = TypeVar("_Named", bound=OperatingSystem | Provider)


def _resolve(value: str, table: dict[str, _Named], flag: str, what: str) -> _Named:
    key = value.strip().lower()
    entries: list[_Named] = list(table.values())
    for item in entries:
        if key == item.name or key in item.aliases:
            return item
    names: list[str] = []
    shown: list[str] = []
    for entry in entries:
        names += [entry.name, *entry.aliases]
        shown.append(f"{entry.name} ({', '.join(entry.aliases)})" if entry.aliases else entry.name)
    valid = ", ".join(shown)
    raise InputError(f"unknown {what} '{value}'{did_you_mean(key, names)}", field=flag, expected=f"one of {valid}")


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Load and cross-check the matrix; an inconsistent config directory is a bug, reported as input error."""
    path = config_dir() / "matrix.yaml"
    raw = load_yaml_mapping(path, "support matrix")
    chan_path = config_dir() / "release-channels.yaml"
    raw_channels = load_yaml_mapping(chan_path, "release channels")["channels"]
    try:
        oses = {
            name: OperatingSystem(
                name=name,
                kind=o["kind"],
                aliases=tuple(o.get("aliases", ())),
                buildable=bool(o["buildable"]),
                install=o.get("install"),
                versions=tuple(
                    OsVersion(
                        version=str(ver),
                        default=bool(v.get("default")),
                        ami_filter_name=v.get("ami_filter_name"),
                        iso_url=v.get("iso_url"),
                        iso_checksum=v.get("iso_checksum"),
                        guest_os_type=v.get("guest_os_type"),
                        boot_command=tuple(v.get("boot_command") or ()),
                        boot_command_efi=tuple(v.get("boot_command_efi") or ()),
                        providers=tuple(v.get("providers") or ()),
                    )
                    for ver, v in (o.get("versions") or {}).items()
                ),
                download_task=o.get("download_task"),
                efi_providers=tuple((o.get("firmware") or {}).get("efi") or ()),
                efi_default=tuple((o.get("firmware") or {}).get("default_efi") or ()),
                template_disks=tuple(
                    (str(k), TemplateDisk(str(d["label"]), int(d["size_gb"])))
                    for k, d in (o.get("template_disks") or {}).items()
                ),
            )
            for name, o in raw["operating_systems"].items()
        }
        providers = {
            name: Provider(
                name=name,
                kind=p["kind"],
                aliases=tuple(p.get("aliases", ())),
                output=p["output"],
                extension=p["extension"],
                description=p["description"],
            )
            for name, p in raw["providers"].items()
        }
        builds = tuple(BuildPair(oses[b["os"]], providers[b["provider"]], b["config"]) for b in raw["builds"])
        downloads = tuple((d["os"], d["provider"]) for d in raw.get("downloads", ()))
        channels = {
            str(name): ReleaseChannel(
                str(name),
                c["kubernetes_version"],
                int(c["release"]),
                tuple((str(o), tuple(str(v) for v in vs)) for o, vs in (c.get("os_versions") or {}).items()),
            )
            for name, c in raw_channels.items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"malformed entry: {exc!r}", source=path) from None
    for ch in channels.values():
        if not re.fullmatch(r"\d+-\d+", ch.name) or not ch.kubernetes_version.startswith(f"v{ch.minor}."):
            raise InputError(f"channel {ch.name} does not match {ch.kubernetes_version}", source=chan_path)
        for os_name, versions in ch.os_versions:
            known = {v.version for v in oses[os_name].versions} if os_name in oses else set()
            if not versions or not set(versions) <= known:
                raise InputError(f"channel {ch.name} lists {os_name} {list(versions)}", source=chan_path,
                                 field="os_versions", expected=f"versions of {os_name} in matrix.yaml")  # fmt: skip
    return Catalog(
        operating_systems=oses,
        providers=providers,
        channels=channels,
        builds=builds,
        downloads=downloads,
        artifact_name=raw["artifact_name"],
        ami_defaults=dict(raw.get("ami_defaults", {})),
        nutanix_defaults=dict(raw.get("nutanix_defaults", {})),
        build_vm={k: int(v) for k, v in raw["build_vm"].items()},
    )
