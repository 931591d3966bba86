"""The product profile (``config/profile.yaml``): the one home of every product-specific value.

The spec writes these as placeholders (``<p>``, ``<P>Users``, ``{assets_host}``...). Keeping them in one file lets
the rest of the code, templates and tests stay product-neutral and lets a site override them in one place.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from imagebuilder.errors import InputError
from imagebuilder.files import load_yaml_mapping


def config_dir() -> Path:
    """The project's ``config/`` directory (``IMAGE_BUILDER_CONFIG_DIR`` overrides it)."""
    env = os.environ.get("IMAGE_BUILDER_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "config"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Product(_Strict):
    short_name: str
    display_name: str
    api_group: str
    env_prefix: str


class VsphereUser(_Strict):
    api_version: str
    kind: str
    group: str
    global_role: str
    user_role: str
    admin_role: str


class VsphereTemplates(_Strict):
    library: str
    folder: str
    name: str


class ClusterSpec(_Strict):
    api_version: str
    cluster_kind: str
    datacenter_kind: str
    machine_kind: str


class Distro(_Strict):
    name: str
    manifest_url: str
    manifest_api_version: str
    image_registry: str


class Tags(_Strict):
    os_category: str
    release_category: str


class Hosts(_Strict):
    assets: str
    distro: str
    os1_cache: str
    os1_updates: str


class Versions(_Strict):
    image_builder: str
    bundle: int
    os1_image: str


class Profile(_Strict):
    product: Product
    vsphere_user: VsphereUser
    vsphere_templates: VsphereTemplates
    cluster_spec: ClusterSpec
    distro: Distro
    tags: Tags
    hosts: Hosts
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
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(first["msg"], source=path, field=".".join(str(p) for p in first["loc"])) from None
