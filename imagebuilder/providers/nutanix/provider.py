"""Nutanix (hci): a qcow2 built on Prism with the Nutanix plugin from an uploaded source image, imported into
the image service (spec 2.3). The image lives in Prism; the build keeps Packer's manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.progress import Say
from imagebuilder.core.validation import Problem
from imagebuilder.image.outputs import Packaged, packer_manifest, place
from imagebuilder.plan.config import (
    BoolStr,
    BuildExtras,
    ConfigContext,
    Host,
    HttpUrl,
    Port,
    Secret,
    Text,
    alias,
)
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers.base import SYSPREP, Provider, node_step
from imagebuilder.release.catalog import load_catalog


class NutanixConfig(BuildExtras):
    """Nutanix (hci) build configuration, ``--nutanix-config`` (spec 2.3)."""

    provider = "nutanix"

    hci_cluster_name: Text = Field(
        validation_alias=alias("hci_cluster_name", "nutanix_cluster_name"), description="Prism cluster name"
    )
    source_image_name: Text | None = Field(
        None, description="name of the uploaded source cloud image (spec 4.3); this or image_url"
    )
    image_url: HttpUrl | None = Field(
        None,
        description="http(s) URL of the source cloud image: Prism downloads and stores it (this or source_image_name)",
    )
    image_export: BoolStr = Field(False, description='"true" also downloads the built image to the output folder')
    image_name: Text | None = Field(None, description="name of the destination image (default: the artifact name)")
    hci_subnet_name: Text = Field(
        validation_alias=alias("hci_subnet_name", "nutanix_subnet_name"), description="subnet name"
    )
    hci_endpoint: Host = Field(
        validation_alias=alias("hci_endpoint", "nutanix_endpoint"), description="Prism Central IP or FQDN"
    )
    hci_insecure: BoolStr = Field(
        False, validation_alias=alias("hci_insecure", "nutanix_insecure"), description='"true" skips TLS checks'
    )
    hci_port: Port = Field(
        9440, validation_alias=alias("hci_port", "nutanix_port"), description="Prism port (default 9440)"
    )
    hci_username: Text = Field(
        validation_alias=alias("hci_username", "nutanix_username"), description="user with admin permissions"
    )
    hci_password: Secret = Field(
        validation_alias=alias("hci_password", "nutanix_password"), description="password (secret)"
    )

    @classmethod
    def fill_defaults(cls, data: dict[str, Any], ctx: ConfigContext) -> None:
        super().fill_defaults(data, ctx)
        data.setdefault("hci_port", load_catalog().nutanix_defaults["hci_port"])

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        if "source_image_name" not in data and "image_url" not in data:
            problems.append(Problem("source_image_name", "required field is missing", "source_image_name or image_url"))
        return problems


class Nutanix(Provider):
    name = "nutanix"
    config_model = NutanixConfig
    builder = "nutanix"
    http_seed = False
    inline_user_data = True
    secret_variables = ("nutanix_password",)

    @staticmethod
    def _config(plan: BuildPlan) -> NutanixConfig:
        assert isinstance(plan.config, NutanixConfig)
        return plan.config

    def steps(self, plan: BuildPlan) -> list[str]:
        config = self._config(plan)
        return [
            f"packer: nutanix on {config.hci_endpoint}:{config.hci_port} (cluster {config.hci_cluster_name},"
            f" subnet {config.hci_subnet_name}) from source image {config.source_image_name or config.image_url}",
            node_step(plan.kubernetes_version) + ", Nutanix cloud-init datasource",
            SYSPREP,
            f"import the qcow2 into the image service as {config.image_name or plan.output_name}",
            *([f"download the image to {plan.output_name} (image_export)"] if config.image_export else []),
        ]

    def packer_context(self, plan: BuildPlan, ctx: dict[str, Any]) -> None:
        ctx["secrets"] += list(self.secret_variables)

    def secret_env(self, plan: BuildPlan) -> dict[str, str]:
        return {"PKR_VAR_nutanix_password": self._config(plan).hci_password.get_secret_value()}

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        manifest = packer_manifest(self.packer_manifest_path(plan, directory))
        config = self._config(plan)
        if not config.image_export:
            return manifest
        # the plugin's image_export writes the image, named as in Prism, into Packer's working folder
        assert plan.output_path is not None
        exported = directory / (config.image_name or plan.output_stem)
        if not exported.is_file():
            raise ExternalError(
                f"image_export is set but Packer left no exported image at {exported}",
                hint="see the build log: the Nutanix plugin's export step failed",
            )
        status(f"moving the exported image to {plan.output_path}")
        placed = place(exported, plan.output_path)
        return Packaged(placed.artifact, placed.sha256, placed.size, manifest.extra)


def load_nutanix_config(path: Path) -> NutanixConfig:
    """The build's nutanix config read outside a build (``nutanix.image-upload``): validated as a build of the
    default OS would read it, every problem reported the usual way."""
    from imagebuilder.plan.config import load_provider_config

    os_ = load_catalog().os("ubuntu")
    config = load_provider_config(
        NutanixConfig, path, ConfigContext(os=os_.name, os_version=os_.version(None), source=path)
    )
    assert isinstance(config, NutanixConfig)
    return config
