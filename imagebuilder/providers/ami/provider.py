"""AMI: an EBS-backed machine image built with amazon-ebs from an OS-2 source AMI, copied to regions
(spec 2.3, 7.3). The image lives in AWS; the build keeps Packer's manifest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from imagebuilder.core.paths import workspace_root
from imagebuilder.core.progress import Say
from imagebuilder.core.validation import Problem
from imagebuilder.image.outputs import Packaged, packer_manifest
from imagebuilder.plan.config import BoolStr, BuildExtras, ConfigContext, Size, Text, alias
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers.base import SYSPREP, Provider, node_step
from imagebuilder.release.catalog import load_catalog

_OWNER_ALIASES = ("amazon", "aws-marketplace", "self", "aws-backup-vault")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")


class AmiConfig(BuildExtras):
    """Machine image (AMI) build configuration, ``--ami-config`` (spec 2.3)."""

    provider = "ami"

    image_filter_name: Text = Field(
        "",
        validation_alias=alias("image_filter_name", "ami_filter_name"),
        description="source AMI name filter (default: the OS-2 server images of --os-version)",
    )
    image_filter_owners: str = Field(
        "",
        validation_alias=alias("image_filter_owners", "ami_filter_owners"),
        description="owner account ID(s) or alias (amazon, aws-marketplace, self), comma-separated",
    )
    image_regions: list[str] = Field(
        default_factory=list,
        validation_alias=alias("image_regions", "ami_regions"),
        description="regions to copy the AMI to (list, or comma-separated string; default: cloud_region)",
    )
    cloud_region: str = Field(
        "", validation_alias=alias("cloud_region", "aws_region"), description="region of the builder instance"
    )
    config_mgmt_extra_vars: str | None = Field(
        None,
        validation_alias=alias("config_mgmt_extra_vars", "ansible_extra_vars"),
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
        bad = [o for o in owners if not (re.fullmatch(r"[0-9]{12}", o) or o in _OWNER_ALIASES)]
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


def ebs_performance(volume_type: str, size_gib: int) -> tuple[int | None, int | None]:
    """(iops, throughput) an EBS root volume needs declared: gp3 its baseline; io1/io2 provisioned IOPS within
    the per-GiB limit (50 and 500 IOPS per GiB). Other types take none."""
    if volume_type == "gp3":
        return 3000, 125
    if volume_type in ("io1", "io2"):
        per_gib = 50 if volume_type == "io1" else 500
        return max(100, min(3000, per_gib * size_gib)), None
    return None, None


class Ami(Provider):
    name = "ami"
    config_model = AmiConfig
    builder = "amazon"
    #: the source AMI brings its own default user
    build_user = "ubuntu"
    removes_build_user = False
    local_artifact = False
    http_seed = False

    @staticmethod
    def _config(plan: BuildPlan) -> AmiConfig:
        assert isinstance(plan.config, AmiConfig)
        return plan.config

    def steps(self, plan: BuildPlan) -> list[str]:
        config = self._config(plan)
        steps = [
            f"packer: amazon-ebs in {config.cloud_region}, source AMI '{config.image_filter_name}'"
            f" owned by {config.image_filter_owners}, instance {config.builder_instance_type},"
            f" root {config.root_device_name} {config.volume_size} GiB {config.volume_type}"
        ]
        extra = f" with --extra-vars {config.config_mgmt_extra_vars}" if config.config_mgmt_extra_vars else ""
        steps.append(node_step(plan.kubernetes_version) + extra)
        if config.custom_role:
            roles = config.custom_role_names or " ".join(config.custom_role_name_list or [])
            steps.append(f"custom roles before sysprep: {roles}")
        steps += [SYSPREP, f"register AMI {plan.output_name}; copy to {', '.join(config.image_regions)}"]
        steps.append(f"write the Packer manifest to {config.manifest_output or '<output dir>/packer-manifest.json'}")
        return steps

    def ansible_vars(self, plan: BuildPlan) -> dict[str, Any]:
        config = self._config(plan)
        if not config.custom_role:
            return {}
        if config.custom_role_name_list:
            return {"custom_roles": [Path(p).name for p in config.custom_role_name_list]}
        return {"custom_roles": (config.custom_role_names or "").split()}

    def packer_context(self, plan: BuildPlan, ctx: dict[str, Any]) -> None:
        config = self._config(plan)
        ctx["volume_iops"], ctx["volume_throughput"] = ebs_performance(config.volume_type, config.volume_size)
        if config.config_mgmt_extra_vars:
            ctx["ansible_extra_vars"] = [config.config_mgmt_extra_vars]
        roles = [str(Path(p).parent) for p in config.custom_role_name_list or []]
        ctx["ansible_roles_path"] = ":".join([ctx["ansible_roles_path"], *dict.fromkeys(roles)])

    def packer_manifest_path(self, plan: BuildPlan, directory: Path) -> Path:
        config = self._config(plan)
        return Path(config.manifest_output) if config.manifest_output else super().packer_manifest_path(plan, directory)

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        return packer_manifest(self.packer_manifest_path(plan, directory))
