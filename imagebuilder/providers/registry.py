"""The providers, by name. Adding one is a module beside these and a line here (see docs/architecture.md)."""

from __future__ import annotations

from imagebuilder.plan.config import ProviderConfig
from imagebuilder.providers.ami.provider import Ami
from imagebuilder.providers.baremetal.provider import Baremetal
from imagebuilder.providers.base import Provider
from imagebuilder.providers.cloudstack.provider import Cloudstack
from imagebuilder.providers.nutanix.provider import Nutanix
from imagebuilder.providers.vsphere.provider import Vsphere

PROVIDERS: dict[str, Provider] = {p.name: p for p in (Vsphere(), Baremetal(), Cloudstack(), Ami(), Nutanix())}


def get(name: str) -> Provider:
    """The provider of a canonical name (names and aliases are resolved by the catalog first)."""
    return PROVIDERS[name]


def config_models() -> dict[str, type[ProviderConfig]]:
    """Every provider's config model, by provider name."""
    return {name: p.config_model for name, p in PROVIDERS.items()}
