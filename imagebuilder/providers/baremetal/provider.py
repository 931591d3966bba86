"""Bare metal: a raw disk built with QEMU from the OS-2 ISO (or a source image) or the OS-3 ISO, compressed to
gzip in members of one MiB (spec 1.6, 2.3)."""

from __future__ import annotations

from pathlib import Path

from imagebuilder.core.progress import Say
from imagebuilder.image.outputs import Packaged, compress
from imagebuilder.plan.config import BuildExtras, Os3Fields, SourceImageFields
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers.base import SUBSCRIPTION, SYSPREP, Provider, node_step


class BaremetalConfig(Os3Fields, SourceImageFields, BuildExtras):
    """Bare metal build configuration, ``--baremetal-config`` (optional for ubuntu, spec 1.6)."""

    provider = "baremetal"


class Baremetal(Provider):
    name = "baremetal"
    config_model = BaremetalConfig
    builder = "qemu"
    disk_format = "raw"

    def steps(self, plan: BuildPlan) -> list[str]:
        config = plan.config if isinstance(plan.config, BaremetalConfig) else None
        if plan.os == "redhat":
            assert config is not None
            steps = [f"packer: qemu builder, raw disk, from the OS-3 ISO {config.iso_url}", SUBSCRIPTION]
        elif config is not None and config.source_image_url:
            steps = [f"packer: qemu builder, raw disk, from the source image {config.source_image_url}"]
        else:
            steps = ["packer: qemu builder, raw disk, from the OS-2 live-server ISO (autoinstall)"]
        node = node_step(plan.kubernetes_version) + ", bare-metal cloud-init datasources"
        return [*steps, node, SYSPREP, f"compress raw -> {plan.output_name} (gzip)"]

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        assert plan.output_path is not None
        return compress(self.built_disk(plan, directory, status), plan.output_path, status)
