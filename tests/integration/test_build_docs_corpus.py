"""The reference tool's build documentation, as its users copy it (tests/data/build-docs/, verbatim; provenance in
tests/data/README.md): every key it uses is known here, and every placeholder is refused with a message naming the
file, the field and the shape expected (exit 2, no traceback). Filled with real values, and with the docs' own JSON
slips fixed (a trailing comma, a '...', '#' comments), each example is accepted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.common import reference
from tests.support.docs_corpus import VERDICTS, dry_run, fixed

ISO_SHA = "ea5f349d492fed819e5086d351de47261c470fc794f7124805d176d69ddf1fcd"


def test_the_documented_examples_filled_with_real_values_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb [trusted=yes] http://artifacts.internal/debian focal main\n")
    (tmp_path / "resolv.conf").write_text("nameserver 10.0.0.2\n")
    (tmp_path / "roles" / "load_additional_files").mkdir(parents=True)
    (tmp_path / "extra_vars.yaml").write_text("a: 1\n")
    rhel = {"iso_url": "https://mirror.example.com/rhel-8.10-x86_64-dvd.iso", "iso_checksum": ISO_SHA,
            "iso_checksum_type": "sha256"}  # fmt: skip
    fill: dict[str, dict[str, Any]] = {
        # only the required fields filled: the optional ones stay "" as published (template "": from the ISO)
        "vsphere.json": {"cluster": "Cluster-1", "datacenter": "Datacenter", "datastore": "datastore1",
                         "folder": "/Datacenter/vm/build", "network": "VM Network", "password": "Pw-Filled-1",
                         "username": "administrator@vsphere.local", "vcenter_server": "vcenter.example.com"},
        "baremetal-rhel.json": rhel | {"rhel_username": "rhsm-user", "rhel_password": "Pw-Filled-2",
                                       "extra_rpms": "kmod-megaraid_sas lldpad"},
        "ami.json": {"ansible_extra_vars": f"@{tmp_path / 'extra_vars.yaml'}",
                     "custom_role_name_list": [str(tmp_path / "roles" / "load_additional_files")],
                     "manifest_output": str(tmp_path / "manifest.json")},
        "nutanix.json": {"nutanix_cluster_name": "PE-1", "source_image_name": "ubuntu-20.04-cloudimg",
                         "image_name": "ubuntu-2004-kube", "image_export": "false", "nutanix_subnet_name": "vlan-1",
                         "image_url": "https://cloud-images.ubuntu.com/focal/current/focal-server-cloudimg-amd64.img",
                         "nutanix_endpoint": "prism.example.com", "nutanix_username": "admin",
                         "nutanix_password": "Pw-Filled-3"},
        "proxy.json": {"http_proxy": "http://user:Pw-Filled-4@proxy.example.com:3128",
                       "https_proxy": "https://proxy.example.com:3129/", "no_proxy": "localhost,.svc,10.0.0.0/8"},
        "proxy-extra-packages.json": {"extra_rpms": None},  # ubuntu: the docs give both, one per OS
        "satellite.json": rhel | {"rhsm_server_hostname": "satellite.example.com",
                                  "rhsm_server_release_version": "8.10"},
        "airgapped.json": {"extra_repos": str(tmp_path / "sources.list"),
                           "iso_url": "http://artifacts.internal/iso/ubuntu-20.04.1-legacy-server-amd64.iso",
                           "iso_checksum": ISO_SHA},
    }  # fmt: skip
    for name, values in fill.items():
        os_name, provider, _ = VERDICTS[name]
        data = json.loads(fixed(name))
        for key, value in values.items():
            if value is None:
                data.pop(key)
            else:
                data[key] = value
        path = tmp_path / name
        path.write_text(json.dumps(data))
        res = dry_run(os_name, provider, path)
        assert res.code == 0, (name, res.err)
        if name == "vsphere.json":  # its "template": "" is the reference's "build from the ISO"
            assert "vsphere-iso" in res.out and '"template": ""' in reference("build-docs", name).read_text()
    # the RHEL fields added to the vSphere example; the minor-version pin on a RHEL 9 build
    vsphere_rhel = json.loads((tmp_path / "vsphere.json").read_text()) | json.loads(fixed("vsphere-rhel-fields.json"))
    vsphere_rhel |= rhel | {"rhel_username": "rhsm-user", "rhel_password": "Pw-Filled-5"}
    (tmp_path / "vsphere-rhel.json").write_text(json.dumps(vsphere_rhel))
    assert dry_run("redhat", "vsphere", tmp_path / "vsphere-rhel.json").code == 0
    pinned = json.loads(fixed("rhel-minor-version.json")) | rhel | {"rhel_username": "u", "rhel_password": "Pw-6"}
    (tmp_path / "pinned.json").write_text(json.dumps(pinned))
    res = dry_run("redhat", "baremetal", tmp_path / "pinned.json", "--os-version", "9")
    assert res.code == 0, res.err
    assert dry_run("redhat", "baremetal", tmp_path / "pinned.json").code == 2  # 9.4 on a RHEL 8 build
    files = json.loads(fixed("files.json"))
    entry = files["additional_files_list"][0] | {"src": str(tmp_path / "resolv.conf"), "dest": "/etc/resolv.conf",
                                                 "owner": "root", "group": "root", "mode": "0644"}  # fmt: skip
    (tmp_path / "files.json").write_text(json.dumps({"additional_files_list": [entry]}))
    res = dry_run("ubuntu", "baremetal", tmp_path / "files.json")
    assert res.code == 0, res.err
