"""cluster.validate accepts the forms the product accepts, and refuses the rest with a clear message.

Each case reproduces a form that a real cluster spec of the product uses, naming where it was seen (repository, path,
commit). The files themselves are not copied here (this project commits no third-party data); the values that
matter are written out as the product writes them. Placeholders of the product's unit tests (``vsphere_server``,
thumbprint ``ABCDEFG``) are refused with the shape that is expected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_vsphere import TEMPLATES, import_args
from tests.support.common import run
from tests.support.vcsim import Vcsim

PRODUCT = "aws/eks-anywhere"
TESTDATA = "pkg/providers/vsphere/testdata"
#: where each form was seen
SEEN = {
    "main": f"{PRODUCT} {TESTDATA}/cluster_main.yaml @ 3518c5ca58218fa621fa83e5ca3fa3e2f2b7b6ee",
    "br": f"{PRODUCT} {TESTDATA}/cluster_main_br.yaml @ 35598c8147fe3260d6eaafa44a05263c4315e74f",
    "minimal": f"{PRODUCT} {TESTDATA}/cluster_minimal.yaml @ 3518c5ca58218fa621fa83e5ca3fa3e2f2b7b6ee",
    "docs": f"{PRODUCT} docs/content/en/docs/getting-started/vsphere/vsphere-spec.md"
    " @ 016d6a41c7dd96f0d7b0fef5cfc695e19534e15b",
    "govc": f"{PRODUCT} pkg/executables/govc_test.go (resourcePool */Resources/Compute-ResourcePool)",
}


def spec(
    *,
    dc: str = "SDDC-Datacenter",
    network: str = "/SDDC-Datacenter/network/sddc-cgw-network-1",
    server: str = "vcenter.example.com",
    thumbprint: str = "",
    insecure: bool = True,
    kubernetes: str = "1.24",
    endpoint: str = "10.10.0.5",
    machine: dict[str, object] | None = None,
) -> str:
    machine = machine or {}
    docs = [
        {"apiVersion": "anywhere.eks.amazonaws.com/v1alpha1", "kind": "Cluster", "metadata": {"name": "test"},
         "spec": {"controlPlaneConfiguration": {"count": 3, "endpoint": {"host": endpoint},
                                                "machineGroupRef": {"name": "test-cp", "kind": "VSphereMachineConfig"}},
                  "kubernetesVersion": kubernetes,
                  "workerNodeGroupConfigurations": [
                      {"count": 3, "name": "md-0",
                       "machineGroupRef": {"name": "test-cp", "kind": "VSphereMachineConfig"}}],
                  "datacenterRef": {"kind": "VSphereDatacenterConfig", "name": "test"}}},
        {"apiVersion": "anywhere.eks.amazonaws.com/v1alpha1", "kind": "VSphereMachineConfig",
         "metadata": {"name": "test-cp"},
         "spec": {"diskGiB": 25, "memoryMiB": 8192, "numCPUs": 2, **machine}},
        {"apiVersion": "anywhere.eks.amazonaws.com/v1alpha1", "kind": "VSphereDatacenterConfig",
         "metadata": {"name": "test"},
         "spec": {"datacenter": dc, "network": network, "server": server, "thumbprint": thumbprint,
                  "insecure": insecure}},
    ]  # fmt: skip
    return "\n---\n".join(json.dumps(d) for d in docs)


UBUNTU = {
    "datastore": "/SDDC-Datacenter/datastore/WorkloadDatastore",
    "folder": "/SDDC-Datacenter/vm",
    "osFamily": "ubuntu",
    "resourcePool": "*/Resources",
    "template": "/SDDC-Datacenter/vm/Templates/ubuntu-2004-kube-v1.24",
}
BOTTLEROCKET = {k: v for k, v in UBUNTU.items() if k != "template"} | {"osFamily": "bottlerocket"}

#: (case, where the form was seen, the spec, the fields that must be refused: none for an accepted form)
CASES = [
    ("wildcard pool, root VM folder", "main", spec(machine=UBUNTU), []),
    ("bottlerocket without a template", "br", spec(machine=BOTTLEROCKET), []),
    ("no osFamily: bottlerocket by default, no template", "br",
     spec(machine={k: v for k, v in BOTTLEROCKET.items() if k != "osFamily"}), []),
    ("wildcard pool with a child pool", "govc",
     spec(machine=UBUNTU | {"resourcePool": "*/Resources/Compute-ResourcePool"}), []),
    ("absolute pool path", "minimal",
     spec(machine=UBUNTU | {"resourcePool": "/SDDC-Datacenter/host/Cluster-1/Resources/Compute-ResourcePool"}), []),
    ("relative names as the docs write them", "docs",
     spec(network="network1", machine={"datastore": "datastore1", "folder": "folder1", "osFamily": "bottlerocket",
                                       "resourcePool": "Cluster-1/Resources",
                                       "template": "bottlerocket-kube-v1-24"}), []),
    ("the unit tests' placeholders", "main",
     spec(server="vsphere_server", thumbprint="ABCDEFG", insecure=False, machine=UBUNTU),
     ["spec.server", "spec.thumbprint"]),
    ("a placeholder pool without Resources", "docs", spec(machine=UBUNTU | {"resourcePool": "myResourcePool"}),
     ["spec.resourcePool"]),
    ("ubuntu without a template", "main", spec(machine={k: v for k, v in UBUNTU.items() if k != "template"}),
     ["spec.template"]),
    ("a datastore under the VM folder", "main", spec(machine=UBUNTU | {"datastore": "/SDDC-Datacenter/vm/ds"}),
     ["spec.datastore"]),
    ("another datacenter's folder", "main", spec(machine=UBUNTU | {"folder": "/Other-DC/vm/x"}), ["spec.folder"]),
    ("a folder path that climbs", "main", spec(machine=UBUNTU | {"folder": "/SDDC-Datacenter/vm/../host"}),
     ["spec.folder"]),
    ("kubernetes no release line carries", "main", spec(kubernetes="1.17", machine=UBUNTU),
     ["spec.kubernetesVersion"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "seen", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_documented_forms(tmp_path: Path, case: str, seen: str, text: str, refused: list[str]) -> None:
    assert seen in SEEN
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    res = run("cluster.validate", "-f", str(path), "--offline")
    if not refused:
        assert res.code == 0, (case, res.err)
        return
    assert res.code == 2, case
    lines = [ln for ln in res.err.splitlines() if ln.startswith("error:")]
    for field in refused:
        hits = [ln for ln in lines if f" {field}:" in ln]
        assert hits, (field, res.err)
        assert all(str(path) in ln and "expected" in ln for ln in hits), hits  # file, document, field, shape
    assert len(lines) == len(refused), res.err


def test_patterns_resolve_to_exactly_one_object_when_connected(
    vcsim: Vcsim, small_ovas: dict[str, Path], tmp_path: Path
) -> None:
    """vcsim's inventory: /DC0/host/DC0_C0 (a cluster) and DC0_H0 (a standalone host), each with Resources."""
    env = vcsim.env
    assert run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.24"), env=env).code == 0
    template = f"{TEMPLATES}/ubuntu-kubernetes-1-24-eks-36"
    base = {"datastore": "LocalDS_0", "folder": "/DC0/vm", "osFamily": "ubuntu", "template": template}

    def check(pool: str, **extra: object) -> tuple[int, str]:
        path = tmp_path / "c.yaml"
        path.write_text(
            spec(dc="DC0", network="VM Network", server=vcsim.server, machine=base | {"resourcePool": pool} | extra)
        )
        res = run("cluster.validate", "-f", str(path), env=env)
        return res.code, res.out + res.err

    code, text = check("DC0_C0/Resources")
    assert code == 0, text
    code, text = check("*_C0/Resources")
    assert code == 0, text
    code, text = check("*/Resources")  # the cluster's and the host's root pools: two objects
    assert code == 1 and "matches 2 objects" in text and "/DC0/host/DC0_C0/Resources" in text, text
    code, text = check("Nope*/Resources")
    assert code == 1 and "does not exist" in text, text
    code, text = check("DC0_C0/Resources", template="ubuntu-kubernetes-1-24-eks-36")  # a bare name, found by name
    assert code == 0, text


USER_DOC = f"{PRODUCT} docs/content/en/docs/getting-started/vsphere/vsphere-preparation.md (vSphereUser example)"


def test_the_user_yaml_form_of_the_product_docs(vcsim: Vcsim, tmp_path: Path) -> None:
    """The docs' user.yaml: quoted values, !!str paths, a pool written without its Resources step; on vcsim it sets
    up the permissions on the pool the path means."""
    assert USER_DOC
    vcsim.govc("pool.create", "/DC0/host/DC0_C0/Resources/MyResourcePool")
    text = f"""apiVersion: "eks-anywhere.amazon.com/v1"
kind: vSphereUser
spec:
  username: "eksa"                # optional, default eksa
  group: "MyExistingGroup"        # optional, default EKSAUsers
  globalRole: "MyGlobalRole"      # optional, default EKSAGlobalRole
  userRole: "MyUserRole"          # optional, default EKSAUserRole
  adminRole: "MyEKSAAdminRole"    # optional, default EKSACloudAdminRole
  datacenter: "DC0"
  vSphereDomain: "vsphere.local"
  connection:
    server: "https://{vcsim.server}"
    insecure: true
  objects:
    networks:
      - !!str "/DC0/network/VM Network"
    datastores:
      - !!str "/DC0/datastore/LocalDS_0"
    resourcePools:
      - !!str "/DC0/host/DC0_C0/MyResourcePool" # written as in the docs, without Resources
    folders:
      - !!str "/DC0/vm/OrgDirectory/MyVMs"
    templates:
      - !!str "/DC0/vm/Templates/MyTemplates"
"""
    path = tmp_path / "user.yaml"
    path.write_text(text)
    res = run("vsphere.setup-user", "-f", str(path), "--password", "env:PW", env={**vcsim.env, "PW": "Pw-for-eksa-1!"})
    assert res.code == 0, res.err
    perms = vcsim.govc("permissions.ls", "-a=false", "/DC0/host/DC0_C0/Resources/MyResourcePool")
    assert "MyExistingGroup@vsphere.local" in perms and "MyUserRole" in perms, perms
