"""The product profile (``config/profile.yaml``): the one home of every product-specific value.

The spec writes these as placeholders (``<p>``, ``<P>Users``, ``{assets_host}``...). Keeping them in one file lets
the rest of the code, templates and tests stay product-neutral and lets a site override them in one place.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import ConfigDict

from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.paths import config_dir
from imagebuilder.core.validation import StrictModel, validated


class _Section(StrictModel):
    """A section of the profile: every key known, every value exactly of its declared type (no coercion: a
    version written as a number is an error, not a surprise)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Product(_Section):
    short_name: str
    display_name: str
    api_group: str
    env_prefix: str


class VsphereUser(_Section):
    api_version: str
    kind: str
    group: str
    global_role: str
    user_role: str
    admin_role: str


class VsphereTemplates(_Section):
    library: str
    folder: str
    name: str


class ClusterSpecKinds(_Section):
    api_version: str
    cluster_kind: str
    datacenter_kind: str
    machine_kind: str


class Distro(_Section):
    name: str
    manifest_url: str
    manifest_api_version: str
    image_registry: str


class Tags(_Section):
    os_category: str
    release_category: str


class Hosts(_Section):
    assets: str
    distro: str
    os1_cache: str
    os1_updates: str


class Os1(_Section):
    root_url: str
    root_sha512: str
    metadata_url: str
    targets_url: str
    target_name: str
    vsphere_variant: str
    baremetal_variant: str


class Versions(_Section):
    image_builder: str
    bundle: int
    os1_image: str


class Attestations(_Section):
    """What the SBOM and the provenance say about who made an image (issue 31)."""

    #: SLSA ``buildDefinition.buildType``: the URI naming how this tool builds a node image
    build_type: str
    #: SLSA ``runDetails.builder.id``; ``{hostname}`` is the build host's name
    builder_id: str
    #: SPDX ``documentNamespace``; ``{name}`` the image's file name, ``{sha256}`` its digest
    spdx_namespace: str


class Profile(_Section):
    product: Product
    vsphere_user: VsphereUser
    vsphere_templates: VsphereTemplates
    cluster_spec: ClusterSpecKinds
    distro: Distro
    tags: Tags
    hosts: Hosts
    os1: Os1
    versions: Versions
    attestations: Attestations

    def manifest_url(self, channel: str, number: int) -> str:
        return self.distro.manifest_url.format(distro_host=self.hosts.distro, channel=channel, number=number)

    def release_name(self, channel: str, number: int) -> str:
        """``kubernetes-1-24-eks-36``: the distro release name used in tags and manifests."""
        return f"kubernetes-{channel}-{self.distro.name}-{number}"


@lru_cache(maxsize=1)
def load_profile() -> Profile:
    path = config_dir() / "profile.yaml"
    return validated(Profile, load_yaml_mapping(path, "profile"), path)
