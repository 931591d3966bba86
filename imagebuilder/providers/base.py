"""What a provider is: one class per provider module, asked by the shared build flow at each step.

The shared flow (plan, render, Packer, package) never asks *which* provider it has; it asks the provider. A
provider says which config model its ``--<provider>-config`` file follows, which Packer builder folder renders it,
what its build does (the plan's steps), what its template needs beyond the shared context, which secrets reach
Packer, and how Packer's output becomes the artifact. Defaults here are what most providers do; a provider
overrides only where it differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from imagebuilder.core.progress import Say
from imagebuilder.image.outputs import Packaged, qemu_disk
from imagebuilder.plan.config import ProviderConfig
from imagebuilder.plan.model import BuildPlan

#: the user Packer logs in as, made by the install seed and removed by sysprep
BUILD_USER = "builder"

#: step texts shared by providers (the plan prints them; ``build --dry-run`` shows them to the user)
SYSPREP = "sysprep: empty machine-id, remove SSH host keys, cloud-init clean, logs, build user"
SUBSCRIPTION = "register the OS-3 subscription for the build; unregister it before the image is sealed"


def node_step(kubernetes_version: str) -> str:
    return f"ansible: OS packages, containerd, Kubernetes {kubernetes_version} binaries and images (sha256-verified)"


class Provider:
    """One provider. Subclasses set the class attributes and override the hooks they need."""

    #: the canonical name (``config/matrix.yaml`` providers)
    name: ClassVar[str]
    #: the model of its config file
    config_model: ClassVar[type[ProviderConfig]]
    #: the folder under ``packer/`` that renders its template
    builder: ClassVar[str]
    #: the disk format the QEMU builder writes for it
    disk_format: ClassVar[str] = "qcow2"
    #: who Packer logs in as
    build_user: ClassVar[str] = BUILD_USER
    #: sysprep removes the build user (not a user the source image brought, like an AMI's default user)
    removes_build_user: ClassVar[bool] = True
    #: the build writes an artifact under the output folder (an AMI stays in AWS)
    local_artifact: ClassVar[bool] = True
    #: installs from an ISO whose seed (autoinstall or kickstart) Packer serves over HTTP
    http_seed: ClassVar[bool] = True
    #: cloud-init user-data is passed inside the template (no seed CD)
    inline_user_data: ClassVar[bool] = False
    #: sensitive template variables (``PKR_VAR_<name>``) this provider's config supplies
    secret_variables: ClassVar[tuple[str, ...]] = ()

    def builder_for(self, config: ProviderConfig | None) -> str:
        """The Packer builder folder for this config (vSphere builds a local OVA with QEMU)."""
        return self.builder

    def disk_comes_here(self, config: ProviderConfig | None) -> bool:
        """Whether a Packer build with ``config`` leaves its finished disk on this host before packaging (QEMU's
        output, a platform's export), where a hardened build scans it; an AMI or a Nutanix image stays on its
        platform."""
        return self.builder_for(config) == "qemu"

    def built_disk(self, plan: BuildPlan, directory: Path, status: Say) -> Path:
        """The finished disk the Packer build in ``directory`` left on this host, checked to boot (only asked when
        :meth:`disk_comes_here`)."""
        return qemu_disk(directory, plan.output_stem, status)

    def builders(self) -> tuple[str, ...]:
        """Every Packer builder folder a build of this provider may render (what ``preflight`` checks plugins for)."""
        return (self.builder,)

    def steps(self, plan: BuildPlan) -> list[str]:
        """What the build does between rendering and the checksum, in order (shown by ``build --dry-run``)."""
        raise NotImplementedError

    def ansible_vars(self, plan: BuildPlan) -> dict[str, Any]:
        """Node-role variables beyond the shared ones (no secrets)."""
        return {}

    def packer_context(self, plan: BuildPlan, ctx: dict[str, Any]) -> None:
        """Add what this provider's template needs to the shared render context."""

    def secret_env(self, plan: BuildPlan) -> dict[str, str]:
        """Values of :attr:`secret_variables`, as ``PKR_VAR_*`` for the Packer process only."""
        return {}

    def package(self, plan: BuildPlan, directory: Path, status: Say) -> Packaged:
        """Turn Packer's output in the build ``directory`` into the artifact the plan promises."""
        raise NotImplementedError

    def packer_manifest_path(self, plan: BuildPlan, directory: Path) -> Path:
        """Where Packer writes its manifest for this build."""
        return directory / "packer-manifest.json"
