"""The catalog: the one model of OS x provider x release channel, loaded from ``config/matrix.yaml`` and
``config/release-channels.yaml``.

Validation, plan building, naming, rendering and the tests all ask this module; none of them keeps its own list
of operating systems, providers or channels. Real names are canonical; the spec's kind names (``os2``,
``platform``...) resolve to them everywhere.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

from imagebuilder.core.arch import ARCH_NAMES
from imagebuilder.core.errors import InputError, did_you_mean
from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.paths import config_dir

ConfigNeed = Literal["required", "optional"]
Support = Literal["supported", "extended", "end-of-life"]
#: Kubernetes 1.35 is the last minor that runs on containerd 1.x: from 1.36 on the kubelet needs containerd 2
CONTAINERD_2_FROM_MINOR = 36
RUNTIME_VERSION = re.compile(r"v(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})")
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


def config_version_of(containerd: str) -> int | None:
    """The config.toml ``version`` containerd ``containerd`` writes and reads as current (its ``ConfigVersion``): 2
    for 1.x, 3 for 2.0 to 2.2, 4 from 2.3 on; None for a version this tool cannot read."""
    m = re.match(r"v?([0-9]{1,6})\.([0-9]{1,6})\.", containerd)
    if m is None:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    return 2 if major < 2 else 3 if (major, minor) < (2, 3) else 4


@dataclass(frozen=True)
class Runtime:
    """The container runtime a line's images carry: containerd (with the runc its release pins) and crictl."""

    containerd: str
    crictl: str

    @property
    def config_version(self) -> int | None:
        """The config.toml ``version`` this containerd writes: 2 for 1.x, 3 for 2.0 to 2.2, 4 from 2.3 on."""
        return config_version_of(self.containerd)


#: the runtime's parts a line's images get from their projects' own releases: artifact name -> (kind, component)
UPSTREAM_PARTS: dict[str, tuple[Literal["archive", "binary"], str]] = {
    "containerd": ("archive", "containerd"),
    "runc": ("binary", "runc"),
    "crictl": ("archive", "cri-tools"),
}
_PLACEHOLDER = re.compile(r"\{([a-z]+)\}")
_TEMPLATE_FIELDS = {"url": {"version", "number", "arch"}, "sums": {"version", "number", "arch", "url"}}


@dataclass(frozen=True)
class UpstreamFile:
    """One part of a line's runtime at its project's own release: the file, and the checksum file beside it."""

    name: str
    kind: Literal["archive", "binary"]
    component: str
    version: str
    url: str
    sums_url: str


@dataclass(frozen=True)
class UpstreamRuntime:
    """Where a line's runtime comes from when neither its release nor a product bundle names one
    (config/release-channels.yaml ``upstream_runtime`` and ``runc_pins``)."""

    #: artifact name -> (URL template, checksum file URL template)
    templates: tuple[tuple[str, str, str], ...]
    #: containerd version -> the runc it pins
    runc_pins: tuple[tuple[str, str], ...]

    def files(self, runtime: Runtime, arch: str = "amd64") -> tuple[UpstreamFile, ...]:
        versions = {"containerd": runtime.containerd, "crictl": runtime.crictl,
                    "runc": dict(self.runc_pins)[runtime.containerd]}  # fmt: skip
        out = []
        for name, url_t, sums_t in self.templates:
            kind, component = UPSTREAM_PARTS[name]
            values = {"version": versions[name], "number": versions[name].lstrip("v"), "arch": arch}
            url = url_t.format(**values)
            out.append(UpstreamFile(name, kind, component, versions[name], url, sums_t.format(url=url, **values)))
        return tuple(out)


def _upstream_runtime(doc: dict[str, Any], path: Path, runtimes: set[str]) -> UpstreamRuntime:
    """The ``upstream_runtime`` and ``runc_pins`` of release-channels.yaml, checked: every part named once, https
    templates with known placeholders only, a runc pinned for every containerd a line names."""
    raw = doc.get("upstream_runtime")
    if not isinstance(raw, dict) or set(raw) != set(UPSTREAM_PARTS):
        raise InputError("upstream_runtime must name containerd, runc and crictl", source=path,
                         field="upstream_runtime", expected="containerd, runc, crictl: {url, sums}")  # fmt: skip
    templates = []
    for name, entry in raw.items():
        if not isinstance(entry, dict) or set(entry) != set(_TEMPLATE_FIELDS):
            raise InputError("needs url and sums", source=path, field=f"upstream_runtime.{name}")
        for key, allowed in _TEMPLATE_FIELDS.items():
            value = entry[key]
            if (not isinstance(value, str) or not re.fullmatch(r"(https://|\{url\})[A-Za-z0-9._~/%+{}-]+", value)
                    or not set(_PLACEHOLDER.findall(value)) <= allowed):  # fmt: skip
                raise InputError(f"{str(value)[:120]!r}", source=path, field=f"upstream_runtime.{name}.{key}",
                                 expected=f"an https URL template with {', '.join(sorted(allowed))}")  # fmt: skip
        templates.append((str(name), entry["url"], entry["sums"]))
    pins = doc.get("runc_pins")
    if not isinstance(pins, dict):
        raise InputError("missing", source=path, field="runc_pins", expected="containerd version: runc version")
    for containerd, runc in pins.items():
        if not RUNTIME_VERSION.fullmatch(str(containerd)) or not RUNTIME_VERSION.fullmatch(str(runc)):
            raise InputError(f"{containerd!r}: {runc!r}", source=path, field="runc_pins",
                             expected="v2.3.1: v1.4.2")  # fmt: skip
    missing = sorted(runtimes - {str(c) for c in pins})
    if missing:
        raise InputError(f"no runc pinned for containerd {', '.join(missing)}", source=path, field="runc_pins",
                         expected="the runc pinned by each containerd a line names")  # fmt: skip
    return UpstreamRuntime(tuple(templates), tuple((str(c), str(r)) for c, r in pins.items()))


def runtime_problem(containerd: str, minor: int) -> str | None:
    """Why containerd ``containerd`` (``v1.7.28``, ``1.6.20``) cannot run Kubernetes 1.``minor``, or None."""
    m = re.match(r"v?([0-9]{1,6})\.", containerd)
    if m is None:
        return f"containerd {containerd[:40]!r} has no version this tool can read"
    if minor >= CONTAINERD_2_FROM_MINOR and int(m.group(1)) < 2:
        return (f"Kubernetes 1.{minor} needs containerd 2 (1.{CONTAINERD_2_FROM_MINOR - 1} is the last minor that "
                f"supports containerd 1.x), not {containerd}")  # fmt: skip
    return None


@dataclass(frozen=True)
class ReleaseChannel:
    """A release line: ``1-24`` -> its current distro release (36, Kubernetes v1.24.17); ``1-24-eks-5`` names one
    of its other releases explicitly (the spec's 5, v1.24.8)."""

    name: str
    kubernetes_version: str
    release: int
    #: OS name -> the versions this channel's images are built on; an OS not named here: every version it has
    os_versions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    support: Support = "supported"
    runtime: Runtime = Runtime("v1.7.28", "v1.36.0")
    #: other releases of the line a build may name explicitly (``--release-channel 1-24-eks-5``): number ->
    #: Kubernetes version; the spec's historic numbers of 1-21 .. 1-24 among them
    releases: tuple[tuple[int, str], ...] = ()
    #: a minor upstream has released and the distro has not (1-37): built only from a release made by release.build
    upstream_only: bool = False

    @property
    def minor_number(self) -> int:
        return int(self.name.split("-")[1])

    @property
    def support_warning(self) -> str | None:
        """What a build on this line is told (never refused): None while the line is supported."""
        if self.support == "end-of-life":
            return (f"release channel {self.name} is end of life: the distro publishes no more releases of it and "
                    "upstream no longer patches Kubernetes " + self.minor + "; build a supported line "
                    "(see docs/release-lines.md)")  # fmt: skip
        return None

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
        if self.upstream_only:
            raise InputError(
                f"the distro publishes no release of {self.name} yet (upstream has Kubernetes {self.minor})",
                field="--release-manifest",
                expected=f"a release built from source: image-builder release.build --kubernetes v{self.minor}.N, "
                "then its manifest's URL",
            )
        from imagebuilder.release.profile import (
            load_profile,  # pydantic: imported when a manifest is named, not at start-up
        )

        return load_profile().manifest_url(self.name, self.release)

    @property
    def release_name(self) -> str:
        return self.release_name_of(self.release)

    def release_name_of(self, number: int) -> str:
        from imagebuilder.release.profile import load_profile

        return load_profile().release_name(self.name, number)


@dataclass(frozen=True)
class BuildPair:
    os: OperatingSystem
    provider: Provider
    config: ConfigNeed
    #: the architectures it is built for
    arches: tuple[str, ...] = (ARCH_NAMES[0],)
    #: why it is not built for the others (config/matrix.yaml ``not_arm64``)
    why_not: str = ""

    def check_built_for(self, arch: str) -> None:
        """Exit 2 at plan time for an architecture this pair is not built for, saying why."""
        if arch not in self.arches:
            raise InputError(
                f"{self.os.name} on {self.provider.name} is not built for {arch}: {self.why_not}",
                field="--arch",
                expected=" or ".join(self.arches),
            )


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
    upstream_runtime: UpstreamRuntime = UpstreamRuntime((), ())
    #: the newest minor upstream has released (``upstream_newest``): lines past the distro's up to it are
    #: upstream-only (:meth:`channel`)
    upstream_newest: int = 0

    # --- name resolution -------------------------------------------------------------------------------------
    def os(self, value: str, flag: str = "--os") -> OperatingSystem:
        return _resolve(value, self.operating_systems, flag, "operating system")

    def provider(self, value: str, flag: str = "--hypervisor") -> Provider:
        return _resolve(value, self.providers, flag, "provider")

    def channel(self, value: str, flag: str = "--release-channel") -> ReleaseChannel:
        """The line ``1-24`` (or ``1.24``) at its current release, or one release of it named explicitly:
        ``1-24-eks-5`` or ``kubernetes-1-24-eks-5`` (a number the catalog lists for the line)."""
        if value in self.channels:
            return self.channels[value]
        if re.fullmatch(r"[0-9]+\.[0-9]+", value) and value.replace(".", "-") in self.channels:
            return self.channels[value.replace(".", "-")]  # the reference tool's current docs write 1.24
        named = re.fullmatch(r"(?:kubernetes-)?([0-9]{1,2}-[0-9]{1,3})-[a-z]{1,16}-([0-9]{1,5})", value, re.ASCII)
        if named and named.group(1) in self.channels:
            line = self.channels[named.group(1)]
            number = int(named.group(2))
            known = {line.release: line.kubernetes_version, **dict(line.releases)}
            if number in known and value.removeprefix("kubernetes-") == line.release_name_of(number).removeprefix(
                "kubernetes-"
            ):
                return dataclasses.replace(line, release=number, kubernetes_version=known[number])
            names = ", ".join(line.release_name_of(n).removeprefix("kubernetes-") for n in sorted(known))
            raise InputError(f"'{value[:60]}' is not a release of line {line.name} this tool knows", field=flag,
                             expected=f"one of {names}, or --release-manifest URL for another")  # fmt: skip
        upstream = self.upstream_line(value)
        if upstream is not None:
            return upstream
        valid = ", ".join(self.channels)
        raise InputError(f"'{value[:60]}' is not a supported release channel", field=flag,
                         expected=f"one of {valid}, or one release of a line (1-24-eks-5)")  # fmt: skip

    def upstream_line(self, value: str) -> ReleaseChannel | None:
        """``1-37`` (or ``1.37``) when upstream has released that minor and the distro has not: the newest line's
        OS versions and runtime, supported, and built only from a release made by release.build (its manifest names
        the Kubernetes version; :attr:`ReleaseChannel.manifest_url` says so otherwise)."""
        m = re.fullmatch(r"1[-.]([0-9]{1,3})", value)
        newest = self.newest_channel()
        if m is None or not newest.minor_number < int(m.group(1)) <= self.upstream_newest:
            return None
        minor = int(m.group(1))
        return dataclasses.replace(newest, name=f"1-{minor}", kubernetes_version=f"v1.{minor}.0", release=0,
                                   support="supported", releases=(), upstream_only=True)  # fmt: skip

    def newest_channel(self) -> ReleaseChannel:
        return max(self.channels.values(), key=lambda c: c.minor_number)

    def runtime_for_minor(self, minor: int) -> Runtime:
        """The runtime of the line of Kubernetes 1.``minor``; a minor newer than every line takes the newest line's,
        an older one the oldest line's."""
        channel = self.channels.get(f"1-{minor}")
        if channel is None:
            ordered = sorted(self.channels.values(), key=lambda c: c.minor_number)
            channel = ordered[-1] if minor > ordered[-1].minor_number else ordered[0]
        return channel.runtime

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


def _support(name: str, newest: tuple[int, ...], distro_supported: set[str]) -> Support:
    """The rule of config/release-channels.yaml: supported while upstream patches the minor (its three newest) and
    the distro lists the line, extended while only the distro does, end of life after."""
    minor = int(name.split("-")[1])
    if name not in distro_supported:
        return "end-of-life"
    return "supported" if minor > newest[1] - 3 else "extended"


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
    chan_doc = load_yaml_mapping(chan_path, "release channels")
    raw_channels = chan_doc["channels"]
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
        builds = tuple(
            BuildPair(
                oses[b["os"]],
                providers[b["provider"]],
                b["config"],
                tuple(b.get("arches") or (ARCH_NAMES[0],)),
                str(b.get("not_arm64") or ""),
            )
            for b in raw["builds"]
        )
        for pair in builds:
            if not set(pair.arches) <= set(ARCH_NAMES) or ("arm64" not in pair.arches) != bool(pair.why_not):
                raise InputError(f"{pair.os.name}/{pair.provider.name}: arches {list(pair.arches)}", source=path,
                                 field="builds[].arches", expected=f"of {ARCH_NAMES}; not_arm64: why not")  # fmt: skip
        downloads = tuple((d["os"], d["provider"]) for d in raw.get("downloads", ()))
        defaults = dict(chan_doc["runtime_defaults"])
        newest = tuple(int(x) for x in str(chan_doc["upstream_newest"]).split("."))
        distro_supported = {str(n) for n in chan_doc["distro_supported"]}
        channels = {
            str(name): ReleaseChannel(
                str(name),
                c["kubernetes_version"],
                int(c["release"]),
                tuple((str(o), tuple(str(v) for v in vs)) for o, vs in (c.get("os_versions") or {}).items()),
                _support(str(name), newest, distro_supported),
                Runtime(**{**defaults, **(c.get("runtime") or {})}),
                tuple(sorted((int(n), str(v)) for n, v in (c.get("releases") or {}).items())),
            )
            for name, c in raw_channels.items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"malformed entry: {exc!r}", source=path) from None
    for ch in channels.values():
        if not re.fullmatch(r"[0-9]+-[0-9]+", ch.name) or not ch.kubernetes_version.startswith(f"v{ch.minor}."):
            raise InputError(f"channel {ch.name} does not match {ch.kubernetes_version}", source=chan_path)
        for what, version in (("containerd", ch.runtime.containerd), ("crictl", ch.runtime.crictl)):
            if not RUNTIME_VERSION.fullmatch(version):
                raise InputError(f"channel {ch.name}: {version!r}", source=chan_path, field=f"runtime.{what}",
                                 expected="a version like v2.3.1")  # fmt: skip
        for number, version in ch.releases:
            if number == ch.release or not version.startswith(f"v{ch.minor}."):
                raise InputError(f"channel {ch.name}: release {number} ({version})", source=chan_path,
                                 field="releases", expected=f"other releases of {ch.minor}, by number")  # fmt: skip
        problem = runtime_problem(ch.runtime.containerd, ch.minor_number)
        if problem:
            raise InputError(f"channel {ch.name}: {problem}", source=chan_path, field="runtime.containerd")
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
        upstream_runtime=_upstream_runtime(chan_doc, chan_path, {c.runtime.containerd for c in channels.values()}),
        upstream_newest=newest[1],
    )
