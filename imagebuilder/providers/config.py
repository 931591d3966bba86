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
from imagebuilder.catalog import OsVersion
from imagebuilder.errors import InputError, InputErrors, did_you_mean
from imagebuilder.files import load_json_object
from imagebuilder.validation import Problem, StrictModel, pydantic_problems

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
        None, description="https URL of the OS-3 ISO, or a path to it (relative paths from the config file's folder)"
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
            problems += [
                Problem(f, f"applies only to --os redhat builds; remove it for --os {ctx.os}")
                for f in cls.os3_fields
                if f in data
            ]
            return problems
        desc = {n: cls.model_fields[n].description for n in cls.os3_fields}
        problems += [Problem(f, "required for --os redhat builds", desc[f]) for f in cls.os3_required if f not in data]
        checksum, kind = data.get("iso_checksum"), data.get("iso_checksum_type", "sha256")
        digits = grammar.DIGEST_HEX_LENGTH.get(kind)
        if isinstance(checksum, str) and digits and not grammar.is_hex_digest(checksum.removeprefix(f"{kind}:"), kind):
            problems.append(Problem("iso_checksum", f"is not a {kind} checksum", f"{digits} hex digits for {kind}"))
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
