"""The reference tool's documented build configs, filled with real values, work here unchanged (issue 16).

Each example is the JSON of the reference's public build documentation (EKS Anywhere docs, "Building node images":
vSphere, bare metal, Nutanix, proxies, additional files, Red Hat Satellite, air-gapped). Each must pass
``build --dry-run`` for its pair and render a Packer template the real Packer accepts, with its fields honoured,
not merely accepted; a field set to something invalid gets the usual message naming file and field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.builder.packer import ACTIVATION_KEY_ENV, BUILD_PROXY_ENV, PackerInfo, render_build, validate
from imagebuilder.builder.resolve import make_plan
from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.core.hostinfo import KvmStatus
from imagebuilder.customization.model import load_additional_files
from imagebuilder.plan.model import BuildPlan, BuildRequest
from tests.support.common import ROOT, build_args, plan_for, run
from tests.support.reference import ISO_SHA, RHEL, SATELLITE, pinned_mirror

PACKER = PackerInfo.detect()
KVM = KvmStatus(True, "test")

#: the reference's current vSphere example (no content library field; `template` for its clone builder)
VSPHERE = {
    "cluster": "Cluster-1",
    "convert_to_template": "false",
    "create_snapshot": "false",
    "datacenter": "SDDC-Datacenter",
    "datastore": "WorkloadDatastore",
    "folder": "/SDDC-Datacenter/vm/image-builder",
    "insecure_connection": "false",
    "linked_clone": "false",
    "network": "sddc-cgw-network-1",
    "password": "Vc-Pa55-parity-1",
    "resource_pool": "*/Resources",
    "template": "ubuntu-2204-base",
    "username": "administrator@vsphere.local",
    "vcenter_server": "vcenter.sddc.example.com",
}
#: "Build Nutanix node images": nutanix.json
NUTANIX = {
    "nutanix_cluster_name": "PE-Cluster-1",
    "source_image_name": "ubuntu-22.04-server-cloudimg-amd64",
    "image_name": "ubuntu-2204-kube-v1-24",
    "image_url": "https://cloud-images.ubuntu.com/releases/22.04/release/ubuntu-22.04-server-cloudimg-amd64.img",
    "image_export": "true",
    "nutanix_subnet_name": "vlan-100",
    "nutanix_endpoint": "prism-central.example.com",
    "nutanix_insecure": "false",
    "nutanix_port": "9440",
    "nutanix_username": "admin",
    "nutanix_password": "Nx-Pa55-parity-3",
}
#: "Using Proxy Server" (with wget added, as that section advises)
PROXY = {
    "http_proxy": "http://proxyuser:Px-Pa55-parity-4@proxy.example.com:3128",
    "https_proxy": "https://proxy.example.com:3129/",
    "no_proxy": "localhost,127.0.0.1,.svc,10.0.0.0/8",
}


def rendered_text(plan: BuildPlan, tmp_path: Path) -> tuple[Any, str]:
    rendered = render_build(plan, tmp_path / "build", PACKER, kvm=KVM, require_artifacts=False)
    check = validate(rendered, PACKER)
    assert check.returncode == 0, check.stdout + check.stderr
    files = {p: p.read_text(errors="replace") for p in (tmp_path / "build").rglob("*") if p.is_file()}
    for secret in plan.config.secret_values() if plan.config else []:
        leaked = [str(p) for p, text in files.items() if secret in text]
        assert not leaked, f"a secret reached {leaked}"
    return rendered, rendered.template.read_text()


def role_vars(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "build" / "ansible-vars.json").read_text())  # type: ignore[no-any-return]


def test_vsphere_current_example_clones_its_template_and_needs_no_library(tmp_path: Path) -> None:
    plan = plan_for("ubuntu", "vsphere", tmp_path, VSPHERE)
    assert any("vsphere-clone of ubuntu-2204-base" in s for s in plan.steps)
    assert not any("content library" in s for s in plan.steps)  # no library: the OVA is only exported
    rendered, text = rendered_text(plan, tmp_path)
    assert rendered.stages == ("vsphere-clone.node",)  # the ISO stage is skipped
    assert 'source "vsphere-iso"' not in text and 'template     = "ubuntu-2204-base"' in text
    assert "content_library_destination" not in text


def test_vsphere_rhel_fields_with_and_without_the_template(tmp_path: Path) -> None:
    iso_build = {k: v for k, v in VSPHERE.items() if k != "template"} | RHEL
    plan = plan_for("redhat", "vsphere", tmp_path, iso_build)
    rendered, text = rendered_text(plan, tmp_path / "iso")
    assert rendered.stages == ("vsphere-iso.base", "vsphere-clone.node")
    assert RHEL["iso_url"] in text
    # a clone has its OS already: no ISO needed, the subscription still is
    clone = VSPHERE | {k: v for k, v in RHEL.items() if k.startswith("rhel_")}
    plan = plan_for("redhat", "vsphere", tmp_path, clone)
    rendered, text = rendered_text(plan, tmp_path / "clone")
    assert rendered.stages == ("vsphere-clone.node",) and "iso_url" not in text
    assert rendered.env["PKR_VAR_enterprise_password"] == RHEL["rhel_password"]


def test_bare_metal_rhel_example_installs_its_extra_rpms_through_the_customize_role(tmp_path: Path) -> None:
    plan = plan_for("redhat", "baremetal", tmp_path, RHEL | {"extra_rpms": "kmod-megaraid_sas lldpad"})
    rendered_text(plan, tmp_path)
    variables = role_vars(tmp_path)
    assert variables["custom_roles"] == ["customize"]
    assert variables["customize_packages"] == ["kmod-megaraid_sas", "lldpad"]


def test_nutanix_example_downloads_the_source_by_url_and_exports_the_image(tmp_path: Path) -> None:
    plan = plan_for("ubuntu", "nutanix", tmp_path, NUTANIX)
    assert any("image_export" in s for s in plan.steps)
    _, text = rendered_text(plan, tmp_path)
    assert f'source_image_uri = "{NUTANIX["image_url"]}"' in text
    assert "image_export     = true" in text
    # image_url alone is enough: the source image need not be uploaded first
    plan_for("ubuntu", "nutanix", tmp_path, {k: v for k, v in NUTANIX.items() if k != "source_image_name"})
    with pytest.raises(InputErrors) as info:
        plan_for("ubuntu", "nutanix", tmp_path, {k: v for k, v in NUTANIX.items() if k not in ("source_image_name",
                                                                                             "image_url")})  # fmt: skip
    assert "source_image_name or image_url" in str(info.value)


def test_proxies_reach_packer_ansible_and_the_vm_and_their_password_is_never_shown(tmp_path: Path) -> None:
    plan = plan_for("ubuntu", "baremetal", tmp_path, PROXY | {"extra_debs": "wget"})
    password = "Px-Pa55-parity-4"
    shown = json.dumps(plan.to_json()) + plan.render_text()
    assert password not in shown and "proxyuser:********@proxy.example.com" in shown
    rendered, _ = rendered_text(plan, tmp_path)
    assert rendered.env["http_proxy"] == rendered.env["HTTP_PROXY"] == PROXY["http_proxy"]
    assert rendered.env["https_proxy"] == "https://proxy.example.com:3129"
    assert json.loads(rendered.env[BUILD_PROXY_ENV])["no_proxy"] == PROXY["no_proxy"]
    assert password in plan.config.secret_values()  # type: ignore[union-attr]
    assert role_vars(tmp_path)["customize_packages"] == ["wget"]
    for part in ("node-provision.yml", "node-finish.yml"):  # node.yml's two plays
        node = (ROOT / "ansible" / part).read_text()
        assert BUILD_PROXY_ENV in node  # the play's environment: the VM's tasks use the proxy, no file keeps it


def test_satellite_activation_key_replaces_the_subscription_user(tmp_path: Path) -> None:
    config = {k: v for k, v in RHEL.items() if not k.startswith("rhel_")} | SATELLITE
    plan = plan_for("redhat", "baremetal", tmp_path, config)
    assert any("Satellite satellite.example.com (org Example_Org" in s for s in plan.steps)
    rendered, text = rendered_text(plan, tmp_path)
    assert rendered.env[ACTIVATION_KEY_ENV] == "ak-Parity-5"
    assert "RHSM_PASSWORD" not in text and "enterprise_password" not in text
    variables = role_vars(tmp_path)
    assert variables["redhat_subscription_method"] == "activation_key"
    assert variables["redhat_subscription_server"] == "satellite.example.com"
    assert variables["redhat_subscription_release"] == "8.10"


def test_air_gapped_example_uses_the_private_hosts_as_its_mirror(tmp_path: Path) -> None:
    sources = tmp_path / "sources.list"
    sources.write_text(
        "deb [trusted=yes] http://artifacts.internal/debian focal main restricted universe multiverse\n"
        "deb [trusted=yes] http://artifacts.internal/debian focal-updates main restricted universe multiverse\n"
    )
    config = {
        "eksa_build_tooling_repo_url": "https://internal-git-host/eks-anywhere-build-tooling.git",
        "image_builder_repo_url": "https://internal-repos/image-builder.git",
        "private_artifacts_eksd_fqdn": "http://artifacts.internal/artifactory/eks-d-artifacts",
        "private_artifacts_eksa_fqdn": "http://artifacts.internal:8081/artifactory/eks-a-artifacts",
        "extra_repos": str(sources),
        "disable_public_repos": "true",
        "iso_url": "http://artifacts.internal/iso/ubuntu-20.04.1-legacy-server-amd64.iso",
        "iso_checksum": ISO_SHA,
        "iso_checksum_type": "sha256",
    }
    plan = plan_for("ubuntu", "baremetal", tmp_path, config)
    assert plan.mirror is not None and plan.mirror.base == config["private_artifacts_eksd_fqdn"]
    assert any("not cloned" in s for s in plan.steps)
    _, text = rendered_text(plan, tmp_path)
    assert config["iso_url"] in text and f"sha256:{ISO_SHA}" in text
    variables = role_vars(tmp_path)
    assert variables["customize_repo_file"] == {"name": "image-builder-extra.list", "content": sources.read_text()}
    assert variables["customize_disable_public_repos"] is True
    # a --mirror as well is ambiguous
    with pytest.raises(InputError, match="both name where the artifacts come from"):
        plan_for("ubuntu", "baremetal", tmp_path, config, mirror=str(tmp_path))
    # a repository file that is not a sources.list is refused before anything boots
    sources.write_text("http://artifacts.internal/debian focal main\n")
    with pytest.raises(InputErrors, match="line 1 is not a repository line"):
        plan_for("ubuntu", "baremetal", tmp_path, config)


def test_files_json_is_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "resolved.conf").write_text("[Resolve]\nDNS=10.0.0.2\n")
    files = tmp_path / "files.json"
    entry = {"src": "resolved.conf", "dest": "/etc/systemd/resolved.conf.d/dns.conf", "owner": "root",
             "group": "root", "mode": "0644"}  # fmt: skip
    files.write_text(json.dumps({"additional_files_list": [entry]}))
    [loaded] = load_additional_files(files)
    assert loaded["src"] == str(tmp_path / "resolved.conf") and loaded["dest"] == entry["dest"]
    plan = plan_for("ubuntu", "baremetal", tmp_path, {"additional_files_list_file": str(files)})
    rendered_text(plan, tmp_path)
    assert role_vars(tmp_path)["customize_files"] == [loaded]
    bad = [
        entry | {"dest": "etc/relative"},
        entry | {"dest": "/etc/../root/.ssh/authorized_keys"},
        entry | {"mode": 644},
        entry | {"owner": "root; rm -rf /"},
        entry | {"src": "missing.conf"},
        entry | {"dest": "/etc/{{ lookup('pipe', 'id') }}"},
    ]
    for item in bad:
        files.write_text(json.dumps({"additional_files_list": [item]}))
        with pytest.raises(InputErrors) as info:
            load_additional_files(files)
        assert all(e.source == str(files) or str(files) in str(e) for e in info.value.errors), item


def test_the_cli_takes_files_config_and_refuses_it_twice(tmp_path: Path) -> None:
    (tmp_path / "motd").write_text("built by image-builder\n")
    files = tmp_path / "files.json"
    files.write_text(json.dumps({"additional_files_list": [{"src": "motd", "dest": "/etc/motd", "owner": "root",
                                                             "group": "root", "mode": "0644"}]}))  # fmt: skip
    res = run(*build_args("ubuntu", "baremetal"), "--files-config", str(files), "--dry-run", "--offline")
    assert res.code == 0, res.err
    assert "files /etc/motd" in res.out
    config = tmp_path / "baremetal.json"
    config.write_text(json.dumps({"additional_files_list_file": str(files)}))
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
              "--baremetal-config", str(config), "--files-config", str(files), "--dry-run", "--offline")  # fmt: skip
    assert res.code == 2 and "--files-config" in res.err and "Traceback" not in res.err


def test_ansible_verbosity_reaches_the_provisioner(tmp_path: Path) -> None:
    request = BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                           ansible_verbosity=3)  # fmt: skip
    rendered = render_build(make_plan(request), tmp_path / "build", PACKER, kvm=KVM, require_artifacts=False)
    assert '"-vvv",' in rendered.template.read_text()
    assert validate(rendered, PACKER).returncode == 0
    quiet = render_build(
        make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True)),
        tmp_path / "quiet", PACKER, kvm=KVM, require_artifacts=False,
    )  # fmt: skip
    assert '"-v' not in quiet.template.read_text()


@pytest.mark.parametrize("value", ["7", "-1", "v", "3;id"])
def test_a_bad_ansible_verbosity_is_bad_input(value: str) -> None:
    res = run(*build_args("ubuntu", "baremetal"), "--ansible-verbosity", value, "--dry-run", "--offline")
    assert res.code == 2 and "--ansible-verbosity" in res.err, res.err


def test_eksa_release_pins_the_distro_manifest_its_bundle_names(tmp_path: Path) -> None:
    mirror = pinned_mirror(tmp_path)
    request = BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1.21", offline=True,
                           mirror=str(mirror), eksa_release="v0.21.3")  # fmt: skip
    plan = make_plan(request)
    assert plan.release == 4 and plan.manifest.resolved
    assert plan.manifest.source.endswith("kubernetes-1-21/kubernetes-1-21-eks-4.yaml")
    assert plan.kubernetes_version.startswith("v1.21")
    # the same through the CLI and the reference's environment variable
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1.21", "--offline",
              "--mirror", str(mirror), "--dry-run", env={"EKSA_RELEASE_VERSION": "v0.21.3"})  # fmt: skip
    assert res.code == 0, res.err
    assert "kubernetes-1-21-eks-4.yaml" in res.out


@pytest.mark.parametrize("value", ["0.21.3", "v0.21", "v0.21.3;id", "latest"])
def test_a_bad_eksa_release_is_bad_input(value: str) -> None:
    for extra, env in ((["--eksa-release", value], None), ([], {"EKSA_RELEASE_VERSION": value})):
        res = run(*build_args("ubuntu", "baremetal"), *extra, "--dry-run", "--offline", env=env)
        assert res.code == 2 and "release version" in res.err, res.err


@pytest.mark.parametrize(
    ("os_name", "version", "provider", "config"),
    [
        ("ubuntu", "24.04", "baremetal", {}),
        ("ubuntu", "24.04", "vsphere", {k: v for k, v in VSPHERE.items() if k != "template"}),
        ("redhat", "9", "baremetal", RHEL | {"iso_url": "https://mirror.example.com/rhel/rhel-9.6-x86_64-dvd.iso"}),
        ("redhat", "9", "vsphere", VSPHERE | RHEL),
    ],
)
def test_newer_os_versions_render_and_validate(
    os_name: str, version: str, provider: str, config: dict[str, Any], tmp_path: Path
) -> None:
    plan = plan_for(os_name, provider, tmp_path, config, os_version=version)
    assert plan.os_version.version == version
    _, text = rendered_text(plan, tmp_path)
    if os_name == "ubuntu" and provider == "baremetal":
        assert "ubuntu-24.04.1-live-server-amd64.iso" in text
    if provider == "vsphere" and "template" not in config:
        assert ("rhel9_64Guest" if os_name == "redhat" else "ubuntu64Guest") in text


# --firmware (the reference: UEFI for Ubuntu OVA and raw, where raw defaults to it, and for RHEL raw)
@pytest.mark.parametrize(
    ("os_name", "provider", "config", "given", "expected"),
    [
        ("ubuntu", "baremetal", None, None, "efi"),
        ("ubuntu", "baremetal", None, "bios", "bios"),
        ("ubuntu", "vsphere", {k: v for k, v in VSPHERE.items() if k != "template"}, None, "bios"),
        ("ubuntu", "vsphere", {k: v for k, v in VSPHERE.items() if k != "template"}, "efi", "efi"),
        ("redhat", "baremetal", RHEL, None, "bios"),
        ("redhat", "baremetal", RHEL, "efi", "efi"),
        ("redhat", "baremetal", RHEL | {"iso_url": "https://mirror.example.com/rhel/rhel-9.6-x86_64-dvd.iso"}, "efi",
         "efi"),
    ],
)  # fmt: skip
def test_firmware_is_rendered_per_builder_and_validates(
    os_name: str, provider: str, config: dict[str, Any] | None, given: str | None, expected: str, tmp_path: Path
) -> None:
    version = "9" if config and "rhel-9" in str(config.get("iso_url")) else None
    plan = plan_for(os_name, provider, tmp_path, config, firmware=given, os_version=version)
    assert plan.firmware == expected and plan.to_json()["firmware"] == expected
    assert ("UEFI (efi)" if expected == "efi" else "BIOS (bios)") in plan.render_text()
    _, text = rendered_text(plan, tmp_path)
    efi_keys = plan.os_version.boot_command_efi
    if provider == "vsphere":
        assert f'firmware             = "{expected}"' in text
    else:
        # QEMU boots OVMF (Debian's ovmf) only for a UEFI build
        assert ('"-bios", "/usr/share/ovmf/OVMF.fd"' in text) == (expected == "efi")
    if efi_keys:  # the installer's menu differs by firmware: isolinux under BIOS, GRUB under UEFI
        keys = json.dumps(list(efi_keys if expected == "efi" else plan.os_version.boot_command))
        assert json.loads(keys)[0] in text
        other = plan.os_version.boot_command if expected == "efi" else efi_keys
        assert other[0] not in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--os", "redhat", "--hypervisor", "vsphere"],
            "UEFI redhat images are built on baremetal only, not on vsphere",
        ),
        (
            ["--os", "ubuntu", "--hypervisor", "nutanix"],
            "UEFI ubuntu images are built on baremetal, vsphere only, not on nutanix",
        ),
        (["--os", "ubuntu", "--hypervisor", "ami"], "not on ami"),
    ],
)
def test_efi_where_the_reference_does_not_build_it_is_bad_input(args: list[str], needle: str) -> None:
    res = run("build", *args, "--release-channel", "1-24", "--firmware", "efi", "--dry-run", "--offline")
    assert res.code == 2 and needle in res.err and "--firmware" in res.err, res.err
    assert "Traceback" not in res.err


@pytest.mark.parametrize("value", ["uefi", "EFI", "legacy", "efi;id", ""])
def test_a_bad_firmware_is_bad_input(value: str) -> None:
    res = run(*build_args("ubuntu", "baremetal"), "--firmware", value, "--dry-run", "--offline")
    assert res.code == 2 and "--firmware" in res.err and "bios or efi" in res.err, res.err
    if value == "uefi":
        assert "did you mean 'efi'" in res.err


def test_an_efi_clone_says_that_its_template_decides(tmp_path: Path) -> None:
    plan = plan_for("ubuntu", "vsphere", tmp_path, VSPHERE, firmware="efi")
    assert any("the template must be an EFI VM" in step for step in plan.steps)
    _, text = rendered_text(plan, tmp_path)
    clone = text.split('source "vsphere-clone" "node"')[1].split("\n}\n")[0]
    assert "firmware" not in clone and 'source "vsphere-iso"' not in text, "a clone has no firmware of its own"
