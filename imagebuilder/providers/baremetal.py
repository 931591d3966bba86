"""Bare metal: a raw disk built with QEMU from the OS-2 ISO (or a source image) or the OS-3 ISO, compressed
with pigz (spec 1.6, 2.3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from imagebuilder.outputs import Packaged, compress, qemu_disk
from imagebuilder.plan import BuildPlan
from imagebuilder.progress import Say
from imagebuilder.providers.base import SUBSCRIPTION, SYSPREP, Provider, node_step
from imagebuilder.providers.config import ConfigContext, Os3Fields, SourceImageFields
from imagebuilder.validation import Problem


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
            if config.extra_rpms:
                steps.append(f"install extra RPMs: {config.extra_rpms}")
        elif config is not None and config.source_image_url:
            steps = [f"packer: qemu builder, raw disk, from the source image {config.source_image_url}"]
        else:
            steps = ["packer: qemu builder, raw disk, from the OS-2 live-server ISO (autoinstall)"]
        node = node_step(plan.kubernetes_version) + ", bare-metal cloud-init datasources"
        return [*steps, node, SYSPREP, f"compress raw -> {plan.output_name} (gzip)"]

    def ansible_vars(self, plan: BuildPlan) -> dict[str, Any]:
        config = plan.config
        return {"extra_rpms": (config.extra_rpms or "").split() if isinstance(config, BaremetalConfig) else []}

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        assert plan.output_path is not None
        return compress(qemu_disk(directory, plan.output_stem, status), plan.output_path, status)
