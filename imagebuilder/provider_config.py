"""Validated models of the provider configuration files (spec 2.3).

A config file is checked in three passes, and every problem of all passes is reported together (one run of the
command tells the user everything that is wrong with the file):

1. keys: reference-tool names (``vcenter_server``...) are mapped to the spec's names; unknown keys get a
   "did you mean"; a key given under both names is an error;
2. rules that span fields or depend on the build (OS-3 fields only and always for ``redhat``, mutually exclusive
   fields, "cluster or resource_pool"...);
3. each value's type and format, by the pydantic model.

The spec says every value is a string. Booleans are the strings ``"true"``/``"false"``; JSON ``true``/``false``
are accepted and normalised. Numbers may be given as numbers or numeric strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from imagebuilder import grammar
from imagebuilder.errors import InputError, InputErrors, did_you_mean
from imagebuilder.files import load_json_object
from imagebuilder.model import OsVersion, load_catalog
from imagebuilder.workspace import workspace_root

# --- value types -----------------------------------------------------------------------------------------------


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise ValueError(f'must be the string "true" or "false", got {value!r}')


def _to_int(lo: int, hi: int) -> Callable[[Any], int]:
    def conv(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"must be a whole number from {lo} to {hi}, got {value!r}")
        text = str(value).strip()
        if not re.fullmatch(r"\d+", text):
            raise ValueError(f"must be a whole number from {lo} to {hi}, got {value!r}")
        number = int(text)
        if not lo <= number <= hi:
            raise ValueError(f"must be from {lo} to {hi}, got {number}")
        return number

    return conv


def _non_empty(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    return value.strip() if isinstance(value, str) else value


def _host(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    value = value.strip()
    if "://" in value:
        raise ValueError(f"must be a host name or IP address, not a URL: {value!r}")
    try:
        grammar.host_port(value)
    except ValueError:
        raise ValueError(
            f"must be an IP address or a fully qualified domain name[:port 1-65535], got {value!r}"
        ) from None
    return value


BoolStr = Annotated[
    bool,
    BeforeValidator(_to_bool),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["true", "false"]}, {"type": "boolean"}]}),
]
Text = Annotated[str, BeforeValidator(_non_empty), Field(min_length=1)]
Secret = Annotated[SecretStr, BeforeValidator(_non_empty), WithJsonSchema({"type": "string", "writeOnly": True})]
Host = Annotated[str, BeforeValidator(_host), WithJsonSchema({"type": "string", "format": "hostname"})]
Port = Annotated[
    int,
    BeforeValidator(_to_int(1, 65535)),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^\d+$"}, {"type": "integer"}]}),
]
Size = Annotated[
    int,
    BeforeValidator(_to_int(1, 65536)),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^\d+$"}, {"type": "integer"}]}),
]


def _alias(name: str, *aliases: str) -> AliasChoices:
    return AliasChoices(name, *aliases)


# --- build context ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigContext:
    """What a config file is validated against: the build's OS and version, and where the file lives."""

    os: str
    os_version: OsVersion
    source: Path

    @property
    def base_dir(self) -> Path:
        return self.source.parent


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    expected: str | None = None


def _ctx(info: ValidationInfo) -> ConfigContext | None:
    return info.context.get("ctx") if isinstance(info.context, dict) else None


def _url_or_existing_file(value: str | None, info: ValidationInfo, what: str) -> str | None:
    """An https URL, or a path to an existing file (relative paths from the config file's folder), made absolute."""
    if value is None:
        return None
    if value.startswith("https://"):
        if len(value) <= len("https://"):
            raise ValueError("https URL has no host")
        return value
    if "://" in value and not value.startswith("file://"):
        raise ValueError(f"must be an https URL or a file path, got {value!r}")
    path = Path(value.removeprefix("file://")).expanduser()
    ctx = _ctx(info)
    if not path.is_absolute() and ctx is not None:
        path = ctx.base_dir / path
    if not path.is_file():
        raise ValueError(f"{what} file {str(path)!r} does not exist")
    return str(path.resolve())


# --- models ----------------------------------------------------------------------------------------------------


class ProviderConfig(BaseModel):
    """Base of every provider config model."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    provider: ClassVar[str]

    @classmethod
    def accepted_keys(cls) -> dict[str, str]:
        """Every key the file may use, mapped to the spec's field name."""
        keys: dict[str, str] = {}
        for name, info in cls.model_fields.items():
            keys[name] = name
            if isinstance(info.validation_alias, AliasChoices):
                for choice in info.validation_alias.choices:
                    if isinstance(choice, str):
                        keys[choice] = name
        return keys

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        """Rules that span fields or depend on the build; ``data`` uses the spec's names."""
        return []

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        """Defaults that depend on the build (e.g. the OS version)."""

    def secret_values(self) -> list[str]:
        """The secrets this config holds, so callers can keep them out of argv, logs and files."""
        return [
            v.get_secret_value()
            for v in (getattr(self, n) for n in type(self).model_fields)
            if isinstance(v, SecretStr)
        ]

    def public_dict(self) -> dict[str, Any]:
        """All values with secrets masked: safe for logs, plans and manifests."""
        out = self.model_dump(mode="json")
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                out[name] = "********"
            elif isinstance(value, bool):
                out[name] = "true" if value else "false"  # the file format's spelling (spec 2.3)
        return out


class Os3Fields(ProviderConfig):
    """OS-3 (redhat) fields, shared by the vsphere, cloudstack and baremetal configs (spec 2.3)."""

    iso_url: str | None = Field(
        None, description="https URL of the OS-3 ISO, or a path to it (relative paths from the config file's folder)"
    )
    iso_checksum: str | None = Field(None, description="hex checksum of the ISO, of the kind iso_checksum_type")
    iso_checksum_type: Literal["sha256", "sha512"] | None = Field(
        None, description="checksum algorithm: sha256 (default) or sha512"
    )
    enterprise_username: Text | None = Field(
        None, validation_alias=_alias("enterprise_username", "rhel_username"), description="OS-3 subscription user"
    )
    enterprise_password: Secret | None = Field(
        None,
        validation_alias=_alias("enterprise_password", "rhel_password"),
        description="OS-3 subscription password (secret)",
    )

    os3_fields: ClassVar[tuple[str, ...]] = (
        "iso_url",
        "iso_checksum",
        "iso_checksum_type",
        "enterprise_username",
        "enterprise_password",
    )
    os3_required: ClassVar[tuple[str, ...]] = ("iso_url", "iso_checksum", "enterprise_username", "enterprise_password")

    @field_validator("iso_url")
    @classmethod
    def _iso_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _url_or_existing_file(value, info, "ISO")

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        if ctx.os != "redhat":
            problems += [
                Problem(f, f"applies only to --os redhat builds; remove it for --os {ctx.os}")
                for f in cls.os3_fields
                if f in data
            ]
            return problems
        desc = {n: cls.model_fields[n].description for n in cls.os3_fields}
        problems += [Problem(f, "required for --os redhat builds", desc[f]) for f in cls.os3_required if f not in data]
        checksum, kind = data.get("iso_checksum"), data.get("iso_checksum_type", "sha256")
        lengths = {"sha256": 64, "sha512": 128}
        if isinstance(checksum, str) and kind in lengths:
            value = checksum.removeprefix(f"{kind}:")
            if not re.fullmatch(rf"[0-9a-fA-F]{{{lengths[kind]}}}", value):
                problems.append(
                    Problem("iso_checksum", f"is not a {kind} checksum", f"{lengths[kind]} hex digits for {kind}")
                )
        return problems

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        super().fill_defaults(data, ctx)
        if ctx.os == "redhat":
            data.setdefault("iso_checksum_type", "sha256")
        if isinstance(data.get("iso_checksum"), str):
            data["iso_checksum"] = data["iso_checksum"].split(":", 1)[-1].lower()


class SourceImageFields(ProviderConfig):
    """An OS-2 cloud-style disk image to start from instead of the ISO install (bare metal and vSphere).

    Sites without internet, and these test machines, cannot download the official Ubuntu images; ``image.base``
    makes a Debian-family image of the same shape. On a networked machine the default stays the ISO install.
    """

    source_image_url: str | None = Field(
        None, description="OS-2 disk image (qcow2 or raw) to start from: https URL or path (relative to this file)"
    )
    source_image_checksum: str | None = Field(
        None, description="checksum of source_image_url: sha256:<hex>, sha512:<hex> or a bare sha256"
    )

    @field_validator("source_image_url")
    @classmethod
    def _source_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _url_or_existing_file(value, info, "image")

    @field_validator("source_image_checksum")
    @classmethod
    def _source_checksum(cls, value: str | None) -> str | None:
        if value is None:
            return None
        kind, _, digest = value.rpartition(":")
        kind = kind or "sha256"
        lengths = {"sha256": 64, "sha512": 128}
        if kind not in lengths or not re.fullmatch(rf"[0-9a-fA-F]{{{lengths.get(kind, 0)}}}", digest):
            raise ValueError(f"must be sha256:<64 hex>, sha512:<128 hex> or a bare sha256, got {value!r}")
        return f"{kind}:{digest.lower()}"

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        has_url, has_sum = "source_image_url" in data, "source_image_checksum" in data
        if ctx.os != "ubuntu" and (has_url or has_sum):
            field = "source_image_url" if has_url else "source_image_checksum"
            problems.append(Problem(field, "applies only to --os ubuntu; redhat installs from iso_url"))
        elif has_url and not has_sum:
            problems.append(Problem("source_image_checksum", "required with source_image_url", "sha256:<hex>"))
        elif has_sum and not has_url:
            problems.append(Problem("source_image_url", "required with source_image_checksum", "a URL or path"))
        return problems

    @property
    def uses_source_image(self) -> bool:
        return self.source_image_url is not None


class VsphereConfig(Os3Fields, SourceImageFields):
    """vSphere (platform) build configuration, ``--vsphere-config`` (spec 2.3)."""

    provider = "vsphere"

    platform_server: Host | None = Field(
        None, validation_alias=_alias("platform_server", "vcenter_server"), description="vCenter FQDN or IP"
    )
    username: Text | None = Field(None, description="vCenter user name")
    password: Secret | None = Field(None, description="vCenter password (secret)")
    datacenter: Text | None = Field(None, description="datacenter used for building")
    datastore: Text | None = Field(None, description="datastore for the template and the build")
    network: Text | None = Field(None, description="network used for building")
    folder: Text | None = Field(None, description="folder in which the temporary VM is created")
    cluster: Text | None = Field(None, description="cluster used for building (this or resource_pool)")
    resource_pool: Text | None = Field(None, description="resource pool for the build VM (this or cluster)")
    platform_library_name: Text | None = Field(
        None,
        validation_alias=_alias("platform_library_name", "vsphere_library_name"),
        description="content library name",
    )
    convert_to_template: BoolStr = Field(False, description='"true" converts the VM to a template')
    create_snapshot: BoolStr = Field(False, description='"true" snapshots the base OVA after the build')
    insecure_connection: BoolStr = Field(False, description='"true" skips TLS verification of vCenter')
    linked_clone: BoolStr = Field(False, description='"true" uses a linked clone')

    #: what a build on vCenter needs; a local OVA build (source image, no platform_server) needs none of them
    vcenter_required: ClassVar[tuple[str, ...]] = (
        "platform_server",
        "username",
        "password",
        "datacenter",
        "datastore",
        "network",
        "folder",
        "platform_library_name",
    )

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        if "source_image_url" in data and "platform_server" not in data:
            return problems  # local OVA: built with QEMU here, nothing on vCenter
        problems += [
            Problem(f, "required field is missing", cls.model_fields[f].description)
            for f in cls.vcenter_required
            if f not in data
        ]
        if not data.get("cluster") and not data.get("resource_pool"):
            problems.append(
                Problem("cluster", "neither cluster nor resource_pool is set", "a cluster or a resource pool name")
            )
        return problems

    @property
    def is_local(self) -> bool:
        """A local OVA build: QEMU here, converted to an OVA; no vCenter involved."""
        return self.uses_source_image and self.platform_server is None


class BaremetalConfig(Os3Fields, SourceImageFields):
    """Bare metal build configuration, ``--baremetal-config`` (optional for ubuntu, spec 1.6)."""

    provider = "baremetal"

    extra_rpms: str | None = Field(None, description="space-separated RPM packages to add (redhat only)")

    @field_validator("extra_rpms")
    @classmethod
    def _rpms(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = value.split()
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+:-]*", n)]
        if not names or bad:
            raise ValueError(f"is not a space-separated list of RPM names: bad {bad or [value]!r}")
        return " ".join(names)

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        if "extra_rpms" in data and ctx.os != "redhat":
            problems.append(Problem("extra_rpms", "applies only to --os redhat (RPM packages)"))
        return problems


class CloudstackConfig(Os3Fields):
    """CloudStack (orchestrator) build configuration, ``--cloudstack-config``.

    The spec shows only the OS-3 fields. The build itself runs locally (qemu -> qcow2); the access fields are what
    registering the qcow2 as a template takes (CloudStack's registerTemplate API). They go together: give all four
    required ones or none (then the qcow2 is built and the template step is skipped).
    """

    provider = "cloudstack"
    access_required: ClassVar[tuple[str, ...]] = (
        "cloudstack_api_url",
        "cloudstack_api_key",
        "cloudstack_secret_key",
        "cloudstack_zone",
    )

    cloudstack_api_url: str | None = Field(
        None, description="API endpoint, e.g. https://cloudstack.example.com/client/api"
    )
    cloudstack_api_key: Secret | None = Field(None, description="API key of the account (secret)")
    cloudstack_secret_key: Secret | None = Field(None, description="secret key of the account (secret)")
    cloudstack_zone: Text | None = Field(None, description="zone the template is registered in")
    cloudstack_domain: Text | None = Field(None, description="domain of the account (default ROOT)")
    cloudstack_account: Text | None = Field(None, description="account owning the template (default: the key's)")
    cloudstack_os_type: Text = Field("Other Linux (64-bit)", description="CloudStack OS type of the template")
    cloudstack_insecure: BoolStr = Field(False, description='"true" skips TLS verification of the API')

    @field_validator("cloudstack_api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", value):
            raise ValueError(f"must be an http(s) URL of the CloudStack API, got {value!r}")
        return value

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        access = [f for f in cls.model_fields if f.startswith("cloudstack_") and f in data]
        if access:
            problems += [
                Problem(f, "is required when any CloudStack access field is given", cls.model_fields[f].description)
                for f in cls.access_required
                if f not in data
            ]
        return problems

    @property
    def registers_template(self) -> bool:
        return self.cloudstack_api_url is not None


_VOLUME_TYPES = ("standard", "gp2", "gp3", "io1", "io2", "sc1", "st1")
_OWNER_ALIASES = ("amazon", "aws-marketplace", "self", "aws-backup-vault")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")


class AmiConfig(ProviderConfig):
    """Machine image (AMI) build configuration, ``--ami-config`` (spec 2.3)."""

    provider = "ami"

    image_filter_name: Text = Field(
        "",
        validation_alias=_alias("image_filter_name", "ami_filter_name"),
        description="source AMI name filter (default: the OS-2 server images of --os-version)",
    )
    image_filter_owners: str = Field(
        "",
        validation_alias=_alias("image_filter_owners", "ami_filter_owners"),
        description="owner account ID(s) or alias (amazon, aws-marketplace, self), comma-separated",
    )
    image_regions: list[str] = Field(
        default_factory=list,
        validation_alias=_alias("image_regions", "ami_regions"),
        description="regions to copy the AMI to (list, or comma-separated string; default: cloud_region)",
    )
    cloud_region: str = Field(
        "", validation_alias=_alias("cloud_region", "aws_region"), description="region of the builder instance"
    )
    config_mgmt_extra_vars: str | None = Field(
        None,
        validation_alias=_alias("config_mgmt_extra_vars", "ansible_extra_vars"),
        description="@ followed by the absolute path of an Ansible extra-vars file",
    )
    builder_instance_type: str = Field("", description="instance type of the builder (default t3.small)")
    custom_role: BoolStr = Field(False, description='"true" runs custom roles before the sysprep role')
    custom_role_name_list: list[str] | None = Field(
        None, description="absolute paths of custom roles (exclusive with custom_role_names)"
    )
    custom_role_names: str | None = Field(
        None, description="space-separated custom role names (exclusive with custom_role_name_list)"
    )
    manifest_output: str | None = Field(
        None, description="absolute path of the build manifest, outside the build workspace"
    )
    root_device_name: str = Field("", description="device name of the root volume (default /dev/sda1)")
    volume_size: Size = Field(0, description="root volume size in GiB (default 25)")
    volume_type: Literal["standard", "gp2", "gp3", "io1", "io2", "sc1", "st1"] = Field(
        "gp3", description="root volume type (EBS)"
    )

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        defaults = load_catalog().ami_defaults
        if ctx.os_version.ami_filter_name:
            data.setdefault("image_filter_name", ctx.os_version.ami_filter_name)
        for key in ("image_filter_owners", "cloud_region", "builder_instance_type", "root_device_name"):
            data.setdefault(key, defaults[key])
        data.setdefault("volume_size", defaults["volume_size"])
        data.setdefault("volume_type", defaults["volume_type"])
        regions = data.get("image_regions")
        if isinstance(regions, str):
            data["image_regions"] = [r for r in re.split(r"[,\s]+", regions) if r]
        if not data.get("image_regions") and isinstance(data.get("cloud_region"), str):
            data["image_regions"] = [data["cloud_region"]]

    @field_validator("image_filter_owners")
    @classmethod
    def _owners(cls, value: str) -> str:
        owners = [o for o in re.split(r"[,\s]+", value) if o]
        bad = [o for o in owners if not (re.fullmatch(r"\d{12}", o) or o in _OWNER_ALIASES)]
        if not owners or bad:
            raise ValueError(f"must be 12-digit account IDs or one of {', '.join(_OWNER_ALIASES)}, got {value!r}")
        return ",".join(owners)

    @field_validator("image_regions")
    @classmethod
    def _regions(cls, value: list[str]) -> list[str]:
        bad = [r for r in value if not _REGION.fullmatch(r)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an AWS region name (like us-west-2)")
        return value

    @field_validator("cloud_region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not an AWS region name (like us-west-2)")
        return value

    @field_validator("config_mgmt_extra_vars")
    @classmethod
    def _extra_vars(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = value[1:] if value.startswith("@") else None
        if path is None or not path.startswith("/"):
            raise ValueError(f"must be '@' followed by an absolute path, got {value!r}")
        if not Path(path).is_file():
            raise ValueError(f"extra-vars file {path!r} does not exist")
        return value

    @field_validator("builder_instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", value):
            raise ValueError(f"{value!r} is not an EC2 instance type (like t3.small)")
        return value

    @field_validator("custom_role_name_list")
    @classmethod
    def _role_paths(cls, value: list[str] | None) -> list[str] | None:
        for path in value or []:
            if not path.startswith("/"):
                raise ValueError(f"role path {path!r} is not absolute")
            if not Path(path).is_dir():
                raise ValueError(f"role directory {path!r} does not exist")
        return value

    @field_validator("custom_role_names")
    @classmethod
    def _role_names(cls, value: str | None) -> str | None:
        if value is not None and not value.split():
            raise ValueError("must name at least one role")
        return value

    @field_validator("manifest_output")
    @classmethod
    def _manifest_output(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value)
        if not path.is_absolute():
            raise ValueError(f"must be an absolute path, got {value!r}")
        root = workspace_root()
        if path.resolve().is_relative_to(root.resolve()):
            raise ValueError(f"lies inside the build workspace {str(root)!r}, which is removed after each build")
        return value

    @field_validator("root_device_name")
    @classmethod
    def _root_device(cls, value: str) -> str:
        if not re.fullmatch(r"/dev/[a-z0-9]+", value):
            raise ValueError(f"must be a device name like /dev/sda1 or /dev/xvda, got {value!r}")
        return value

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        has_list, has_names = "custom_role_name_list" in data, "custom_role_names" in data
        if has_list and has_names:
            problems.append(
                Problem(
                    "custom_role_names",
                    "custom_role_name_list and custom_role_names are mutually exclusive (spec 7.3)",
                    "only one of them",
                )
            )
        if data.get("custom_role") in (True, "true") and not (has_list or has_names):
            problems.append(
                Problem("custom_role", '"true" needs custom_role_name_list or custom_role_names', "one of them set")
            )
        return problems


class NutanixConfig(ProviderConfig):
    """Nutanix (hci) build configuration, ``--nutanix-config`` (spec 2.3)."""

    provider = "nutanix"

    hci_cluster_name: Text = Field(
        validation_alias=_alias("hci_cluster_name", "nutanix_cluster_name"), description="Prism cluster name"
    )
    source_image_name: Text = Field(description="name of the uploaded source cloud image (spec 4.3)")
    image_name: Text | None = Field(None, description="name of the destination image (default: the artifact name)")
    hci_subnet_name: Text = Field(
        validation_alias=_alias("hci_subnet_name", "nutanix_subnet_name"), description="subnet name"
    )
    hci_endpoint: Host = Field(
        validation_alias=_alias("hci_endpoint", "nutanix_endpoint"), description="Prism Central IP or FQDN"
    )
    hci_insecure: BoolStr = Field(
        False, validation_alias=_alias("hci_insecure", "nutanix_insecure"), description='"true" skips TLS checks'
    )
    hci_port: Port = Field(
        9440, validation_alias=_alias("hci_port", "nutanix_port"), description="Prism port (default 9440)"
    )
    hci_username: Text = Field(
        validation_alias=_alias("hci_username", "nutanix_username"), description="user with admin permissions"
    )
    hci_password: Secret = Field(
        validation_alias=_alias("hci_password", "nutanix_password"), description="password (secret)"
    )

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        data.setdefault("hci_port", load_catalog().nutanix_defaults["hci_port"])


MODELS: dict[str, type[ProviderConfig]] = {
    m.provider: m for m in (VsphereConfig, BaremetalConfig, CloudstackConfig, AmiConfig, NutanixConfig)
}


# --- loading ---------------------------------------------------------------------------------------------------


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_MESSAGES = {
    "missing": "required field is missing",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "extra_forbidden": "unknown field",
}


def pydantic_problems(exc: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """A pydantic error as our problems: the field path as the user writes it, a plain message, and (for a
    missing field of ``model``) what is expected."""
    problems = []
    for err in exc.errors():
        field = _loc(err["loc"])
        kind = err["type"]
        msg = _MESSAGES.get(kind) or str(err["msg"]).removeprefix("Value error, ")
        expected = None
        top = err["loc"][0] if err["loc"] else None
        info = model.model_fields.get(str(top)) if model is not None and top is not None else None
        if kind == "missing" and info is not None:
            expected = info.description
        elif kind == "literal_error":
            msg = f"got {err['input']!r}"
            expected = str(err["msg"]).removeprefix("Input should be ")
        problems.append(Problem(field, msg, expected))
    return problems


def canonical_keys(
    raw: dict[str, Any], model: type[ProviderConfig]
) -> tuple[dict[str, Any], dict[str, str], list[Problem]]:
    """Map alias keys to the spec's names; report unknown and doubled keys.

    Returns the data under the spec's names, each name's key as the file spells it, and the problems.
    """
    accepted = model.accepted_keys()
    data: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    problems: list[Problem] = []
    for key, value in raw.items():
        name = accepted.get(key)
        if name is None:
            problems.append(Problem(key, f"unknown field for the {model.provider} config{did_you_mean(key, accepted)}"))
            continue
        if name in data:
            problems.append(Problem(key, f"given twice, as '{given_as[name]}' and '{key}'", "one of them"))
            continue
        data[name], given_as[name] = value, key
    return data, given_as, problems


def load_provider_config(provider: str, path: str | Path, ctx: ConfigContext) -> ProviderConfig:
    """Load and validate a provider config file, raising one :class:`InputErrors` listing every problem."""
    model = MODELS[provider]
    raw = load_json_object(path, f"{provider} config file")
    return validate_provider_config(model, raw, ctx)


def validate_provider_config(model: type[ProviderConfig], raw: dict[str, Any], ctx: ConfigContext) -> ProviderConfig:
    data, given_as, problems = canonical_keys(raw, model)
    model.fill_defaults(data, ctx)
    problems += model.cross_check(data, ctx)
    config: ProviderConfig | None = None
    try:
        config = model.model_validate(data, context={"ctx": ctx})
    except ValidationError as exc:
        problems += pydantic_problems(exc, model)
    if problems:
        seen: set[tuple[str, str]] = set()
        errors = []
        for p in problems:
            if (p.field, p.message) not in seen:
                seen.add((p.field, p.message))
                # name the key as the user wrote it (an alias stays an alias in the message)
                head, dot, rest = p.field.partition(".")
                bracket = head.find("[")
                root = head if bracket < 0 else head[:bracket]
                shown = given_as.get(root, root) + head[len(root) :] + dot + rest
                errors.append(InputError(p.message, source=ctx.source, field=shown, expected=p.expected))
        raise InputErrors(errors)
    assert config is not None
    return config


def json_schema(provider: str) -> dict[str, Any]:
    """JSON Schema of a provider config, for editors; reference-tool aliases are listed in descriptions."""
    model = MODELS[provider]
    schema = model.model_json_schema(mode="validation", by_alias=False)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"image-builder {provider} config"
    schema["additionalProperties"] = False
    props = schema.get("properties", {})
    for key, name in model.accepted_keys().items():
        if key != name and name in props:
            prop = props[name]
            prop["description"] = f"{prop.get('description', '')} (alias: {key})".strip()
            props.setdefault(key, {"$ref": f"#/properties/{name}", "deprecated": True})
    for prop in props.values():
        prop.pop("title", None)
    if model is VsphereConfig:
        schema["if"] = {"not": {"required": ["source_image_url"]}}
        schema["then"] = {"required": list(VsphereConfig.vcenter_required)}
    return schema
