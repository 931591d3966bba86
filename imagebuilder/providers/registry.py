"""The providers, by name. Adding one is a module beside these and a line here (see docs/architecture.md)."""

from __future__ import annotations

from imagebuilder.providers.ami import Ami
from imagebuilder.providers.baremetal import Baremetal
from imagebuilder.providers.base import Provider
from imagebuilder.providers.cloudstack import Cloudstack
from imagebuilder.providers.config import ProviderConfig
from imagebuilder.providers.nutanix import Nutanix
from imagebuilder.providers.vsphere import Vsphere

PROVIDERS: dict[str, Provider] = {p.name: p for p in (Vsphere(), Baremetal(), Cloudstack(), Ami(), Nutanix())}


def get(name: str) -> Provider:
    """The provider of a canonical name (names and aliases are resolved by the catalog first)."""
    return PROVIDERS[name]


def config_models() -> dict[str, type[ProviderConfig]]:
    """Every provider's config model, by provider name."""
    return {name: p.config_model for name, p in PROVIDERS.items()}
