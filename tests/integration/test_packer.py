"""The Packer bundle, checked by the real Packer: every pair renders, validates and is fmt-clean; config values
reach the template; secrets never reach a file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.builder.lint import lint_templates, render_pair
from imagebuilder.builder.packer import PackerInfo, fmt_check, render_build, validate
from imagebuilder.core.errors import InputError
from imagebuilder.core.hostinfo import KvmStatus
from imagebuilder.core.render import hcl
from tests.support.common import BIN, EXAMPLES, PAIRS, ROOT, plan_for

PACKER = PackerInfo.detect()
KVM = KvmStatus(True, "test")
TCG = KvmStatus(False, "test")


def render(plan: Any, tmp_path: Path, packer: PackerInfo = PACKER, kvm: KvmStatus = KVM) -> Any:
    return render_build(plan, tmp_path / "build", packer, kvm=kvm, require_artifacts=False)


def test_installed_packer_is_detected() -> None:
    assert PACKER.version >= (1, 6, 6)


@pytest.fixture(scope="module")
def lint_results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    results = lint_templates(tmp_path_factory.mktemp("lint"), PACKER)
    assert {(r.os, r.provider) for r in results} == set(PAIRS)
    assert [(r.os, r.provider) for r in results if r.arch != "amd64"] == [("ubuntu", "baremetal")]
    return {(r.os, r.provider) + (() if r.arch == "amd64" else (r.arch,)): r for r in results}


FULL_VALIDATE = [p for p in PAIRS if p[1] != "nutanix"]


@pytest.mark.slow
@pytest.mark.parametrize(("os_name", "provider"), FULL_VALIDATE, ids=["-".join(p) for p in FULL_VALIDATE])
def test_pair_passes_packer_validate_and_fmt(os_name: str, provider: str, lint_results: dict) -> None:  # type: ignore[type-arg]
    r = lint_results[(os_name, provider)]
    assert not r.syntax_only
    assert r.validate_ok and r.fmt_ok, r.output


@pytest.mark.slow
def test_the_arm64_build_vm_is_an_emulated_virt_machine_under_aavmf(lint_results: dict) -> None:  # type: ignore[type-arg]
    """Issue 46: the Packer engine builds arm64 from an arm64 disk image in qemu-system-aarch64's ``virt`` machine,
    under TCG whatever this host's KVM (another architecture), with AAVMF and the CPU the boot test gives arm64
    guests, the cloud-init seed on a SCSI CD; and Packer validates and formats it as it does the amd64 pairs."""
    r = lint_results[("ubuntu", "baremetal", "arm64")]
    assert r.validate_ok and r.fmt_ok, r.output
    text = r.rendered.template.read_text()
    for line in ('qemu_binary     = "qemu-system-aarch64"', 'machine_type    = "virt"',
                 'cdrom_interface = "virtio-scsi"', 'accelerator      = "tcg"',
                 'qemuargs = [["-bios", "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"], ["-cpu", "max,pauth-impdef=on"]]',
                 'iso_url      = "https://images.example/arm64/base.qcow2"'):  # fmt: skip
        assert line in text, line
    amd64 = lint_results[("ubuntu", "baremetal")].rendered.template.read_text()
    assert "qemu_binary" not in amd64 and "-cpu" not in amd64 and "virtio-scsi" not in amd64


def test_an_arm64_build_vm_is_emulated_even_where_kvm_runs_amd64_guests(tmp_path: Path) -> None:
    (tmp_path / "arm64.qcow2").write_bytes(b"")  # rendering reads no byte of it (the build checks it first)
    config = {"source_image_url": str(tmp_path / "arm64.qcow2"), "source_image_checksum": "sha256:" + "1" * 64}
    plan = plan_for("ubuntu", "baremetal", tmp_path, config, arch="arm64", engine="packer")
    assert plan.engine == "packer"
    text = render(plan, tmp_path, kvm=KVM).template.read_text()
    assert 'accelerator      = "tcg"' in text and 'qemu_binary     = "qemu-system-aarch64"' in text


def test_an_arm64_build_vm_needs_its_emulator_before_anything_is_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imagebuilder.builder import packer as packer_module
    from imagebuilder.core.errors import ExternalError
    from imagebuilder.flows.build import dry_run_checks

    (tmp_path / "arm64.qcow2").write_bytes(b"")
    config = {"source_image_url": str(tmp_path / "arm64.qcow2"), "source_image_checksum": "sha256:" + "1" * 64}
    plan = plan_for("ubuntu", "baremetal", tmp_path, config, arch="arm64", engine="packer")
    real_which = packer_module.shutil.which
    monkeypatch.setattr(packer_module.shutil, "which", lambda name, path=None: None if "aarch64" in name
                        else real_which(name, path=path))  # fmt: skip
    for attempt in (lambda: render(plan, tmp_path), lambda: dry_run_checks([plan])):
        with pytest.raises(ExternalError, match="qemu-system-aarch64 is not installed: the arm64 build VM runs in it"):
            attempt()
    assert not (tmp_path / "build").exists(), "nothing rendered"


def test_nutanix_passes_validate_syntax_only_because_its_plugin_is_not_installable_here(
    lint_results: dict,  # type: ignore[type-arg]
) -> None:
    r = lint_results[("ubuntu", "nutanix")]
    assert r.syntax_only == (not PACKER.has_plugin_blocks)
    assert r.validate_ok and r.fmt_ok, r.output


def test_validate_catches_a_broken_template(tmp_path: Path) -> None:
    rendered = render_pair("ubuntu", "baremetal", tmp_path, PACKER)
    rendered.template.write_text(rendered.template.read_text().replace('format           = "raw"', 'format = "vhd"'))
    assert validate(rendered, PACKER).returncode != 0
    assert fmt_check(rendered.template, PACKER).returncode != 0


@pytest.mark.parametrize(("os_name", "provider"), list(PAIRS))
def test_no_secret_in_rendered_files_and_secrets_in_env(os_name: str, provider: str, tmp_path: Path) -> None:
    """Each secret of the pair's example config, given a value of its own (the examples' are all "change-me"), is in
    no rendered file; exactly those Packer needs are in its environment, and those only the steps after the build
    read (CloudStack's API keys, for the template's registration) are not."""
    from pydantic import SecretStr

    example = plan_for(os_name, provider, tmp_path)
    config = example.config
    fields = {}
    if config is not None:
        fields = json.loads((EXAMPLES / PAIRS[(os_name, provider)]).read_text())  # type: ignore[operator]
        for n, name in enumerate(type(config).model_fields):
            if isinstance(getattr(config, name), SecretStr):
                fields[name] = f"S{n}-{name}-Value/with+key@chars"
    plan = plan_for(os_name, provider, tmp_path, fields) if config is not None else example
    rendered = render(plan, tmp_path)
    secrets = {name: getattr(plan.config, name).get_secret_value() for name in type(plan.config).model_fields
               if isinstance(getattr(plan.config, name), SecretStr)} if plan.config else {}  # fmt: skip
    assert len(set(secrets.values())) == len(secrets), "each secret a value of its own"
    for path in (tmp_path / "build").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            for secret in secrets.values():
                assert secret not in text, f"{secret!r} leaked into {path}"
    after_the_build = {"cloudstack_api_key", "cloudstack_secret_key"}
    given = set(secrets.values()) & set(rendered.env.values())
    assert given == {v for k, v in secrets.items() if k not in after_the_build}, sorted(rendered.env)
    for name in rendered.env:
        assert name.startswith("PKR_VAR_")
        assert f'variable "{name.removeprefix("PKR_VAR_")}"' in rendered.template.read_text()
    assert "sensitive = true" in rendered.template.read_text() or not rendered.env


def test_packer_1_9_gets_required_plugins_and_stays_fmt_clean(tmp_path: Path) -> None:
    newer = PackerInfo(PACKER.path, (1, 9, 4))
    for os_name, provider in PAIRS:
        rendered = render(plan_for(os_name, provider, tmp_path), tmp_path / f"{os_name}-{provider}", newer)
        text = rendered.template.read_text()
        assert "required_plugins" in text and "github.com/hashicorp/ansible" in text
        assert fmt_check(rendered.template, PACKER).returncode == 0
    old = render(plan_for("ubuntu", "baremetal", tmp_path), tmp_path / "old", PACKER)
    assert ("required_plugins" in old.template.read_text()) == PACKER.has_plugin_blocks


def test_vsphere_flags_are_honoured(tmp_path: Path) -> None:
    config = json.loads((EXAMPLES / "vsphere-ubuntu.json").read_text()) | {
        "linked_clone": "true",
        "convert_to_template": "true",
        "create_snapshot": "false",
        "insecure_connection": "true",
        "datastore": "ds-${injected}",
    }
    rendered = render(plan_for("ubuntu", "vsphere", tmp_path, config), tmp_path)
    text = rendered.template.read_text()
    base, clone = text.split('source "vsphere-clone" "node"')
    assert "linked_clone = true" in clone
    assert "create_snapshot     = true" in base  # linked clones need a snapshot of the base
    assert "convert_to_template = true" in clone and "create_snapshot     = false" in clone
    assert text.count("insecure_connection = true") == 2
    assert '"ds-$${injected}"' in text  # HCL template openers are escaped, not evaluated
    assert rendered.stages == ("vsphere-iso.base", "vsphere-clone.node")
    assert validate(rendered, PACKER).returncode == 0


def test_ami_settings_reach_the_template(tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text("a: 1\n")
    role = tmp_path / "roles" / "harden"
    role.mkdir(parents=True)
    config = {
        "image_regions": ["us-west-2", "eu-west-1"],
        "cloud_region": "us-west-2",
        "config_mgmt_extra_vars": f"@{extra}",
        "custom_role": "true",
        "custom_role_name_list": [str(role)],
        "manifest_output": str(tmp_path / "out" / "manifest.json"),
        "volume_type": "io1",
        "volume_size": "40",
    }
    rendered = render(plan_for("ubuntu", "ami", tmp_path, config), tmp_path)
    text = rendered.template.read_text()
    assert 'ami_regions   = ["eu-west-1"]' in text
    assert f'"--extra-vars", "@{extra}"' in text
    assert f"ANSIBLE_ROLES_PATH={ROOT}/ansible/roles:{tmp_path}/roles" in text
    assert str(tmp_path / "out" / "manifest.json") in text
    assert "volume_size           = 40" in text and "throughput" not in text
    assert "iops                  = 2000" in text  # io1: 50 IOPS per GiB
    assert json.loads((tmp_path / "build" / "ansible-vars.json").read_text())["custom_roles"] == ["harden"]
    assert validate(rendered, PACKER).returncode == 0


def test_qemu_format_and_accelerator(tmp_path: Path) -> None:
    bm = render(plan_for("ubuntu", "baremetal", tmp_path), tmp_path / "bm", kvm=TCG).template.read_text()
    assert 'format           = "raw"' in bm and 'accelerator      = "tcg"' in bm
    cs = render(plan_for("redhat", "cloudstack", tmp_path), tmp_path / "cs", kvm=KVM).template.read_text()
    assert 'format           = "qcow2"' in cs and 'accelerator      = "kvm"' in cs
    assert "sha256:517abcc67ee3b7212f57e180f5d30be3e8269e7a99e127a3399b7935c7e00a09" in cs
    assert "inst.ks=http://{{ .HTTPIP }}:{{ .HTTPPort }}/ks.cfg" in cs


def test_install_seeds_authorise_only_the_build_key(tmp_path: Path) -> None:
    render(plan_for("ubuntu", "baremetal", tmp_path), tmp_path)
    key = (tmp_path / "build" / "ssh" / "id_ed25519.pub").read_text().strip()
    user_data = (tmp_path / "build" / "http" / "user-data").read_text()
    assert key in user_data and "lock_passwd: true" in user_data and "allow-pw: false" in user_data
    render(plan_for("redhat", "baremetal", tmp_path), tmp_path / "rh")
    ks = (tmp_path / "rh" / "build" / "http" / "ks.cfg").read_text()
    assert (
        "rootpw --lock" in ks
        and f'sshkey --username=builder "{(tmp_path / "rh" / "build" / "ssh" / "id_ed25519.pub").read_text().strip()}"'
        in ks
    )
    assert (tmp_path / "build" / "ssh" / "id_ed25519").stat().st_mode & 0o077 == 0


def test_ansible_vars_from_a_resolved_plan(tmp_path: Path, mirror_dir: Path) -> None:
    plan = plan_for("ubuntu", "baremetal", tmp_path, mirror=str(mirror_dir))
    render_build(plan, tmp_path / "b", PACKER, kvm=KVM)
    data = json.loads((tmp_path / "b" / "ansible-vars.json").read_text())
    assert [b["name"] for b in data["kubernetes_binaries"]] == ["kubelet", "kubeadm", "kubectl"]
    assert all(len(b["sha256"]) == 64 and b["src"].startswith(str(mirror_dir)) for b in data["kubernetes_binaries"])
    # the distro's manifest names no runtime: the line's, from its projects' releases (runc for the containerd role)
    assert [a["name"] for a in data["kubernetes_archives"]] == ["cni-plugins", "etcd", "containerd", "crictl"]
    assert data["kubernetes_runtime_binaries"] == ["runc"]
    apiserver = next(i for i in data["kubernetes_images"] if i["name"] == "kube-apiserver")
    assert apiserver["archive"]["src"].endswith("/bin/linux/amd64/kube-apiserver.tar")
    assert data["kubernetes_version"] == "v1.24.17" and data["redhat_subscription"] is False


def test_a_real_build_needs_the_artifacts(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="release manifest is not resolved"):
        render_build(plan_for("ubuntu", "baremetal", tmp_path), tmp_path / "b", PACKER, kvm=KVM)


@pytest.mark.parametrize("volume_type", ["standard", "gp2", "gp3", "io1", "io2", "sc1", "st1"])
def test_every_ebs_volume_type_validates(volume_type: str, tmp_path: Path) -> None:
    size = "500" if volume_type in ("sc1", "st1") else "25"
    rendered = render(plan_for("ubuntu", "ami", tmp_path, {"volume_type": volume_type, "volume_size": size}), tmp_path)
    result = validate(rendered, PACKER)
    assert result.returncode == 0, result.stdout


def test_hcl_literals() -> None:
    assert hcl('a${b}%{c}"') == '"a$${b}%%{c}\\""'
    assert hcl(["x", 1, True]) == '["x", 1, true]'


@pytest.mark.slow
def test_the_playbook_parses() -> None:
    """ansible-playbook's own syntax check (ansible-lint's is tests/integration/test_static_checks.py's)."""
    syntax = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,", "ansible/node.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr


@pytest.mark.parametrize(("os_name", "provider"), list(PAIRS))
def test_build_customize_adds_the_role_and_keeps_its_secrets_in_the_environment(
    os_name: str, provider: str, tmp_path: Path
) -> None:
    from imagebuilder.customization.model import REGISTRY_AUTH_ENV, load_customization
    from tests.support.pki import make_ca

    make_ca(tmp_path / "ca.pem")
    spec = tmp_path / "customize.yaml"
    spec.write_text("ca_certificates: [ca.pem]\nregistries: {'reg.local:5000': {username: u, password: pw-MARK-31}}\n")
    customization = load_customization(spec)
    plan = plan_for(os_name, provider, tmp_path)
    rendered = render_build(
        plan, tmp_path / "build", PACKER, kvm=KVM, require_artifacts=False, customization=customization
    )
    role_vars = json.loads((tmp_path / "build" / "ansible-vars.json").read_text())
    assert role_vars["custom_roles"] == ["customize"]
    assert role_vars["customize_registries"] == ["reg.local:5000"]
    assert "BEGIN CERTIFICATE" in role_vars["customize_ca_certificates"][0]["pem"]
    for path in (tmp_path / "build").rglob("*"):
        if path.is_file():
            assert "pw-MARK-31" not in path.read_text(errors="replace"), path
    assert "pw-MARK-31" in json.loads(rendered.env[REGISTRY_AUTH_ENV])[0]["password"]
    assert validate(rendered, PACKER).returncode == 0
