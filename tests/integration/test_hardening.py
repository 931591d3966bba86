"""Issue 62 for real: ComplianceAsCode's content built from its source release (the Go module proxy, CMake), the
demo's image hardened by its CIS Level 1 remediation in the chroot engine, scanned by OpenSCAP (oscap-chroot, the
image mounted read-only) and proven by two nodes: ``demo --hardening cis_level1_server --no-boot`` builds Kubernetes
v1.36.3 from source (the cache's) and hardens the image, and ``image.verify --node-check --join`` is the demo's
node check (kubeadm init on the image's own control plane, two copies of the image joined to it as nodes, both
Ready, kube-proxy and CoreDNS, the test pod Running on the second).

The remediation installs the packages the profile asks for (aide, apparmor-utils, rsyslog...) from the image's own
package sources, as a build on a connected site does: this test reaches Debian's archive, as image.base's does.
Beside it: the build host's kernel settings and firewall are what they were (the remediation acts on the image
only), the evidence and the records are complete, and image.verify --hardening judges any image the same way (the
plain base image: under the threshold, failing rules named)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.core.files import sha256_file
from tests.support.attest import check_provenance, check_sbom
from tests.support.common import BIN, ROOT, vm_turn

pytestmark = [pytest.mark.root, pytest.mark.qemu, pytest.mark.slow]

#: the host settings a hardening remediation would change on a running system, read before and after the build
HOST_SETTINGS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/send_redirects", "net/ipv4/conf/all/accept_redirects",
                 "net/ipv4/conf/all/log_martians", "net/ipv6/conf/all/accept_ra", "kernel/randomize_va_space",
                 "kernel/yama/ptrace_scope", "fs/suid_dumpable", "net/ipv4/tcp_syncookies")  # fmt: skip


def host_state() -> dict[str, str]:
    state = {k: (Path("/proc/sys") / k).read_text().strip() for k in HOST_SETTINGS if (Path("/proc/sys") / k).exists()}
    nft = shutil.which("nft")
    if nft:
        state["nft"] = subprocess.run([nft, "list", "ruleset"], capture_output=True, text=True, check=False).stdout
    modules = Path("/proc/modules")  # absent on a kernel without loadable modules
    if modules.exists():
        state["modules"] = " ".join(sorted(line.split()[0] for line in modules.read_text().splitlines()))
    return state


def test_the_content_builds_from_its_source_release() -> None:
    """The debian12 data stream, as the Go module proxy serves ComplianceAsCode v0.1.82 (the cache's once built):
    OpenSCAP reads it and it offers the CIS profiles."""
    from imagebuilder.hardening.content import built_content, profiles
    from tests.support.sources import HARDENING_PRODUCT

    content = built_content(HARDENING_PRODUCT)
    assert content.version == "v0.1.82" and content.datastream.name == "ssg-debian12-ds.xml"
    assert sha256_file(content.datastream) == content.sha256
    offered = profiles(content)
    assert {"cis_level1_server", "cis_level2_server"} <= set(offered), offered
    again = built_content(HARDENING_PRODUCT)
    assert again.sha256 == content.sha256, "a second call takes the cache's"


def test_mirror_create_carries_the_content_for_an_air_gapped_build(tmp_path: Path) -> None:
    """mirror.create --hardening-product puts the data stream in the mirror; a dry run with --mirror takes it from
    there, and names it."""
    from imagebuilder.hardening.content import built_content
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    upstream, mirror = tmp_path / "upstream", tmp_path / "mirror"
    make_standin_release(upstream, load_catalog().channel("1-24"))
    res = subprocess.run([str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24", "--dest",
                          str(mirror), "--source", str(upstream), "--runtime", "os", "--hardening-product", "debian12"],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    carried = mirror / "hardening-content" / "ssg-debian12-ds.xml"
    assert sha256_file(carried) == built_content("debian12").sha256 and str(carried) in res.stdout


@pytest.mark.timeout(5400)
def test_demo_hardening_builds_scans_and_proves_a_hardened_node(
    base_image: tuple[Path, str], source_release: object, tmp_path: Path
) -> None:
    image, digest = base_image
    dest = tmp_path / "demo"
    (dest / "base").mkdir(parents=True)
    # the suite's base image as the demo's own (it reuses one whose checksum file matches)
    shutil.copyfile(image, dest / "base" / "debian-base.qcow2")
    (dest / "base" / "debian-base.qcow2.sha256").write_text(f"{digest}  debian-base.qcow2\n")
    key = tmp_path / "build.pem"
    from imagebuilder.attest.keys import generate, public_path

    generate(key, "ecdsa")
    before = host_state()
    dry = subprocess.run([str(BIN / "image-builder"), "demo", "--hardening", "cis_level1_server", "--dest",
                          str(dest), "--dry-run"], cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert dry.returncode == 0 and "--engine auto --hardening cis_level1_server" in dry.stdout, dry.stdout
    # build --dry-run reads the source image's os-release and finds the profile in the content, in seconds
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    plan = subprocess.run([str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor", "baremetal",
                           "--release-channel", "1-36", "--offline", "--baremetal-config", str(config), "--engine",
                           "chroot", "--hardening", "cis_level2_server", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=600)  # fmt: skip
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "hardening: cis_level2_server (CIS Debian Benchmark for Level 2 - Server)" in plan.stdout, plan.stdout
    assert "for debian12 (the image's os-release)" in plan.stdout
    packer = subprocess.run([str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor", "baremetal",
                             "--release-channel", "1-36", "--offline", "--baremetal-config", str(config), "--engine",
                             "packer", "--hardening", "cis_level1_server", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    # Packer's engine hardens too: its Ansible runs the remediation in the build VM, and the scan reads its disk
    assert packer.returncode == 0, packer.stdout + packer.stderr
    assert "remediation, tailored for a Kubernetes node, by Packer's Ansible, in the build VM" in packer.stdout
    # the demo's flow, hardened; its image checked offline (testinfra), then proven by the demo's two nodes below
    proc = subprocess.run([str(BIN / "image-builder"), "demo", "--hardening", "cis_level1_server", "--dest",
                           str(dest), "--signing-key", str(key), "--no-boot"], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=5000)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert host_state() == before, "the remediation changed the build host"
    out = dest / "output"
    (gz,) = out.glob("*.gz")
    with vm_turn():
        verify = [str(BIN / "image-builder"), "image.verify", "--image", str(gz), "--node-check", "--join"]
        node = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, check=False, timeout=5000)
    assert node.returncode == 0, node.stdout[-4000:] + node.stderr[-3000:]
    assert "[ok  ] node Ready" in node.stdout and "[ok  ] test pod Running" in node.stdout, node.stdout[-3000:]
    assert "[ok  ] second node: node Ready" in node.stdout, node.stdout[-3000:]
    (manifest_path,) = out.glob("*.build-manifest.json")
    manifest = json.loads(manifest_path.read_text())
    stem = manifest_path.name.removesuffix(".build-manifest.json")
    assert gz.name == f"{stem}.gz"
    hardening = manifest["hardening"]
    scan = hardening["scan"]
    assert manifest["reproducible"] is False, "its packages and AIDE database are the day's: not claimed"
    # the verdict: at or above the threshold, and the counts add up from the ARF results
    assert scan["pass_rate"] >= 90.0 and scan["applicable"] > 250, scan
    assert f"hardening:  cis_level1_server: {scan['pass_rate']}%" in proc.stdout
    summary = json.loads((out / f"{stem}.hardening.json").read_text())
    assert summary == scan
    arf = (out / f"{stem}.hardening-arf.xml").read_text()
    report = (out / f"{stem}.hardening-report.html").read_text()
    assert "xccdf_org.ssgproject.content_profile_cis_level1_server_kubernetes_node" in arf and "<html" in report
    # the tailoring: the rules a node keeps are off, each with its reason, in the file the scan and remediation read
    tailoring = out / f"{stem}.hardening-tailoring.xml"
    assert hardening["tailoring"]["sha256"] == sha256_file(tailoring)
    off = hardening["tailoring"]["turned_off"]
    assert {"sysctl_net_ipv4_ip_forward", "kernel_module_overlayfs_disabled"} <= set(off)
    assert "kubeadm's preflight" in tailoring.read_text()
    assert 'idref="xccdf_org.ssgproject.content_rule_sysctl_net_ipv4_ip_forward"' in arf
    assert hardening["content"]["origin"] == "github.com/ComplianceAsCode/content v0.1.82 (built from source)"
    assert hardening["remediation"]["tasks"] > 500 and hardening["remediation"]["left_out"]
    # provenance and SBOM name the content and the tailoring by digest
    statement = check_provenance(out / f"{stem}.intoto.json", public_path(key), gz)
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["hardening-content:ssg-debian12-ds.xml"]["digest"]["sha256"] == hardening["content"]["sha256"]
    assert deps["hardening-tailoring:" + tailoring.name]["digest"]["sha256"] == sha256_file(tailoring)
    params = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert params["hardening"]["profile"] == "cis_level1_server"
    sbom = check_sbom(out / f"{stem}.spdx.json", gz)
    names = {p["name"] for p in sbom["packages"]}
    assert {"aide", "apparmor-utils"} <= names, "what the remediation installed is in the SBOM (listed after it)"
    assert "hardening-content:ssg-debian12-ds.xml" in names
    # the image: hardened, and still what a node needs
    with raw_view(gz, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
        assert "net.ipv4.ip_forward = 1" in (root / "etc/sysctl.d/99-kubernetes.conf").read_text()
        assert "overlay" in (root / "etc/modules-load.d/k8s.conf").read_text()
        modprobe = " ".join(p.read_text() for p in (root / "etc/modprobe.d").glob("*.conf"))
        assert "install overlay /bin/false" not in modprobe and "install cramfs /bin/false" in modprobe
        assert (root / "var/lib/aide").is_dir() and (root / "etc/security/pwquality.conf").is_file()
    # image.verify --hardening: the hardened image at a threshold it does not reach fails naming its failing rules
    strict = subprocess.run([str(BIN / "image-builder"), "image.verify", "--image", str(gz), "--hardening",
                             "cis_level1_server", "--hardening-min-pass", "100"], cwd=ROOT, capture_output=True,
                            text=True, check=False, timeout=1800)  # fmt: skip
    assert strict.returncode == 1 and f"{scan['pass_rate']}% of the applicable rules" in strict.stdout, strict.stdout
    assert "under the 100% asked for; failing: " in strict.stderr and scan["failing"][0] in strict.stderr


def test_image_verify_scans_an_image_that_is_not_ours(base_image: tuple[Path, str], tmp_path: Path) -> None:
    """The plain base image (debootstrap's Debian 12): scanned the same way, under the threshold, the failing rules
    named, the evidence beside it; a profile the content lacks is refused with the ones it has (exit 2)."""
    image = tmp_path / "debian-base.qcow2"
    shutil.copyfile(base_image[0], image)
    res = subprocess.run([str(BIN / "image-builder"), "image.verify", "--image", str(image), "--hardening",
                          "cis_level1_server"], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=1800)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[FAIL] hardening" in res.stdout and "under the 90% asked for; failing: " in res.stderr
    summary = json.loads((tmp_path / "debian-base.hardening.json").read_text())
    assert summary["pass_rate"] < 90 and summary["failing"] and (tmp_path / "debian-base.hardening-arf.xml").is_file()
    wrong = subprocess.run([str(BIN / "image-builder"), "image.verify", "--image", str(image), "--hardening",
                            "cis_level1_servr"], cwd=ROOT, capture_output=True, text=True, check=False,
                           timeout=600)  # fmt: skip
    assert wrong.returncode == 2 and "did you mean 'cis_level1_server'" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr + res.stderr


def test_the_remediation_sees_the_kernel_s_settings_read_only(tmp_path: Path) -> None:
    """The second guard (imagebuilder/hardening/apply.py): in the remediation's mount namespace the image's
    /proc/sys and /sys are read-only, so a task that still writes a kernel setting fails instead of changing the
    build host's. The write tried here is the setting's own current value (harmless had the guard failed)."""
    import sys

    root = tmp_path / "root"
    for part in ("proc", "sys"):
        (root / part).mkdir(parents=True)
    setting = "kernel/randomize_va_space"
    current = (Path("/proc/sys") / setting).read_text().strip()
    target = root / "proc" / "sys" / setting
    attempt = f"{{ echo {current} > {target}; }} 2> {tmp_path / 'err'}; echo $? > {tmp_path / 'rc'}"
    script = (f"mount -t proc proc {root}/proc && mount -t sysfs sysfs {root}/sys && exec {sys.executable} -m"
              f" imagebuilder.hardening.apply {root} -- sh -c '{attempt}'")  # fmt: skip
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "rc").read_text().strip() != "0", "the write went through"
    assert "Read-only file system" in (tmp_path / "err").read_text()
    assert (Path("/proc/sys") / setting).read_text().strip() == current
    assert not any(str(root) in line for line in Path("/proc/self/mounts").read_text().splitlines()), "left mounted"


def test_packer_s_engine_renders_the_remediation_between_the_node_s_halves_and_packer_validates_it(
    base_image: tuple[Path, str], tmp_path: Path
) -> None:
    """A hardened Packer build's part before its VM starts, for real: the product read from the source image, the
    content's remediation for Packer's Ansible (its play made to become root, its sshd -t key in /run), the playbook
    of the node's halves around it, which Ansible parses whole (--syntax-check follows each import), and the
    template that runs it, which Debian's Packer validates."""
    import yaml

    from imagebuilder.builder.packer import render_build, validate
    from imagebuilder.builder.packer_plugins import PackerInfo
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.core.hostinfo import KvmStatus
    from imagebuilder.hardening.model import HardeningRequest
    from imagebuilder.hardening.remediate import SSHD_TEST_KEY
    from imagebuilder.hardening.run import Hardening
    from imagebuilder.plan.model import BuildRequest

    image, digest = base_image
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    request = HardeningRequest("cis_level1_server")
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-36", offline=True,
                                  configs={"baremetal": str(config)}, engine="packer", hardening=request))  # fmt: skip
    hardening = Hardening(request, tmp_path / "out" / plan.output_stem)
    playbook = hardening.prepare_packer(image, plan.os, plan.os_version.version, tmp_path / "work")
    assert hardening.content is not None and hardening.content.product == "debian12", "the image's, not --os"
    assert hardening.remediation is not None and hardening.remediation.tasks > 150
    plays = yaml.safe_load(hardening.remediation.path.read_text())
    assert all(p["become"] is True and p["hosts"] == "all" for p in plays)
    assert SSHD_TEST_KEY.startswith("/run/") and SSHD_TEST_KEY in hardening.remediation.path.read_text()
    syntax = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                             str(playbook)], capture_output=True, text=True, check=False, timeout=300,
                            env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")})  # fmt: skip
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    packer = PackerInfo.detect()
    rendered = render_build(plan, tmp_path / "render", packer, kvm=KvmStatus(False, "not probed: rendered only"),
                            require_artifacts=False, source_image=image, playbook=playbook)  # fmt: skip
    assert f"playbook_file = {json.dumps(str(playbook))}" in rendered.template.read_text()
    checked = validate(rendered, packer)
    assert checked.returncode == 0, checked.stdout + checked.stderr
