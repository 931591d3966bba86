"""vSphere (platform): an OVA built on vCenter with vsphere-iso, or locally with QEMU from a source image
(``source_image_url`` without ``platform_server``), then uploaded to a content library (spec 2.3, 4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from imagebuilder.core.files import sha256_file
from imagebuilder.core.progress import Say
from imagebuilder.core.validation import Problem
from imagebuilder.image.outputs import Packaged, exported_disk, qemu_disk, require_bootable
from imagebuilder.image.ova import make_ova
from imagebuilder.plan.config import (
    BoolStr,
    BuildExtras,
    ConfigContext,
    Host,
    Os3Fields,
    ProviderConfig,
    Secret,
    SourceImageFields,
    Text,
    alias,
)
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers.base import SUBSCRIPTION, SYSPREP, Provider, node_step


class VsphereConfig(Os3Fields, SourceImageFields, BuildExtras):
    """vSphere (platform) build configuration, ``--vsphere-config`` (spec 2.3)."""

    provider = "vsphere"

    platform_server: Host | None = Field(
        None, validation_alias=alias("platform_server", "vcenter_server"), description="vCenter FQDN or IP"
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
        validation_alias=alias("platform_library_name", "vsphere_library_name"),
        description="content library the OVA is uploaded to (absent: the OVA is only exported to the output folder)",
    )
    template: Text | None = Field(
        None,
        description="VM or template to clone instead of installing from the ISO (the reference's vsphere-clone"
        " builder); a name or an inventory path",
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
    )

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        if "source_image_url" in data and "platform_server" not in data:
            if "template" in data:
                problems.append(Problem("template", "clones on vCenter; a local OVA build (source_image_url) has none"))
            return problems  # local OVA: built with QEMU here, nothing on vCenter
        if "template" in data:  # a clone needs no ISO: the template already has its OS
            problems = [p for p in problems if not (p.field.startswith("iso_") and p.message.startswith("required"))]
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

    @classmethod
    def schema_rules(cls) -> dict[str, Any]:
        return {"if": {"not": {"required": ["source_image_url"]}}, "then": {"required": list(cls.vcenter_required)}}

    @property
    def is_local(self) -> bool:
        """A local OVA build: QEMU here, converted to an OVA; no vCenter involved."""
        return self.uses_source_image and self.platform_server is None


class Vsphere(Provider):
    name = "vsphere"
    config_model = VsphereConfig
    builder = "vsphere"
    secret_variables = ("vsphere_password",)

    @staticmethod
    def _config(plan: BuildPlan) -> VsphereConfig:
        assert isinstance(plan.config, VsphereConfig)
        return plan.config

    def builder_for(self, config: ProviderConfig | None) -> str:
        return "qemu" if isinstance(config, VsphereConfig) and config.is_local else self.builder

    def builders(self) -> tuple[str, ...]:
        return (self.builder, "qemu")  # vCenter, or the local OVA

    def steps(self, plan: BuildPlan) -> list[str]:
        config, name = self._config(plan), plan.output_name
        node = node_step(plan.kubernetes_version) + ", open-vm-tools, VMware guestinfo datasource"
        if config.is_local:
            return [
                f"packer: qemu builder, qcow2 disk, from the source image {config.source_image_url}"
                " (local OVA, no vCenter)",
                node,
                SYSPREP,
                f"convert the disk to a streamOptimized VMDK and package {name} (OVF descriptor, SHA256 manifest)",
            ]
        place = f"cluster {config.cluster}" if config.cluster else f"resource pool {config.resource_pool}"
        how = f"vsphere-clone of {config.template}" if config.template else "vsphere-iso"
        if config.template and plan.firmware == "efi":
            how += " (a clone boots as its template does: the template must be an EFI VM)"
        steps = [
            f"packer: {how} on {config.platform_server} (datacenter {config.datacenter}, {place},"
            f" datastore {config.datastore}, network {config.network}, folder {config.folder},"
            f" linked clone {str(config.linked_clone).lower()},"
            f" TLS {'not verified' if config.insecure_connection else 'verified'})"
        ]
        if plan.os == "redhat":
            steps.append(SUBSCRIPTION)
        steps += [
            node,
            SYSPREP,
            f"export OVA {name}",
        ]
        if config.platform_library_name:
            steps.append(f"upload {name} to content library {config.platform_library_name}")
        if config.create_snapshot:
            steps.append("snapshot the base VM")
        if config.convert_to_template:
            steps.append("convert the VM to a template")
        return steps

    def packer_context(self, plan: BuildPlan, ctx: dict[str, Any]) -> None:
        if not self._config(plan).is_local:
            ctx["secrets"] += list(self.secret_variables)
            template = self._config(plan).template
            ctx["stages"] = ("vsphere-clone.node",) if template else ("vsphere-iso.base", "vsphere-clone.node")

    def secret_env(self, plan: BuildPlan) -> dict[str, str]:
        config = self._config(plan)
        if config.is_local or config.password is None:
            return {}
        return {"PKR_VAR_vsphere_password": config.password.get_secret_value()}

    def disk_comes_here(self, config: ProviderConfig | None) -> bool:
        return True  # the local OVA's QEMU disk, or the VMDK the vsphere-clone build exports

    def built_disk(self, plan: BuildPlan, directory: Path, status: Say) -> Path:
        if self._config(plan).is_local:
            return qemu_disk(directory, plan.output_stem, status)
        source = exported_disk(directory)
        require_bootable(source, "the exported disk", work_dir=directory)
        return source

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        assert plan.output_path is not None
        source = self.built_disk(plan, directory, status)
        status("packaging the OVA (streamOptimized VMDK, OVF, manifest)")
        final = make_ova(
            source,
            plan.output_path,
            name=plan.output_stem,
            guest_os_type=plan.os_version.guest_os_type or "otherLinux64Guest",
            firmware=plan.firmware,
        )
        return Packaged(final, sha256_file(final), final.stat().st_size)
