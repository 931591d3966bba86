"""The reference tool's documented build configs, filled with real values, work here unchanged (issue 16).

Each example is the JSON of the reference's public build documentation (EKS Anywhere docs, "Building node images":
vSphere, bare metal, Nutanix, proxies, additional files, Red Hat Satellite, air-gapped). Each must pass
``build --dry-run`` for its pair and render a Packer template the real Packer accepts, with its fields honoured,
not merely accepted; a field set to something invalid gets the usual message naming file and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imagebuilder.builder.resolve import make_plan
from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.plan.model import BuildRequest
from tests.support.common import plan_for
from tests.support.reference import RHEL, SATELLITE, pinned_mirror


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"rhsm_org_id": None}, "rhsm_org_id", "go together"),
        ({"rhsm_server_release_version": "9.4"}, "rhsm_server_release_version", "not a release of RHEL 8"),
        ({"rhsm_server_release_version": "8"}, "rhsm_server_release_version", "MAJOR.MINOR"),
        ({"rhsm_server_hostname": "https://satellite.example.com"}, "rhsm_server_hostname", "not a URL"),
    ],
)
def test_satellite_mistakes_are_named(tmp_path: Path, change: dict[str, Any], field: str, message: str) -> None:
    config = {k: v for k, v in (RHEL | SATELLITE | change).items() if v is not None and not k.startswith("rhel_")}
    with pytest.raises(InputErrors) as info:
        plan_for("redhat", "baremetal", tmp_path, config)
    errors = {e.field: str(e) for e in info.value.errors}
    assert field in errors and message in errors[field], errors
    assert str(tmp_path / "baremetal.json") in errors[field]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"eksa_release": "v0.21.4"}, "not in the release index"),
        ({"release_channel": "1-24"}, "does not ship Kubernetes 1.24"),
        ({"release_manifest": "x.yaml"}, "both choose the release manifest"),
        ({"mirror": None}, "offline, it needs a mirror"),
    ],
)
def test_eksa_release_mistakes_are_named(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    mirror = pinned_mirror(tmp_path)
    fields = {"os": "ubuntu", "hypervisor": "baremetal", "release_channel": "1-21", "offline": True,
              "mirror": str(mirror), "eksa_release": "v0.21.3"} | change  # fmt: skip
    with pytest.raises(InputError, match=needle):
        make_plan(BuildRequest(**fields))


def test_the_matrix_defaults_to_efi_only_where_efi_is_built() -> None:
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    for os_ in catalog.operating_systems.values():
        assert set(os_.efi_default) <= set(os_.efi_providers), os_.name
        assert set(os_.efi_providers) <= set(catalog.providers), os_.name
