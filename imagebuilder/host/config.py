"""The build host's requirements and preparation settings (``config/host.yaml``)."""

from __future__ import annotations

from functools import lru_cache

from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.paths import config_dir
from imagebuilder.core.validation import StrictModel, validated


class Packages(StrictModel):
    common: list[str]
    qemu: list[str]


class Requirements(StrictModel):
    min_disk_gb: int
    min_cpus: int
    min_memory_gb: float
    memory_tolerance_gb: float


class Tools(StrictModel):
    all: list[str]
    qemu: list[str]


class HostConfig(StrictModel):
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
    return validated(HostConfig, load_yaml_mapping(path, "host config"), path)
