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
from urllib.parse import unquote, urlsplit

from pydantic import (
    AliasChoices,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import InputError, InputErrors, did_you_mean
from imagebuilder.core.files import load_json_object
from imagebuilder.core.validation import Problem, StrictModel, pydantic_problems
from imagebuilder.customization.model import PACKAGE_NAME, Customization, build_extras
from imagebuilder.release.catalog import OsVersion

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
        if not re.fullmatch(r"[0-9]+", text):
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


def _http_url(value: Any) -> Any:
    """An http(s) URL without credentials, trimmed; a trailing '/' dropped (bases are joined with paths)."""
    if not isinstance(value, str):
        return value
    grammar.url(value.strip(), ("http", "https"))
    return value.strip().rstrip("/")


BoolStr = Annotated[
    bool,
    BeforeValidator(_to_bool),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["true", "false"]}, {"type": "boolean"}]}),
]
Text = Annotated[str, BeforeValidator(_non_empty), Field(min_length=1)]
Secret = Annotated[SecretStr, BeforeValidator(_non_empty), WithJsonSchema({"type": "string", "writeOnly": True})]
Host = Annotated[str, BeforeValidator(_host), WithJsonSchema({"type": "string", "format": "hostname"})]
HttpUrl = Annotated[str, BeforeValidator(_http_url), WithJsonSchema({"type": "string", "format": "uri"})]
Port = Annotated[
    int,
    BeforeValidator(_to_int(1, 65535)),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^[0-9]+$"}, {"type": "integer"}]}),
]
Size = Annotated[
    int,
    BeforeValidator(_to_int(1, 65536)),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^[0-9]+$"}, {"type": "integer"}]}),
]


def alias(name: str, *aliases: str) -> AliasChoices:
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


def _ctx(info: ValidationInfo) -> ConfigContext | None:
    return info.context.get("ctx") if isinstance(info.context, dict) else None


def _url_or_existing_file(value: str | None, info: ValidationInfo, what: str) -> str | None:
    """An https URL, or a path to an existing file (relative paths from the config file's folder), made absolute."""
    if value is None:
        return None
    if value.startswith(("https://", "http://")):
        # http too: the reference's air-gapped example serves the ISO so, and a checksum is always required with it
        grammar.url(value, ("https", "http"))
        return value
    if "://" in value and not value.startswith("file://"):
        raise ValueError(f"must be an http(s) URL or a file path, got {value!r}")
    path = Path(value.removeprefix("file://")).expanduser()
    ctx = _ctx(info)
    if not path.is_absolute() and ctx is not None:
        path = ctx.base_dir / path
    if not path.is_file():
        raise ValueError(f"{what} file {str(path)!r} does not exist")
    return str(path.resolve())


# --- models ----------------------------------------------------------------------------------------------------


class ProviderConfig(StrictModel):
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

    @classmethod
    def schema_rules(cls) -> dict[str, Any]:
        """JSON Schema keywords for the rules :meth:`cross_check` applies that a schema can express."""
        return {}

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
        None,
        description="http(s) URL of the ISO (OS-3; optional for OS-2) or a path to it (relative to this file)",
    )
    iso_checksum: str | None = Field(None, description="hex checksum of the ISO, of the kind iso_checksum_type")
    iso_checksum_type: Literal["sha256", "sha512"] | None = Field(
        None, description="checksum algorithm: sha256 (default) or sha512"
    )
    enterprise_username: Text | None = Field(
        None, validation_alias=alias("enterprise_username", "rhel_username"), description="OS-3 subscription user"
    )
    enterprise_password: Secret | None = Field(
        None,
        validation_alias=alias("enterprise_password", "rhel_password"),
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
            # an OS-2 build may name its own ISO (the reference's air-gapped example: a private copy over http)
            problems += [
                Problem(f, f"applies only to --os redhat builds; remove it for --os {ctx.os}")
                for f in cls.os3_fields
                if f in data and f.startswith("enterprise_")
            ]
            if ("iso_url" in data) != ("iso_checksum" in data):
                missing = "iso_checksum" if "iso_url" in data else "iso_url"
                problems.append(Problem(missing, "iso_url and iso_checksum go together", "both, or neither"))
            if "iso_url" in data and "source_image_url" in data:
                problems.append(Problem("iso_url", "give iso_url (install) or source_image_url (disk image), not both"))
        else:
            desc = {n: cls.model_fields[n].description for n in cls.os3_fields}
            required = cls.os3_required
            if "rhsm_activation_key" in data:  # a Satellite activation key replaces the subscription user
                required = tuple(f for f in required if not f.startswith("enterprise_"))
            problems += [Problem(f, "required for --os redhat builds", desc[f]) for f in required if f not in data]
        checksum, kind = data.get("iso_checksum"), data.get("iso_checksum_type", "sha256")
        digits = grammar.DIGEST_HEX_LENGTH.get(kind)
        if isinstance(checksum, str) and digits and not grammar.is_hex_digest(checksum.removeprefix(f"{kind}:"), kind):
            problems.append(Problem("iso_checksum", f"is not a {kind} checksum", f"{digits} hex digits for {kind}"))
        return problems

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        super().fill_defaults(data, ctx)
        if ctx.os == "redhat" or "iso_checksum" in data:
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
        if not grammar.is_hex_digest(digest, kind):
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


class BuildExtras(ProviderConfig):
    """Fields the reference tool reads from every provider config: proxies, extra packages and repositories,
    additional files, Red Hat Satellite registration, and the air-gapped artifact hosts.

    They are mapped onto this tool's model, not passed through: packages, repositories and files go through the
    build-time customization role (see :func:`imagebuilder.customization.model.build_extras`), proxies into Packer's,
    Ansible's and the build VM's environment, the private artifact hosts become the build's mirror.
    """

    http_proxy: str | None = Field(None, description="proxy for http:// requests: http(s)://[user:password@]host:port")
    https_proxy: str | None = Field(
        None, description="proxy for https:// requests: http(s)://[user:password@]host:port"
    )
    no_proxy: str | None = Field(
        None, description="hosts, domains and CIDRs reached without the proxy, comma-separated"
    )
    extra_debs: str | None = Field(None, description="space-separated Debian packages to add (ubuntu only)")
    extra_rpms: str | None = Field(None, description="space-separated RPM packages to add (redhat only)")
    extra_repos: str | None = Field(
        None,
        description="a file added to the package sources: an APT sources.list (ubuntu) or a .repo file (redhat),"
        " relative to this file",
    )
    disable_public_repos: BoolStr = Field(
        False, description='"true" removes the OS\'s public package sources (air-gapped builds use extra_repos)'
    )
    additional_files_list_file: str | None = Field(
        None,
        description="files.json: {additional_files_list: [{src, dest, owner, group, mode}]} copied into the image",
    )
    rhsm_server_hostname: Host | None = Field(None, description="Red Hat Satellite FQDN (redhat only)")
    rhsm_server_release_version: str | None = Field(
        None, description="Red Hat release the packages are pinned to, e.g. 8.10 or 9.4 (redhat only)"
    )
    rhsm_activation_key: Secret | None = Field(
        None, description="Satellite activation key (secret); replaces enterprise_username/password"
    )
    rhsm_org_id: Text | None = Field(None, description="Satellite organization ID (with rhsm_activation_key)")
    private_artifacts_eksd_fqdn: HttpUrl | None = Field(
        None, description="air-gapped: http(s) base URL of the distro artifacts, upstream paths kept (the mirror)"
    )
    private_artifacts_eksa_fqdn: HttpUrl | None = Field(
        None, description="air-gapped: http(s) base URL of the product artifacts, upstream paths kept"
    )
    eksa_build_tooling_repo_url: str | None = Field(
        None, description="the reference tool's build-tooling git URL; accepted, not needed (templates ship here)"
    )
    image_builder_repo_url: str | None = Field(
        None, description="the reference tool's image-builder git URL; accepted, not needed (templates ship here)"
    )

    @field_validator("http_proxy", "https_proxy")
    @classmethod
    def _proxy(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = grammar.url(value.strip(), ("http", "https"), credentials=True)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(
                f"a proxy URL is scheme://[user:password@]host[:port], got {untrusted.redact_url(value)!r}"
            )
        return value.strip().rstrip("/")

    @field_validator("no_proxy")
    @classmethod
    def _no_proxy(cls, value: str | None) -> str | None:
        return None if value is None else grammar.no_proxy_list(value.strip())

    @field_validator("extra_debs", "extra_rpms")
    @classmethod
    def _packages(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = value.split()
        bad = [n for n in names if not PACKAGE_NAME.fullmatch(n)]
        if not names or bad:
            raise ValueError(f"is not a space-separated list of package names: bad {(bad or [value])[:3]!r}")
        return " ".join(dict.fromkeys(names))

    @field_validator("extra_repos", "additional_files_list_file")
    @classmethod
    def _local_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if "://" in value:
            raise ValueError(f"must be a file on this host, got {value!r}")
        return _url_or_existing_file(value, info, "the")

    @field_validator("rhsm_server_release_version")
    @classmethod
    def _release(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", value.strip()):
            raise ValueError(f"must be a Red Hat release as MAJOR.MINOR, e.g. 8.10 or 9.4, got {value!r}")
        return None if value is None else value.strip()

    @field_validator("eksa_build_tooling_repo_url", "image_builder_repo_url")
    @classmethod
    def _git_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith("git@") and re.fullmatch(r"git@[A-Za-z0-9.-]+:[A-Za-z0-9._/~-]+", value):
            return value
        grammar.url(value, ("https", "http", "ssh", "git"))
        return value

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        only = {"extra_debs": "ubuntu", "extra_rpms": "redhat"}
        only.update(dict.fromkeys(RHSM_FIELDS, "redhat"))
        problems += [
            Problem(f, f"applies only to --os {os_name} builds; remove it for --os {ctx.os}")
            for f, os_name in only.items()
            if f in data and ctx.os != os_name
        ]
        if ("rhsm_activation_key" in data) != ("rhsm_org_id" in data):
            missing = "rhsm_org_id" if "rhsm_activation_key" in data else "rhsm_activation_key"
            problems.append(Problem(missing, "rhsm_activation_key and rhsm_org_id go together", "both, or neither"))
        release = data.get("rhsm_server_release_version")
        well_formed = isinstance(release, str) and re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", release.strip())
        if well_formed and ctx.os == "redhat" and str(release).split(".")[0] != ctx.os_version.version:
            problems.append(
                Problem(
                    "rhsm_server_release_version",
                    f"{release} is not a release of RHEL {ctx.os_version.version} (--os-version)",
                    f"{ctx.os_version.version}.<minor>",
                )
            )
        if "extra_repos" in data and ctx.os in ("ubuntu", "redhat") and isinstance(data["extra_repos"], str):
            problems += _repo_file_problems(data["extra_repos"], ctx)
        return problems

    def customization(self, os_name: str, source: Path, files_config: Path | None = None) -> Customization | None:
        """Extra packages, additional files and repositories as a build-time customization (None: nothing).

        ``files_config`` is the reference tool's ``--files-config``; it and ``additional_files_list_file`` are one
        option given two ways (the caller refuses both at once)."""
        packages = (self.extra_debs if os_name == "ubuntu" else self.extra_rpms) or ""
        files_list = files_config or (
            Path(self.additional_files_list_file) if self.additional_files_list_file else None
        )
        return build_extras(
            source=source,
            packages=packages.split(),
            files_list=files_list,
            repo_file=Path(self.extra_repos) if self.extra_repos else None,
            repo_suffix=".repo" if os_name == "redhat" else ".list",
            disable_public_repos=self.disable_public_repos,
        )

    @property
    def uses_activation_key(self) -> bool:
        return self.rhsm_activation_key is not None

    def proxies(self) -> dict[str, str]:
        """The proxy environment of the build (both spellings: tools differ in which they read)."""
        env: dict[str, str] = {}
        for name in ("http_proxy", "https_proxy", "no_proxy"):
            value = getattr(self, name)
            if value:
                env[name], env[name.upper()] = value, value
        return env

    def secret_values(self) -> list[str]:
        values = super().secret_values()
        for proxy in (self.http_proxy, self.https_proxy):
            parts = urlsplit(proxy) if proxy else None
            if parts is not None and parts.password:
                values += [parts.password, unquote(parts.password)]
        return values

    def public_dict(self) -> dict[str, Any]:
        out = super().public_dict()
        for name in ("http_proxy", "https_proxy"):
            if out.get(name):
                out[name] = untrusted.redact_url(out[name])
        return out


#: the Red Hat Satellite fields (redhat builds only)
RHSM_FIELDS = ("rhsm_server_hostname", "rhsm_server_release_version", "rhsm_activation_key", "rhsm_org_id")
_APT_LINE = re.compile(r"deb(-src)?\s+(\[[A-Za-z0-9=,. _/-]+\]\s+)?(https?|file|ftp)://\S+\s+\S+(\s+[A-Za-z0-9_./-]+)*")
_REPO_SECTION = re.compile(r"\[[A-Za-z0-9._:-]+\]")
_REPO_KEY = re.compile(r"[A-Za-z0-9_]+\s*=\s*[^\x00-\x08\x0b-\x1f]*")


def _repo_file_problems(value: str, ctx: ConfigContext) -> list[Problem]:
    """An extra_repos file must be what the OS's package manager reads: lines of an APT sources.list, or the
    sections of a yum .repo file. It is copied as is, so anything else would break the package manager."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = ctx.base_dir / path
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return []  # the field's own check reports a missing or unreadable file
    marker = re.search(r"\{[{%#]", text)
    if marker:  # the text travels as an Ansible variable: a template in it would run on this host
        line = text.count("\n", 0, marker.start()) + 1
        return [Problem("extra_repos", f"{path.name}: line {line} holds a template marker ({marker.group()})")]
    if any(ord(c) < 0x20 and c not in "\t\n" for c in text):
        return [Problem("extra_repos", f"{path.name} holds control characters")]
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and ln.strip()[0] != "#"]
    if ctx.os == "ubuntu":
        bad = [n for n, ln in lines if not _APT_LINE.fullmatch(ln)]
        expected = "APT sources.list lines: deb [options] URI suite [components]"
    else:
        bad = [n for n, ln in lines if not (_REPO_SECTION.fullmatch(ln) or _REPO_KEY.fullmatch(ln))]
        if lines and not _REPO_SECTION.fullmatch(lines[0][1]):
            bad = [lines[0][0], *bad]
        expected = "a yum .repo file: [section] lines, then key=value lines"
    if not lines:
        return [Problem("extra_repos", f"{path.name} has no repository in it", expected)]
    if bad:
        return [Problem("extra_repos", f"{path.name}: line {bad[0]} is not a repository line", expected)]
    return []


# --- loading ---------------------------------------------------------------------------------------------------


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


def load_provider_config(model: type[ProviderConfig], path: str | Path, ctx: ConfigContext) -> ProviderConfig:
    """Load and validate a provider config file, raising one :class:`InputErrors` listing every problem."""
    raw = load_json_object(path, f"{model.provider} config file")
    return validate_provider_config(model, raw, ctx)


def drop_empty(data: dict[str, Any], required: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Remove the fields whose value is an empty (or blank) string, as the reference tool reads them: it hands every
    config value to Packer as a variable whose default is ``""``, so ``""`` means "not set" (its documented vSphere
    file carries ``"template": ""``: build from the ISO). ``required`` fields stay, to be refused as empty. Returns
    the names removed, so a rule that then finds one missing can say it was given empty."""
    empty = {k for k, v in data.items() if isinstance(v, str) and not v.strip() and k not in required}
    for key in empty:
        del data[key]
    return empty


def validate_provider_config(model: type[ProviderConfig], raw: dict[str, Any], ctx: ConfigContext) -> ProviderConfig:
    data, given_as, problems = canonical_keys(raw, model)
    emptied = drop_empty(data, {k for k, f in model.model_fields.items() if f.is_required()})
    model.fill_defaults(data, ctx)
    problems += [
        Problem(p.field, "is empty, and it is required here", p.expected)
        if p.field in emptied and p.message.startswith("required")
        else p
        for p in model.cross_check(data, ctx)
    ]
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


def json_schema(model: type[ProviderConfig]) -> dict[str, Any]:
    """JSON Schema of a provider config, for editors; reference-tool aliases are listed in descriptions."""
    schema = model.model_json_schema(mode="validation", by_alias=False)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"image-builder {model.provider} config"
    schema["additionalProperties"] = False
    props = schema.get("properties", {})
    for key, name in model.accepted_keys().items():
        if key != name and name in props:
            prop = props[name]
            prop["description"] = f"{prop.get('description', '')} (alias: {key})".strip()
            props.setdefault(key, {"$ref": f"#/properties/{name}", "deprecated": True})
    for prop in props.values():
        prop.pop("title", None)
    schema.update(model.schema_rules())
    return schema
