"""vSphere preparation against a real vcsim: user/group/roles/permissions, template import, tags, validation.

govc (same govmomi release) is the independent observer: what our tasks did is read back with govc, not with our
own code. Simulator differences are listed in tests/support/vcsim.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imagebuilder.release.catalog import load_catalog
from imagebuilder.vsphere.access import shipped_privileges
from tests.support.common import BIN, ROOT, run
from tests.support.vcsim import Vcsim, start_vcsim

NEW_PASSWORD = "New-User-Pw-93ab!"
DC = "DC0"
TEMPLATES = f"/{DC}/vm/Templates"


def user_yaml(tmp_path: Path, sim: Vcsim, **spec: object) -> Path:
    doc = {
        "apiVersion": "eks-anywhere.amazon.com/v1",
        "kind": "vSphereUser",
        "spec": {
            "datacenter": DC,
            "vSphereDomain": "vsphere.local",
            "connection": {"server": sim.server, "insecure": True},
            "objects": {
                "networks": [f"/{DC}/network/VM Network"],
                "datastores": [f"/{DC}/datastore/LocalDS_0"],
                "resourcePools": [f"/{DC}/host/DC0_C0"],
                "folders": [f"/{DC}/vm/eksa"],
                "templates": [TEMPLATES],
            },
            **spec,
        },
    }
    path = tmp_path / "user.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def setup_user(sim: Vcsim, path: Path, *args: str) -> tuple[int, str, str]:
    res = run("vsphere.setup-user", "-f", str(path), *args, env={**sim.env, "NEW_PW": NEW_PASSWORD})
    assert NEW_PASSWORD not in res.out + res.err and sim.env["GOVC_PASSWORD"] not in res.out + res.err
    return res.code, res.out, res.err


def roles(sim: Vcsim) -> list[str]:
    return [line.split()[0] for line in sim.govc("role.ls").splitlines() if line.strip()]


def role_privileges(sim: Vcsim, name: str) -> set[str]:
    return {line.strip() for line in sim.govc("role.ls", name).splitlines() if line.strip()}


def permission(sim: Vcsim, path: str) -> list[tuple[str, str, str]]:
    """(role, principal, propagate) of the group's own permission on ``path``, read with govc."""
    out = []
    for line in sim.govc("permissions.ls", "-a=false", path).splitlines()[1:]:
        cols = line.split()
        if "EKSAUsers@vsphere.local" in cols:
            out.append((cols[0], cols[2], cols[3]))
    return out


def test_setup_user_creates_converges_and_force_restores(vcsim: Vcsim, tmp_path: Path) -> None:
    path = user_yaml(tmp_path, vcsim)
    before = roles(vcsim)

    code, out, _ = setup_user(vcsim, path, "--password", "env:NEW_PW", "--dry-run")
    assert code == 0 and "+ create user eksa@vsphere.local" in out and "+ create role EKSAUserRole" in out
    assert "dry run: 14 change(s) not made" in out
    assert roles(vcsim) == before  # the dry run changed nothing

    code, out, _ = setup_user(vcsim, path, "--password", "env:NEW_PW")
    assert code == 0, out
    assert "Role: EKSAGlobalRole" in out and "EKSAUsers@vsphere.local" in out  # the manual global-permission step
    # the new user logs in with the new password (SSO user), and is in the group
    assert "govmomi simulator" in vcsim.govc("about", user="eksa@vsphere.local", password=NEW_PASSWORD)
    assert "EKSAUsers" in vcsim.govc("sso.group.ls")
    # three roles with exactly the shipped privileges (the admin role: the server's Administrator privileges)
    assert role_privileges(vcsim, "EKSAGlobalRole") == set(shipped_privileges("global"))
    assert role_privileges(vcsim, "EKSAUserRole") == set(shipped_privileges("user"))
    assert role_privileges(vcsim, "EKSACloudAdminRole") == role_privileges(vcsim, "Admin")
    # spec 4.7 permissions, group principal, propagating
    assert permission(vcsim, "/") == [("EKSAGlobalRole", "EKSAUsers@vsphere.local", "Yes")]
    for p in (f"/{DC}/vm/eksa", TEMPLATES):
        assert permission(vcsim, p) == [("EKSACloudAdminRole", "EKSAUsers@vsphere.local", "Yes")]
    for p in (f"/{DC}/network/VM Network", f"/{DC}/datastore/LocalDS_0", f"/{DC}/host/DC0_C0"):
        assert permission(vcsim, p) == [("EKSAUserRole", "EKSAUsers@vsphere.local", "Yes")]

    # rerun: nothing to do, nothing duplicated
    after = roles(vcsim)
    code, out, _ = setup_user(vcsim, path, "--password", "env:NEW_PW")
    assert code == 0 and "0 change(s) made" in out and "(its password is left unchanged)" in out
    assert roles(vcsim) == after and sorted(after) == sorted(set(after))
    assert vcsim.govc("sso.group.ls").count("EKSAUsers") == 1

    # someone edits a role and a permission by hand: a plain rerun reports, --force restores both
    vcsim.govc("role.update", "-r", "EKSAUserRole", "VirtualMachine.Interact.PowerOn", "Network.Assign")
    vcsim.govc("role.update", "-a", "EKSAGlobalRole", "VirtualMachine.Inventory.Delete")
    vcsim.govc(
        "permissions.set",
        "-group=true",
        "-principal",
        "EKSAUsers@vsphere.local",
        "-role",
        "ReadOnly",
        f"/{DC}/datastore/LocalDS_0",
    )
    code, out, _ = setup_user(vcsim, path, "--force", "--dry-run")
    assert code == 0
    assert "~ reset role EKSAUserRole privileges: missing Network.Assign, VirtualMachine.Interact.PowerOn" in out
    assert "~ reset role EKSAGlobalRole privileges: extra VirtualMachine.Inventory.Delete" in out
    assert f"~ overwrite ReadOnly with EKSAUsers@vsphere.local -> EKSAUserRole on /{DC}/datastore/LocalDS_0" in out
    code, out, _ = setup_user(vcsim, path, "--password", "env:NEW_PW")
    assert "! role EKSAUserRole privileges differ" in out and "(--force resets them)" in out
    assert "VirtualMachine.Interact.PowerOn" not in role_privileges(vcsim, "EKSAUserRole")
    code, out, _ = setup_user(vcsim, path, "--force")
    assert code == 0 and "3 change(s) made" in out
    assert role_privileges(vcsim, "EKSAUserRole") == set(shipped_privileges("user"))
    assert role_privileges(vcsim, "EKSAGlobalRole") == set(shipped_privileges("global"))
    assert permission(vcsim, f"/{DC}/datastore/LocalDS_0") == [("EKSAUserRole", "EKSAUsers@vsphere.local", "Yes")]


def test_setup_user_flags_and_missing_objects(vcsim: Vcsim, tmp_path: Path) -> None:
    path = user_yaml(tmp_path, vcsim)
    code, _, err = setup_user(vcsim, path, "--password", "env:NEW_PW", "--force")
    assert code == 2 and "mutually exclusive" in err
    code, _, err = setup_user(vcsim, path)
    assert code == 2 and "--password/--force" in err
    code, _, err = setup_user(vcsim, path, "--force")  # no such user yet: --force cannot create it
    assert code == 2 and "eksa@vsphere.local does not exist" in err
    missing = user_yaml(
        tmp_path,
        vcsim,
        objects={
            "networks": [f"/{DC}/network/NoSuchNet"],
            "datastores": [f"/{DC}/datastore/LocalDS_0"],
            "resourcePools": [f"/{DC}/host/DC0_C0"],
            "folders": [f"/{DC}/vm/eksa"],
            "templates": [TEMPLATES],
        },
    )
    code, _, err = setup_user(vcsim, missing, "--password", "env:NEW_PW")
    assert code == 1 and f"/{DC}/network/NoSuchNet" in err and "does not exist" in err
    assert "EKSAUserRole" not in roles(vcsim)  # nothing was changed: the plan failed before applying
    no_creds = run(
        "vsphere.setup-user",
        "-f",
        str(path),
        "--password",
        "env:NEW_PW",
        env={"NEW_PW": NEW_PASSWORD, "GOVC_USERNAME": "", "GOVC_PASSWORD": "", "GOVC_URL": ""},
    )
    assert no_creds.code == 2 and "EKSA_VSPHERE_USERNAME" in no_creds.err
    wrong = run(
        "vsphere.setup-user",
        "-f",
        str(path),
        "--password",
        "env:NEW_PW",
        env={**vcsim.env, "NEW_PW": NEW_PASSWORD, "GOVC_PASSWORD": "wrong"},
    )
    assert wrong.code == 1 and "refused the login" in wrong.err and "wrong" not in wrong.err


def test_user_yaml_errors_are_all_reported(tmp_path: Path) -> None:
    path = tmp_path / "user.yaml"
    path.write_text(
        "apiVersion: eks-anywhere.amazon.com/v1\nkind: vSphereUser\nspec:\n"
        f"  username: {'u' * 301}\n  datacentre: DC0\n  vSphereDomain: vsphere.local\n"
        "  connection: {server: vc.example.com, insecure: 'no'}\n"
        "  objects:\n    networks: [/DC0/vm/net]\n    datastores: [/DC0/datastore/ds]\n"
        "    resourcePools: [/DC0/host]\n    folders: [/DC0/vm/eksa]\n"
    )
    res = run("vsphere.setup-user", "-f", str(path), "--force", env={"GOVC_URL": "", "GOVC_USERNAME": ""})
    assert res.code == 2
    for text in (
        "spec.datacentre: unknown field; did you mean 'datacenter'?",
        "spec.datacenter: required field is missing",
        "spec.username: is 301 characters long (expected at most 300",
        "spec.connection.insecure: got 'no' (expected true or false)",
        "spec.objects.networks[0]: '/DC0/vm/net' has the wrong shape (expected /<datacenter>/network/<name>)",
        "spec.objects.resourcePools[0]: '/DC0/host' has the wrong shape",
        "spec.objects.templates: required field is missing",
    ):
        assert f"{path}: {text}" in res.err, res.err


# -- templates ---------------------------------------------------------------------------------------------------


def template_info(sim: Vcsim, path: str) -> dict[str, object]:
    data = sim.govc_json("vm.info", path)
    vms = data["virtualMachines"] or data.get("VirtualMachines")  # type: ignore[index,union-attr]
    assert vms, f"no VM at {path}"
    vm: dict[str, object] = vms[0]
    return vm


def disk_gib(vm: dict[str, object], label: str) -> float:
    for dev in vm["config"]["hardware"]["device"]:  # type: ignore[index]
        if (dev.get("deviceInfo") or {}).get("label") == label:
            return float(dev["capacityInKB"]) / 1024 / 1024
    raise AssertionError(f"no {label}")


def attached_tags(sim: Vcsim, path: str) -> list[str]:
    return sorted(line.strip() for line in sim.govc("tags.attached.ls", "-r", path).splitlines() if line.strip())


def inventory_counts(sim: Vcsim) -> dict[str, int]:
    return {
        "categories": len(sim.govc("tags.category.ls").split()),
        "tags": len(sim.govc("tags.ls").splitlines()),
        "libraries": len(sim.govc("library.ls").split()),
        "items": len(sim.govc("library.ls", "/eksa-templates/*").split()),
        "templates": len(sim.govc("find", TEMPLATES, "-type", "m").split()),
    }


def import_args(ova: str, os_name: str, kube: str, *extra: str) -> list[str]:
    return ["template.import", "--ova", ova, "--os", os_name, "--kubernetes", kube, *extra]


def test_import_tags_resizes_and_converges(vcsim: Vcsim, small_ovas: dict[str, Path]) -> None:
    env = vcsim.env
    res = run(*import_args(str(small_ovas["bottlerocket"]), "os1", "1.21", "--dry-run"), env=env)
    assert res.code == 0 and "resize Hard disk 2 to 20G" in res.out
    assert vcsim.govc("library.ls").strip() == ""  # dry run: nothing created

    imports = [
        ("bottlerocket", "1.21", "Hard disk 2", 20),
        ("bottlerocket", "1.24", "Hard disk 1", 22),
        ("ubuntu", "1.24", None, None),
    ]
    for os_name, kube, disk, size in imports:
        res = run(*import_args(str(small_ovas[os_name]), os_name, kube), env=env)
        assert res.code == 0, res.err
        assert "snapshotted template cannot have its cluster VM disk size customised" in res.err
        channel = kube.replace(".", "-")
        release = load_catalog().channel(channel).release_name  # the line's current release: kubernetes-1-21-eks-28
        path = f"{TEMPLATES}/{os_name}-{release}"  # the documented default name
        vm = template_info(vcsim, path)
        assert vm["config"]["template"] is True  # type: ignore[index]
        assert vm["runtime"]["powerState"] == "poweredOff"  # type: ignore[index]
        if disk:
            assert disk_gib(vm, disk) == size
        assert "root" in vcsim.govc("snapshot.tree", "-vm", path)
        assert attached_tags(vcsim, path) == sorted([f"os:{os_name}", f"eksdRelease:{release}"])
        ok = run("template.validate", "--template", path, "--os", os_name, "--kubernetes", kube, env=env)
        assert ok.code == 0 and "valid" in ok.out

    counts = inventory_counts(vcsim)
    assert counts == {"categories": 2, "tags": 4, "libraries": 1, "items": 3, "templates": 3}
    for os_name, kube, _, _ in imports:  # rerun: every template exists and is left alone; nothing duplicated
        res = run(*import_args(str(small_ovas[os_name]), os_name, kube), env=env)
        assert res.code == 0 and "left alone" in res.out and "+ " not in res.out
    assert inventory_counts(vcsim) == counts
    flat = vcsim.govc("tags.category.info", "os")
    assert "SINGLE" in flat and "VirtualMachine" in flat

    # --no-snapshot, explicit name and folder (created)
    res = run(
        *import_args(
            str(small_ovas["ubuntu"]),
            "ubuntu",
            "1.23",
            "--no-snapshot",
            "--name",
            "u123",
            "--folder",
            f"/{DC}/vm/eksa/templates",
        ),
        env=env,
    )
    assert res.code == 0 and "created folder /DC0/vm/eksa/templates" in res.out
    assert "customised" not in res.err
    assert "root" not in vcsim.govc("snapshot.tree", "-vm", f"/{DC}/vm/eksa/templates/u123")


def test_validate_names_missing_and_wrong_tags_and_tag_fixes(vcsim: Vcsim, small_ovas: dict[str, Path]) -> None:
    env = vcsim.env
    path = f"{TEMPLATES}/selfbuilt"
    assert run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.22", "--name", "selfbuilt"), env=env).code == 0
    # strip the tags, as a template built and uploaded by hand would be
    vcsim.govc("tags.detach", "os:ubuntu", path)
    vcsim.govc("tags.detach", "eksdRelease:kubernetes-1-22-eks-28", path)
    vcsim.govc("tags.attach", "-c", "eksdRelease", "eksdRelease:kubernetes-1-22-eks-28", path)
    bad = run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.23", env=env)
    assert bad.code == 1
    assert "missing tag: category 'os' needs 'os:ubuntu'" in bad.err
    assert (
        "wrong tag: 'eksdRelease:kubernetes-1-22-eks-28' in category 'eksdRelease', expected exactly "
        "'eksdRelease:kubernetes-1-23-eks-33'"
    ) in bad.err
    fix = f"image-builder template.tag --template {path} --os ubuntu --kubernetes 1.23"
    assert f"try: {fix}" in bad.err
    res = run(*fix.split()[1:], env=env)
    assert res.code == 0 and "removed wrong tag eksdRelease:kubernetes-1-22-eks-28" in res.out
    assert attached_tags(vcsim, path) == ["eksdRelease:kubernetes-1-23-eks-33", "os:ubuntu"]
    assert run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.23", env=env).code == 0
    missing = run(
        "template.validate", "--template", f"{TEMPLATES}/nope", "--os", "ubuntu", "--kubernetes", "1.23", env=env
    )
    assert missing.code == 1 and "no template at" in missing.err
    badflag = run("template.validate", "--template", path, "--os", "windows", "--kubernetes", "1.23", env=env)
    assert badflag.code == 2 and "--os" in badflag.err


# -- TLS: thumbprint and pinning -----------------------------------------------------------------------------------


def test_thumbprint_and_pinning(vcsim: Vcsim, small_ovas: dict[str, Path]) -> None:
    pem = ssl.get_server_certificate(("127.0.0.1", vcsim.port))
    digest = hashlib.sha1(ssl.PEM_cert_to_DER_cert(pem), usedforsecurity=False).hexdigest().upper()
    expected = ":".join(digest[i : i + 2] for i in range(0, 40, 2))
    res = run("vsphere.thumbprint", "--server", vcsim.server)
    assert res.code == 0 and res.out.strip() == expected
    env = {**vcsim.env, "GOVC_INSECURE": ""}
    args = ["template.validate", "--template", f"{TEMPLATES}/x", "--os", "ubuntu", "--kubernetes", "1.24"]
    untrusted = run(*args, env=env)
    assert untrusted.code == 1 and "not trusted" in untrusted.err and "--thumbprint" in untrusted.err
    pinned = run(*args, "--thumbprint", expected, env=env)
    assert pinned.code == 1 and "no template at" in pinned.err  # connected: the pin was accepted
    wrong = "00:" + expected[3:]
    mismatch = run(*args, "--thumbprint", wrong, env=env)
    assert mismatch.code == 1 and "thumbprint" in mismatch.err
    malformed = run(*args, "--thumbprint", "abc", env=env)
    assert malformed.code == 2 and "--thumbprint" in malformed.err


# -- interruptions -------------------------------------------------------------------------------------------------


class _SlowOva(BaseHTTPRequestHandler):
    """Serves the OVA slowly, so an import is still running when the test interrupts it."""

    ova: bytes = b""
    started = threading.Event()

    def do_GET(self) -> None:
        type(self).started.set()
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.ova)))
        self.end_headers()
        step = max(1, len(self.ova) // 40)
        try:
            for i in range(0, len(self.ova), step):
                self.wfile.write(self.ova[i : i + step])
                self.wfile.flush()
                time.sleep(0.25)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_ova_url(small_ovas: dict[str, Path]) -> Iterator[str]:
    _SlowOva.ova = small_ovas["ubuntu"].read_bytes()
    _SlowOva.started = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowOva)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/os2.ova"
    finally:
        server.shutdown()
        server.server_close()


def _start_import(sim: Vcsim, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "image-builder"), *args],
        cwd=ROOT,
        env={**os.environ, **sim.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_interrupted_imports_converge(vcsim: Vcsim, small_ovas: dict[str, Path], slow_ova_url: str) -> None:
    # 1. the importing process is killed while vCenter pulls the OVA (a URL import)
    proc = _start_import(vcsim, *import_args(slow_ova_url, "ubuntu", "1.24"))
    assert _SlowOva.started.wait(30), "vCenter never fetched the OVA"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "Traceback" not in err
    assert vcsim.govc("library.ls", "/eksa-templates/*").strip()  # the item exists, the template does not
    assert not vcsim.govc("find", TEMPLATES, "-type", "m").strip()
    res = run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.24"), env=vcsim.env)
    assert res.code == 0, res.err
    twice = run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.24"), env=vcsim.env)
    assert twice.code == 0 and "left alone" in twice.out
    assert inventory_counts(vcsim) == {"categories": 2, "tags": 2, "libraries": 1, "items": 1, "templates": 1}

    # 2. vCenter itself dies during an import: a clear external error (exit 1), then a rerun against a fresh one
    _SlowOva.started.clear()
    proc = _start_import(vcsim, *import_args(slow_ova_url, "bottlerocket", "1.22"))
    assert _SlowOva.started.wait(30)
    vcsim.stop()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "lost the connection to vCenter" in err or "cannot" in err
    fresh = start_vcsim(vcsim.port)  # vcsim keeps its state in memory: the restarted one is fresh
    try:
        for _ in range(2):
            res = run(*import_args(str(small_ovas["bottlerocket"]), "bottlerocket", "1.22"), env=fresh.env)
            assert res.code == 0, res.err
        assert inventory_counts(fresh) == {"categories": 2, "tags": 2, "libraries": 1, "items": 1, "templates": 1}
    finally:
        fresh.stop()


# -- cluster specs -------------------------------------------------------------------------------------------------


def cluster_file(
    tmp_path: Path,
    name: str,
    *,
    server: str = "vcenter.example.com",
    endpoint: str = "192.168.10.5",
    folder: str = f"/{DC}/vm/eksa",
    worker_folder: str | None = None,
    thumbprint: str | None = None,
    insecure: bool = False,
    pool: str = f"/{DC}/host/DC0_C0/Resources",
    template: str = f"{TEMPLATES}/ubuntu-kubernetes-1-24-eks-36",
) -> Path:
    def machine(mname: str, mfolder: str) -> dict[str, object]:
        return {
            "apiVersion": "anywhere.eks.amazonaws.com/v1alpha1",
            "kind": "VSphereMachineConfig",
            "metadata": {"name": mname},
            "spec": {
                "datastore": f"/{DC}/datastore/LocalDS_0",
                "folder": mfolder,
                "resourcePool": pool,
                "template": template,
                "osFamily": "ubuntu",
            },
        }

    docs: list[dict[str, object]] = [
        {
            "apiVersion": "anywhere.eks.amazonaws.com/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {
                "kubernetesVersion": "1.24",
                "controlPlaneConfiguration": {
                    "count": 1,
                    "endpoint": {"host": endpoint},
                    "machineGroupRef": {"kind": "VSphereMachineConfig", "name": f"{name}-cp"},
                },
                "workerNodeGroupConfigurations": [
                    {"name": "md-0", "machineGroupRef": {"kind": "VSphereMachineConfig", "name": f"{name}-wk"}}
                ],
                "datacenterRef": {"kind": "VSphereDatacenterConfig", "name": name},
            },
        },
        {
            "apiVersion": "anywhere.eks.amazonaws.com/v1alpha1",
            "kind": "VSphereDatacenterConfig",
            "metadata": {"name": name},
            "spec": {
                "datacenter": DC,
                "network": f"/{DC}/network/VM Network",
                "server": server,
                "insecure": insecure,
                **({"thumbprint": thumbprint} if thumbprint is not None else {}),
            },
        },
        machine(f"{name}-cp", folder),
        machine(f"{name}-wk", worker_folder or folder),
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in docs))
    return path


def test_cluster_validate_static_checks(tmp_path: Path) -> None:
    files = [
        cluster_file(tmp_path, "ipnotrust", server="10.0.0.1", endpoint="10.1.0.1", folder=f"/{DC}/vm/a"),
        cluster_file(tmp_path, "badthumb", thumbprint="ab:cd", endpoint="10.1.0.2", folder=f"/{DC}/vm/b"),
        cluster_file(tmp_path, "badpool", pool=f"/{DC}/host/DC0_C0", endpoint="10.1.0.3", folder=f"/{DC}/vm/c"),
        cluster_file(tmp_path, "twofolders", endpoint="10.1.0.4", folder=f"/{DC}/vm/d", worker_folder=f"/{DC}/vm/e"),
        cluster_file(tmp_path, "hostname", endpoint="vip.example.com", folder=f"/{DC}/vm/f"),
        cluster_file(tmp_path, "first", endpoint="10.1.0.9", folder=f"/{DC}/vm/shared"),
        cluster_file(tmp_path, "second", endpoint="10.1.0.9", folder=f"/{DC}/vm/shared"),
    ]
    res = run("cluster.validate", *(a for f in files for a in ("-f", str(f))), "--offline")
    assert res.code == 2
    for text in (
        "ipnotrust.yaml: VSphereDatacenterConfig/ipnotrust spec.thumbprint: server 10.0.0.1 is an IP",
        "(expected thumbprint set, or insecure: true (spec 7.2))",
        "badthumb.yaml: VSphereDatacenterConfig/badthumb spec.thumbprint: 'AB:CD' is not a SHA1 thumbprint",
        "badpool.yaml: VSphereMachineConfig/badpool-cp spec.resourcePool: '/DC0/host/DC0_C0' is not a resource pool",
        "twofolders.yaml: Cluster/twofolders: its machines use 2 folders",
        "hostname.yaml: Cluster/hostname spec.controlPlaneConfiguration.endpoint.host: 'vip.example.com' is not an IP",
        "second.yaml: Cluster/second endpoint.host: control-plane endpoint 10.1.0.9 is also used by first",
        "second.yaml: Cluster/second folder: folder /DC0/vm/shared is also used by first",
    ):
        assert text in res.err, res.err
    ok = [
        cluster_file(tmp_path, "one", endpoint="10.2.0.1", folder=f"/{DC}/vm/one", insecure=True, server="10.0.0.2"),
        cluster_file(tmp_path, "two", endpoint="10.2.0.2", folder=f"/{DC}/vm/two"),
    ]
    res = run("cluster.validate", "-f", str(ok[0]), "-f", str(ok[1]), "--offline")
    assert res.code == 0 and "2 cluster spec(s) pass the static checks" in res.out
    example = run("cluster.validate", "-f", str(ROOT / "config/examples/vsphere-cluster.yaml"), "--offline")
    assert example.code == 0


def test_cluster_validate_against_vcenter(vcsim: Vcsim, small_ovas: dict[str, Path], tmp_path: Path) -> None:
    env = vcsim.env
    assert run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.24"), env=env).code == 0
    vcsim.govc("folder.create", f"/{DC}/vm/eksa")
    thumb = run("vsphere.thumbprint", "--server", vcsim.server).out.strip()
    good = cluster_file(tmp_path, "mgmt", server=vcsim.server, thumbprint=thumb)
    res = run("cluster.validate", "-f", str(good), env=env)
    assert res.code == 0 and "checked against vCenter" in res.out, res.err
    wrong = cluster_file(tmp_path, "wrongthumb", server=vcsim.server, thumbprint="00:" + thumb[3:])
    res = run("cluster.validate", "-f", str(wrong), env=env)
    assert res.code == 1 and f"has thumbprint {thumb}, not the pinned 00:" in res.err  # refused before login
    # insecure connections still check a thumbprint that is written in the spec
    both = cluster_file(tmp_path, "both", server=vcsim.server, thumbprint="00:" + thumb[3:], insecure=True)
    res = run("cluster.validate", "-f", str(both), env=env)
    assert res.code == 1 and f"does not match the server's {thumb}" in res.err
    vcsim.govc("tags.detach", "os:ubuntu", f"{TEMPLATES}/ubuntu-kubernetes-1-24-eks-36")
    untagged = cluster_file(tmp_path, "untagged", server=vcsim.server, insecure=True, folder=f"/{DC}/vm/nope")
    res = run("cluster.validate", "-f", str(untagged), env=env)
    assert res.code == 1
    assert "folder /DC0/vm/nope does not exist" in res.err
    assert "missing tag: category 'os' needs 'os:ubuntu'" in res.err
    assert f"image-builder template.tag --template {TEMPLATES}/ubuntu-kubernetes-1-24-eks-36 --os ubuntu" in res.err


def test_import_from_list(vcsim: Vcsim, small_ovas: dict[str, Path], tmp_path: Path) -> None:
    listing = tmp_path / "templates.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"- {{ova: {small_ovas['ubuntu']}, os: ubuntu, kubernets: '1.24'}}\n- {{ova: missing.ova, os: os9}}\n"
    )
    res = run("template.import", "--from-file", str(bad), env=vcsim.env)
    assert res.code == 2
    assert f"{bad}: [0].kubernets: unknown field; did you mean 'kubernetes'?" in res.err
    assert f"{bad}: [1].ova: {tmp_path / 'missing.ova'} does not exist" in res.err
    assert vcsim.govc("library.ls").strip() == ""  # nothing happened
    (tmp_path / "os1.ova").symlink_to(small_ovas["bottlerocket"])
    listing.write_text("\n".join(f"- {{ova: os1.ova, os: os1, kubernetes: '{k}'}}" for k in ("1.21", "1.22")) + "\n")
    res = run("template.import", "--from-file", str(listing), env=vcsim.env)
    assert res.code == 0, res.err
    assert res.err.count("customised") == 1  # the snapshot warning once, not per template
    assert "vCenter API calls:" in res.out and "for 2 template(s)" in res.out
    vm = template_info(vcsim, f"{TEMPLATES}/bottlerocket-kubernetes-1-22-eks-28")
    assert disk_gib(vm, "Hard disk 1") == 22


def test_corrupt_ova_is_refused_and_leaves_no_item(vcsim: Vcsim, small_ovas: dict[str, Path], tmp_path: Path) -> None:
    import tarfile

    bad = tmp_path / "bad.ova"
    with tarfile.open(small_ovas["ubuntu"]) as src, tarfile.open(bad, "w", format=tarfile.USTAR_FORMAT) as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(".vmdk"):
                data = data[:-1] + bytes([data[-1] ^ 1])  # one flipped bit in the disk
            member.size = len(data)
            dst.addfile(member, __import__("io").BytesIO(data))
    res = run(*import_args(str(bad), "ubuntu", "1.24"), env=vcsim.env)
    assert res.code == 2 and "does not match the OVA's manifest" in res.err and "-disk1.vmdk" in res.err
    assert vcsim.govc("library.ls", "/eksa-templates/*").strip() == ""  # nothing half-imported to trip a rerun
    assert "Templates" not in vcsim.govc("ls", f"/{DC}/vm"), "the OVA is checked before anything is created"
    good = run(*import_args(str(small_ovas["ubuntu"]), "ubuntu", "1.24"), env=vcsim.env)
    assert good.code == 0
    files = vcsim.govc("library.info", "-l", "/eksa-templates/ubuntu-kubernetes-1-24-eks-36/*")
    for suffix in (".ovf", ".mf", "-disk1.vmdk"):  # unpacked into the content library's OVF layout
        assert suffix in files


@pytest.mark.parametrize(
    ("key", "path", "found"),
    [
        ("folders", f"/{DC}/vm/DC0_H0_VM0", "VirtualMachine"),
        ("templates", f"/{DC}/vm/DC0_H0_VM1", "VirtualMachine"),
        ("networks", f"/{DC}/network/DVS0", "DistributedVirtualSwitch"),
        ("datastores", f"/{DC}/datastore/not-a-datastore", "Folder"),
        ("resourcePools", f"/{DC}/host/DC0_C0/DC0_C0_H0", "HostSystem"),
    ],
)
def test_an_object_of_the_wrong_kind_is_refused(tmp_path: Path, vcsim: Vcsim, key: str, path: str,
                                                 found: str) -> None:  # fmt: skip
    """Each object list names objects of one kind: a VM listed as a folder (it would get the admin role) and the
    like are refused on the dry run and the real run alike, naming the path, the kind found and the kind expected,
    and nothing is changed."""
    if key == "datastores":
        vcsim.govc("folder.create", path)  # a folder in the datastore folder: the right place, the wrong kind
    objects = {
        "networks": [f"/{DC}/network/VM Network"],
        "datastores": [f"/{DC}/datastore/LocalDS_0"],
        "resourcePools": [f"/{DC}/host/DC0_C0"],
        "folders": [f"/{DC}/vm/eksa"],
        "templates": [TEMPLATES],
    }
    objects[key] = [*objects[key], path]
    user = user_yaml(tmp_path, vcsim, objects=objects)
    for args in (("--dry-run",), ()):
        code, out, err = setup_user(vcsim, user, "--password", "env:NEW_PW", *args)
        assert code == 2, out + err
        assert f"spec.objects.{key}[1]: {path} is a {found} on vCenter (expected a " in err, err
        assert str(user) in err and "Traceback" not in err
    assert "EKSAUserRole" not in roles(vcsim), "nothing was changed"
