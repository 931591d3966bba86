"""What a hardened build asks for (:class:`HardeningRequest`) and the project's hardening settings
(``config/hardening.yaml``: the content's release, the rules a node keeps and why).

The profile and the product are names that end up in OpenSCAP's command line and in XML ids, so both are held to
the content's own grammar (:data:`NAME`) before anything else reads them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from imagebuilder.core.errors import InputError
from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.paths import config_dir
from imagebuilder.core.validation import StrictModel, validated

#: a profile's or a rule's short name, as ComplianceAsCode writes them (``cis_level1_server``,
#: ``kernel_module_usb-storage_disabled``)
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,99}")
#: the XCCDF id prefixes of ComplianceAsCode's profiles and rules
PROFILE_PREFIX = "xccdf_org.ssgproject.content_profile_"
RULE_PREFIX = "xccdf_org.ssgproject.content_rule_"
#: what the tailored profile's id adds to the profile's: ``..._cis_level1_server_kubernetes_node``
TAILORED_SUFFIX = "_kubernetes_node"
#: the pass rate over the applicable rules a hardened image must reach unless --hardening-min-pass says otherwise
DEFAULT_MIN_PASS = 90.0


def cac_name(value: str, what: str) -> str:
    """``value`` if it is a ComplianceAsCode name (a profile, a rule, a product), else ValueError saying so."""
    if not NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a ComplianceAsCode name (lower case letters, digits, '_', '.', '-')")
    return value


class Content(StrictModel):
    module: str = Field(pattern=r"^[a-zA-Z0-9.-]+(/[a-zA-Z0-9._-]+)+$")
    version: str = Field(pattern=r"^v\d+\.\d+\.\d+$")


class NodeKeep(StrictModel):
    rules: tuple[str, ...] = Field(min_length=1)
    reason: str = Field(min_length=20)

    @field_validator("rules")
    @classmethod
    def _rules(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(cac_name(r, "rule") for r in rules)


class Settings(StrictModel):
    content: Content
    node_keeps: tuple[NodeKeep, ...]

    def reasons(self) -> dict[str, str]:
        """Each rule a node keeps, with its reason."""
        return {rule: " ".join(keep.reason.split()) for keep in self.node_keeps for rule in keep.rules}


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    path = config_dir() / "hardening.yaml"
    return validated(Settings, load_yaml_mapping(path, "hardening settings"), path)


@dataclass(frozen=True)
class HardeningRequest:
    """``--hardening PROFILE`` with its companions: where the content comes from (None: built from the source
    release of ``config/hardening.yaml``) and the pass rate the scan must reach."""

    profile: str
    content: Path | None = None
    min_pass: float = DEFAULT_MIN_PASS

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.profile):
            raise InputError(f"{self.profile!r} is not a profile name", field="--hardening",
                             expected="a ComplianceAsCode profile such as cis_level1_server")  # fmt: skip
        if not 0 <= self.min_pass <= 100:
            raise InputError(f"{self.min_pass} is not a percentage", field="--hardening-min-pass",
                             expected="a pass rate from 0 to 100")  # fmt: skip

    @property
    def profile_id(self) -> str:
        return PROFILE_PREFIX + self.profile

    @property
    def tailored_id(self) -> str:
        return PROFILE_PREFIX + self.profile + TAILORED_SUFFIX

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "content": str(self.content) if self.content else None,
                "min_pass": self.min_pass}  # fmt: skip


#: the ComplianceAsCode product of an OS, by os-release ``ID``: how its ``VERSION_ID`` makes the product's name
_PRODUCTS: dict[str, Callable[[str], str]] = {
    "debian": lambda v: f"debian{v.split('.')[0]}",
    "ubuntu": lambda v: "ubuntu" + v.replace(".", ""),
    "rhel": lambda v: f"rhel{v.split('.')[0]}",
    "rocky": lambda v: f"rhel{v.split('.')[0]}",
    "almalinux": lambda v: f"almalinux{v.split('.')[0]}",
    "ol": lambda v: f"ol{v.split('.')[0]}",
    "fedora": lambda v: "fedora",
}


def product_of(os_release: dict[str, str], source: str | Path) -> str:
    """The content's product for a system whose os-release is ``os_release`` (``debian12``, ``ubuntu2204``,
    ``rhel9``); refused (exit 2) for a system the content has no product for."""
    os_id, version = os_release.get("ID", ""), os_release.get("VERSION_ID", "")
    make = _PRODUCTS.get(os_id)
    if make is None or not re.fullmatch(r"\d+(\.\d+)?", version or "0"):
        shown = f"{os_id or 'no ID'} {version}".strip()
        raise InputError(f"the image's OS ({shown}, its os-release) has no ComplianceAsCode product here",
                         source=source, field="os-release",
                         expected=f"one of the OSes {', '.join(sorted(_PRODUCTS))}")  # fmt: skip
    return make(version)


#: the os-release ``ID`` of the system an ISO install of the catalog's OS gives (its version is the catalog's)
_INSTALLED_IDS = {"ubuntu": "ubuntu", "redhat": "rhel"}


def installed_os_release(os_name: str, version: str) -> dict[str, str]:
    """The os-release fields :func:`product_of` reads, for the system an ISO install of ``os_name`` ``version``
    gives (a Packer build with no source image to read them from)."""
    return {"ID": _INSTALLED_IDS.get(os_name, os_name), "VERSION_ID": version}
