"""The product profile (``config/profile.yaml``): the one home of every product-specific value.

The spec writes these as placeholders (``<p>``, ``<P>Users``, ``{assets_host}``...). Keeping them in one file lets
the rest of the code, templates and tests stay product-neutral and lets a site override them in one place.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import lru_cache
from typing import Any, TypeVar

from imagebuilder.errors import InputError, did_you_mean
from imagebuilder.files import load_yaml_mapping
from imagebuilder.paths import config_dir


class _Strict:
    """A section of the profile: every key known, every value of its declared type (no pydantic: the profile is
    read by every command, and this keeps start-up quick)."""


S = TypeVar("S", bound=_Strict)


def _build(cls: type[S], data: Any, where: str) -> S:
    if not isinstance(data, dict):
        raise InputError("must be a mapping", field=where or None)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            raise InputError(f"unknown field{did_you_mean(str(key), names)}", field=f"{where}{key}")
    values: dict[str, Any] = {}
    for name in names:
        if name not in data:
            raise InputError("required field is missing", field=f"{where}{name}")
        kind, value = hints[name], data[name]
        if isinstance(kind, type) and issubclass(kind, _Strict):
            values[name] = _build(kind, value, f"{where}{name}.")
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(f"got {value!r}", field=f"{where}{name}", expected=kind.__name__)
        else:
            values[name] = value
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class Product(_Strict):
    short_name: str
    display_name: str
    api_group: str
    env_prefix: str


@dataclasses.dataclass(frozen=True)
class VsphereUser(_Strict):
    api_version: str
    kind: str
    group: str
    global_role: str
    user_role: str
    admin_role: str


@dataclasses.dataclass(frozen=True)
class VsphereTemplates(_Strict):
    library: str
    folder: str
    name: str


@dataclasses.dataclass(frozen=True)
class ClusterSpec(_Strict):
    api_version: str
    cluster_kind: str
    datacenter_kind: str
    machine_kind: str


@dataclasses.dataclass(frozen=True)
class Distro(_Strict):
    name: str
    manifest_url: str
    manifest_api_version: str
    image_registry: str


@dataclasses.dataclass(frozen=True)
class Tags(_Strict):
    os_category: str
    release_category: str


@dataclasses.dataclass(frozen=True)
class Hosts(_Strict):
    assets: str
    distro: str
    os1_cache: str
    os1_updates: str


@dataclasses.dataclass(frozen=True)
class Os1(_Strict):
    root_url: str
    root_sha512: str
    metadata_url: str
    targets_url: str
    target_name: str
    vsphere_variant: str
    baremetal_variant: str


@dataclasses.dataclass(frozen=True)
class Versions(_Strict):
    image_builder: str
    bundle: int
    os1_image: str


@dataclasses.dataclass(frozen=True)
class Profile(_Strict):
    product: Product
    vsphere_user: VsphereUser
    vsphere_templates: VsphereTemplates
    cluster_spec: ClusterSpec
    distro: Distro
    tags: Tags
    hosts: Hosts
    os1: Os1
    versions: Versions

    def manifest_url(self, channel: str, number: int) -> str:
        return self.distro.manifest_url.format(distro_host=self.hosts.distro, channel=channel, number=number)

    def release_name(self, channel: str, number: int) -> str:
        """``kubernetes-1-24-eks-5``: the distro release name used in tags and manifests."""
        return f"kubernetes-{channel}-{self.distro.name}-{number}"


@lru_cache(maxsize=1)
def load_profile() -> Profile:
    path = config_dir() / "profile.yaml"
    data = load_yaml_mapping(path, "profile")
    try:
        return _build(Profile, data, "")
    except InputError as exc:
        raise InputError(exc.detail, source=path, field=exc.field, expected=exc.expected) from None
