"""Cluster specs through the one validation layer (issue 47): each document read by a model of the fields
``cluster.validate`` checks (the product's other fields left alone: its users' files carry all of them), the checks
that join documents after, and every problem of every document in one report."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import InputErrors
from imagebuilder.vsphere.clusterspec import load_cluster_specs
from tests.support.common import EXAMPLES

EXAMPLE = (EXAMPLES / "vsphere-cluster.yaml").read_text()


def write(tmp_path: Path, *changes: tuple[str, str]) -> str:
    text = EXAMPLE
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


def test_the_products_own_fields_are_left_alone_and_an_unquoted_version_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, ('kubernetesVersion: "1.24"', "kubernetesVersion: 1.24\n  clusterNetwork: {cni: cilium}"),
                 ("  insecure: false", "  insecure: false\n  futureField: {any: thing}"))  # fmt: skip
    (spec,) = load_cluster_specs([path])
    assert (spec.kubernetes, spec.endpoint, spec.datacenter) == ("1.24", "192.168.10.5", "Datacenter")
    assert spec.network == "/Datacenter/network/VM Network" and len(spec.machines) == 2
    assert spec.thumbprint is None, "an empty thumbprint is not set"


def test_every_document_is_checked_and_every_problem_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, ('host: "192.168.10.5"', 'host: "224.0.0.1"'), ("insecure: false", 'insecure: "no"'),
                 ('kubernetesVersion: "1.24"', 'kubernetesVersion: "1.99"'), ("osFamily: ubuntu", "osFamily: windows"),
                 ('thumbprint: ""', "thumbprint: not-one"))  # fmt: skip
    with pytest.raises(InputErrors) as err:
        load_cluster_specs([path])
    found = {e.field: e.detail for e in err.value.errors}
    assert all(e.source == path for e in err.value.errors)
    endpoint = found["Cluster/mgmt spec.controlPlaneConfiguration.endpoint.host"]
    assert endpoint == "'224.0.0.1' is not a unicast host address"
    assert "1.99" in found["Cluster/mgmt spec.kubernetesVersion"]
    assert found["VSphereDatacenterConfig/mgmt spec.insecure"] == "got 'no'"
    assert found["VSphereDatacenterConfig/mgmt spec.thumbprint"] == "'NOT-ONE' is not a SHA1 thumbprint"
    assert "windows" in found["VSphereMachineConfig/mgmt-cp spec.osFamily"]


def test_what_joins_documents_is_checked_after_them(tmp_path: Path) -> None:
    folder = "folder: /Datacenter/vm/eksa/mgmt\n  resourcePool"
    path = write(tmp_path, ("server: vcenter.example.com", "server: 10.0.0.9"),
                 (folder, "folder: /Other/vm/x\n  resourcePool"))  # fmt: skip
    with pytest.raises(InputErrors) as err:
        load_cluster_specs([path])
    found = [(e.field, e.detail) for e in err.value.errors]
    assert ("VSphereDatacenterConfig/mgmt spec.thumbprint",
            "server 10.0.0.9 is an IP, so its certificate cannot be checked by name") in found  # fmt: skip
    assert ("VSphereMachineConfig/mgmt-cp spec.folder",
            "'/Other/vm/x' is not a VM folder path under datacenter 'Datacenter'") in found  # fmt: skip
