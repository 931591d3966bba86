"""CloudStack (orchestrator): an OS-3 qcow2 built with QEMU, registered as a template when the config gives
the API access fields (spec 2.3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from imagebuilder.core.progress import Say
from imagebuilder.core.validation import Problem
from imagebuilder.image.outputs import Packaged, place
from imagebuilder.plan.config import BoolStr, BuildExtras, ConfigContext, Os3Fields, Secret, Text
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers.base import SUBSCRIPTION, SYSPREP, Provider, node_step


class CloudstackConfig(Os3Fields, BuildExtras):
    """CloudStack (orchestrator) build configuration, ``--cloudstack-config``.

    The spec shows only the OS-3 fields. The build itself runs locally (qemu -> qcow2); the access fields are what
    registering the qcow2 as a template takes (CloudStack's registerTemplate API). They go together: give all four
    required ones or none (then the qcow2 is built and the template step is skipped).
    """

    provider = "cloudstack"
    access_required: ClassVar[tuple[str, ...]] = (
        "cloudstack_api_url",
        "cloudstack_api_key",
        "cloudstack_secret_key",
        "cloudstack_zone",
    )

    cloudstack_api_url: str | None = Field(
        None, description="API endpoint, e.g. https://cloudstack.example.com/client/api"
    )
    cloudstack_api_key: Secret | None = Field(None, description="API key of the account (secret)")
    cloudstack_secret_key: Secret | None = Field(None, description="secret key of the account (secret)")
    cloudstack_zone: Text | None = Field(None, description="zone the template is registered in")
    cloudstack_domain: Text | None = Field(None, description="domain of the account (default ROOT)")
    cloudstack_account: Text | None = Field(None, description="account owning the template (default: the key's)")
    cloudstack_os_type: Text = Field("Other Linux (64-bit)", description="CloudStack OS type of the template")
    cloudstack_insecure: BoolStr = Field(False, description='"true" skips TLS verification of the API')

    @field_validator("cloudstack_api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", value):
            raise ValueError(f"must be an http(s) URL of the CloudStack API, got {value!r}")
        return value

    @classmethod
    def cross_check(cls, data: dict[str, Any], ctx: ConfigContext) -> list[Problem]:
        problems = super().cross_check(data, ctx)
        access = [f for f in cls.model_fields if f.startswith("cloudstack_") and f in data]
        if access:
            problems += [
                Problem(f, "is required when any CloudStack access field is given", cls.model_fields[f].description)
                for f in cls.access_required
                if f not in data
            ]
        return problems

    @property
    def registers_template(self) -> bool:
        return self.cloudstack_api_url is not None


class Cloudstack(Provider):
    name = "cloudstack"
    config_model = CloudstackConfig
    builder = "qemu"

    def steps(self, plan: BuildPlan) -> list[str]:
        config = plan.config
        assert isinstance(config, CloudstackConfig)
        steps = [f"packer: qemu builder, qcow2 disk, from the OS-3 ISO {config.iso_url}", SUBSCRIPTION]
        steps += [node_step(plan.kubernetes_version) + ", CloudStack cloud-init datasource", SYSPREP]
        steps.append(f"write {plan.output_name}")
        if config.registers_template:
            steps.append(
                f"register {plan.output_name} as a template in zone {config.cloudstack_zone}"
                f" via {config.cloudstack_api_url}"
            )
        else:
            steps.append("template registration skipped: no CloudStack access fields in the config")
        return steps

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        assert plan.output_path is not None
        return place(self.built_disk(plan, directory, status), plan.output_path)
