"""The build host's requirements and preparation settings (``config/host.yaml``)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, ConfigDict, ValidationError

from imagebuilder.errors import InputError
from imagebuilder.files import load_yaml_mapping
from imagebuilder.paths import config_dir


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Packages(_Strict):
    common: list[str]
    qemu: list[str]


class Requirements(_Strict):
    min_disk_gb: int
    min_cpus: int
    min_memory_gb: float
    memory_tolerance_gb: float


class Tools(_Strict):
    all: list[str]
    qemu: list[str]


class HostConfig(_Strict):
    user: str
    user_groups: list[str]
    packages: Packages
    package_substitutes: dict[str, dict[str, str]]
    qemu_providers: list[str]
    ssh_client_lines: list[str]
    kvm_udev_rule: str
    host_os: dict[str, dict[str, str]]
    requirements: Requirements
    tools: Tools

    def packages_for(self, providers: list[str], os_id: str) -> list[str]:
        """Spec 4.3's packages for these providers, with this host's package names."""
        names = list(self.packages.common)
        if any(p in self.qemu_providers for p in providers):
            names += self.packages.qemu
        subs = self.package_substitutes.get(os_id, {})
        return list(dict.fromkeys(subs.get(n, n) for n in names))


@lru_cache(maxsize=1)
def load_host_config() -> HostConfig:
    path = config_dir() / "host.yaml"
    try:
        return HostConfig.model_validate(load_yaml_mapping(path, "host config"))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(first["msg"], source=path, field=".".join(str(p) for p in first["loc"])) from None
