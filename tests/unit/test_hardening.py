"""Issue 62's pure parts: the settings, the request's checks, the product of an os-release, the remediation made
safe for an image, the tailoring document, the ARF reader and the verdict. The real content, remediation and scan
run in tests/integration/test_hardening.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.hardening.content import Content, find_content
from imagebuilder.hardening.model import NAME, RULE_PREFIX, HardeningRequest, load_settings, product_of
from imagebuilder.hardening.remediate import HOST_PROGRAMS, for_an_image
from imagebuilder.hardening.run import verdict
from imagebuilder.hardening.scan import ScanResult, read_results
from imagebuilder.hardening.tailoring import XCCDF, content_rules, tailoring_document

RULES = sorted(load_settings().reasons())


def test_every_rule_a_node_keeps_has_a_name_and_a_reason() -> None:
    reasons = load_settings().reasons()
    assert "sysctl_net_ipv4_ip_forward" in reasons and "kernel_module_overlayfs_disabled" in reasons
    assert all(NAME.fullmatch(r) and len(why) > 40 and "\n" not in why for r, why in reasons.items())


@pytest.mark.parametrize(("profile", "rate"), [("../etc/passwd", 90.0), ("CIS", 90.0), ("", 90.0),
                                               ("cis_level1_server", 100.5), ("cis_level1_server", -1.0)])  # fmt: skip
def test_a_bad_profile_or_rate_is_refused_naming_its_flag(profile: str, rate: float) -> None:
    with pytest.raises(InputError) as caught:
        HardeningRequest(profile, min_pass=rate)
    assert caught.value.field in ("--hardening", "--hardening-min-pass")


@pytest.mark.parametrize(("release", "product"), [
    ({"ID": "debian", "VERSION_ID": "12"}, "debian12"), ({"ID": "ubuntu", "VERSION_ID": "22.04"}, "ubuntu2204"),
    ({"ID": "rhel", "VERSION_ID": "9.4"}, "rhel9"), ({"ID": "rocky", "VERSION_ID": "8.10"}, "rhel8"),
])  # fmt: skip
def test_the_product_is_the_os_release_s(release: dict[str, str], product: str) -> None:
    assert product_of(release, "image") == product


@pytest.mark.parametrize("release", [{}, {"ID": "bottlerocket", "VERSION_ID": "1.10"},
                                     {"ID": "debian", "VERSION_ID": "12; rm -rf /"}])  # fmt: skip
def test_an_os_without_a_product_is_refused(release: dict[str, str]) -> None:
    with pytest.raises(InputError, match="no ComplianceAsCode product"):
        product_of(release, "image")


def test_a_folder_without_the_product_s_data_stream_names_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "ssg-debian11-ds.xml").write_text("<x/>")
    with pytest.raises(InputError) as caught:
        find_content(tmp_path, "debian12")
    assert caught.value.field == "--hardening-content" and "debian11" in str(caught.value)


def plays(*tasks: dict[str, Any]) -> list[Any]:
    return [{"hosts": "all", "tasks": list(tasks)}]


def test_the_remediation_writes_files_and_never_acts_on_the_running_system() -> None:
    safe, dropped = for_an_image(plays(
        {"name": "sysctl", "ansible.posix.sysctl": {"name": "kernel.x", "value": "1", "reload": True}},
        {"name": "start", "ansible.builtin.systemd": {"name": "aide.timer", "enabled": True, "state": "started",
                                                      "daemon_reload": True}},
        {"name": "reload only", "ansible.builtin.systemd": {"daemon_reload": True}},
        {"name": "restart", "ansible.builtin.service": {"name": "rsyslog", "state": "restarted"}},
        {"name": "mount", "ansible.posix.mount": {"path": "/dev/shm", "state": "mounted", "opts": "nodev"}},
        {"name": "block", "block": [
            {"name": "nft", "ansible.builtin.command": "nft add table inet filter"},
            {"name": "piped", "ansible.builtin.shell": {"cmd": "find /etc | xargs sysctl -p"}},
            {"name": "systemctl start", "ansible.builtin.shell": "systemctl --now start chronyd"},
            {"name": "systemctl enable", "ansible.builtin.command": "systemctl enable chronyd"},
            {"name": "grep for nft", "ansible.builtin.shell": "grep -q nft /etc/nftables.conf"},
            {"name": "by path", "ansible.builtin.command": {"argv": ["/usr/sbin/modprobe", "-r", "usb-storage"]}},
        ]},
    ))  # fmt: skip
    tasks = safe[0]["tasks"]
    by_name = {t["name"]: t for t in tasks}
    assert by_name["sysctl"]["ansible.posix.sysctl"]["reload"] is False
    assert by_name["start"]["ansible.builtin.shell"]["cmd"].splitlines()[1:] == [
        "unit=aide.timer",
        'systemctl enable "$unit"',
    ], "enabled offline, by systemctl: never started"
    assert by_name["mount"]["ansible.posix.mount"]["state"] == "present"
    kept = {t["name"] for t in by_name["block"]["block"]}
    assert kept == {"systemctl enable", "grep for nft"}
    gone = {d.split(":")[0] for d in dropped}
    assert gone == {"reload only", "restart", "nft", "piped", "systemctl start", "by path"}


@pytest.mark.parametrize(("module", "lines"), [
    ({"name": "named.service", "enabled": False, "masked": True},
     ["unit=named.service",
      'if systemctl -q list-unit-files "$unit" >/dev/null 2>&1; then systemctl disable "$unit"; fi',
      'systemctl mask "$unit"']),
    ({"name": "{{ item }}", "enabled": "yes"}, ["unit={{ (item) | quote }}", 'systemctl enable "$unit"']),
    ({"name": "x; reboot", "enabled": True}, None),
    ({"name": "{{ lookup('pipe', 'id') }}", "masked": True}, None),
])  # fmt: skip
def test_a_service_task_becomes_systemctl_s_offline_verbs(module: dict[str, Any], lines: list[str] | None) -> None:
    safe, dropped = for_an_image(plays({"name": "svc", "ansible.builtin.systemd": module, "when": "x"}))
    if lines is None:
        assert safe[0]["tasks"] == [] and dropped, "a name that is no unit is not put in a shell"
        return
    (task,) = safe[0]["tasks"]
    assert task["ansible.builtin.shell"]["cmd"].splitlines() == ["set -e", *lines] and task["when"] == "x"


@settings(max_examples=200, deadline=None)
@given(program=st.sampled_from(sorted(HOST_PROGRAMS)),
       before=st.sampled_from(["", "sudo ", "env A=1 ", "true && ", "x=$(", "cat f | ", "false || ", "/usr/sbin/"]),
       args=st.text(alphabet="abc -=/._", max_size=20))  # fmt: skip
def test_any_command_that_runs_a_host_program_is_left_out(program: str, before: str, args: str) -> None:
    safe, dropped = for_an_image(plays({"name": "t", "ansible.builtin.shell": f"{before}{program} {args}"}))
    assert safe[0]["tasks"] == [] and len(dropped) == 1, (before, program, args)


def content_with(tmp_path: Path, rules: list[str]) -> Content:
    ds = tmp_path / "ssg-debian12-ds.xml"
    body = "".join(f'<xccdf-1.2:Rule id="{RULE_PREFIX}{r}" selected="false"/>' for r in rules)
    ds.write_text(f'<ds:data-stream-collection xmlns:ds="x">{body}</ds:data-stream-collection>')
    return Content("debian12", ds, "0" * 64, "test", "0.1.82")


def test_the_tailoring_turns_off_only_the_rules_the_content_has_each_with_its_reason(tmp_path: Path) -> None:
    content = content_with(tmp_path, ["sysctl_net_ipv4_ip_forward", "package_aide_installed"])
    assert content_rules(content) == {"sysctl_net_ipv4_ip_forward", "package_aide_installed"}
    request = HardeningRequest("cis_level1_server")
    document = tailoring_document(request, content)
    assert document == tailoring_document(request, content), "the same bytes each time (its digest is recorded)"
    root = ET.fromstring(document)
    (profile,) = root.iter(f"{{{XCCDF}}}Profile")
    assert profile.get("id") == request.tailored_id and profile.get("extends") == request.profile_id
    selects = {s.get("idref"): s for s in profile.iter(f"{{{XCCDF}}}select")}
    assert set(selects) == {RULE_PREFIX + "sysctl_net_ipv4_ip_forward"}
    (remark,) = selects[RULE_PREFIX + "sysctl_net_ipv4_ip_forward"]
    assert remark.text == load_settings().reasons()["sysctl_net_ipv4_ip_forward"]


ARF = """<?xml version="1.0"?>
<arf:asset-report-collection xmlns:arf="urn:oasis:names:tc:dfi:arf:1.0" xmlns:x="http://checklists.nist.gov/xccdf/1.2">
{results}
</arf:asset-report-collection>"""


def arf(tmp_path: Path, results: dict[str, str]) -> Path:
    path = tmp_path / "arf.xml"
    rows = "".join(f'<x:rule-result idref="{RULE_PREFIX}{rule}"><x:result>{result}</x:result></x:rule-result>'
                   for rule, result in results.items())  # fmt: skip
    path.write_text(ARF.format(results=rows))
    return path


def test_the_pass_rate_is_over_the_applicable_rules_and_a_low_one_names_the_failing(tmp_path: Path) -> None:
    results = {f"r{i}": "pass" for i in range(8)} | {"bad_one": "fail", "odd": "unknown", "n": "notapplicable",
                                                      "m": "notchecked", "s": "notselected"}  # fmt: skip
    counts, failing, undecided = read_results(arf(tmp_path, results))
    scan = ScanResult("p", counts, failing, None, undecided)
    assert (scan.passed, scan.applicable, scan.pass_rate) == (8, 9, 88.9) and failing == ("bad_one",)
    assert undecided == ("odd",) and "1 undecided offline" in scan.describe()
    verdict(scan, 88.9)
    with pytest.raises(ExternalError) as caught:
        verdict(scan, 90.0)
    assert "88.9% of the applicable rules, under the 90% asked for; failing: bad_one" in str(caught.value)


def test_an_entity_bomb_in_the_results_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "arf.xml"
    path.write_text('<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>'
                    "<r>&b;</r>")  # fmt: skip
    with pytest.raises(ExternalError, match="cannot be read"):
        read_results(path)


def test_package_facts_are_gathered_again_only_after_a_package_task() -> None:
    from imagebuilder.hardening.remediate import fewer_package_facts

    gather = {"name": "Gather the package facts", "package_facts": {"manager": "auto"}}
    tasks = [gather, {"name": "a", "ansible.builtin.lineinfile": {}}, dict(gather),
             {"name": "install", "ansible.builtin.package": {"name": "aide"}}, dict(gather), dict(gather),
             {"name": "blk", "block": [{"name": "dpkg", "ansible.builtin.shell": "dpkg -i x.deb"}]}, dict(gather),
             {**gather, "when": "x"}]  # fmt: skip
    kept, dropped = fewer_package_facts(tasks)
    assert [t["name"] for t in kept] == [
        "Gather the package facts",
        "a",
        "install",
        "Gather the package facts",
        "blk",
        "Gather the package facts",
        "Gather the package facts",
    ]
    assert dropped == 2 and "when" in kept[-1], "a conditional gathering is kept: the previous one may not run"


def test_the_emitted_pipeline_s_jobs_harden_as_the_matrix_was_asked(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from imagebuilder.builder.ci_emit import _flags
    from imagebuilder.plan.model import BuildRequest

    request = BuildRequest(os=None, hypervisor=None, release_channel=None,
                           hardening=HardeningRequest("cis_level2_server", tmp_path, 87.5))  # fmt: skip
    plan = SimpleNamespace(firmware="bios", engine="chroot")
    out = _flags(plan, request, None)  # type: ignore[arg-type]
    assert out[out.index("--hardening") + 1] == "cis_level2_server"
    assert out[out.index("--hardening-content") + 1] == str(tmp_path)
    assert out[out.index("--hardening-min-pass") + 1] == "87.5"
    assert "--hardening" not in _flags(plan, BuildRequest(None, None, None), None)  # type: ignore[arg-type]


def test_a_mirror_carries_the_data_streams_and_a_build_takes_them_from_it(tmp_path: Path) -> None:
    from imagebuilder.core.fetch import Mirror
    from imagebuilder.hardening.content import MIRROR_FOLDER, content_for, copy_to_mirror

    site = tmp_path / "site"
    site.mkdir()
    content_with(site, ["sysctl_net_ipv4_ip_forward"])
    mirror = tmp_path / "mirror"
    (carried,) = copy_to_mirror(mirror, ["debian12"], site)
    copy = mirror / MIRROR_FOLDER / "ssg-debian12-ds.xml"
    assert copy.read_bytes() == (site / "ssg-debian12-ds.xml").read_bytes()
    before = copy.stat().st_mtime_ns
    copy_to_mirror(mirror, ["debian12"], site)
    assert copy.stat().st_mtime_ns == before, "a copy with the same bytes is kept (a rerun converges)"
    used = content_for("debian12", None, mirror=Mirror(str(mirror)))
    assert used.datastream == copy and used.origin == f"mirror {mirror}" and used.sha256 == carried.sha256
    assert content_for("debian12", site, mirror=Mirror(str(mirror))).datastream.parent == site, (
        "the user's folder comes first"
    )


def test_a_selected_kernel_module_rule_without_a_task_gets_its_file() -> None:
    from imagebuilder.hardening.remediate import supplement

    tasks = [{"name": "the content's own", "ansible.builtin.lineinfile": {}, "tags": ["kernel_module_dccp_disabled"]}]
    rules = {"kernel_module_cramfs_disabled", "kernel_module_dccp_disabled", "package_aide_installed",
             "kernel_module_x;rm_disabled"}  # fmt: skip
    (added,) = supplement(rules, tasks)
    assert added["ansible.builtin.copy"] == {
        "dest": "/etc/modprobe.d/cramfs.conf",
        "mode": "0644",
        "content": "install cramfs /bin/false\nblacklist cramfs\n",
    }
    assert added["tags"] == ["kernel_module_cramfs_disabled"]


@settings(max_examples=150, deadline=None)
@given(reason=st.text(min_size=1, max_size=200).filter(lambda t: all(c in "\t\n\r" or " " <= c < "\ud800"
                                                                      or "\ue000" <= c < "\ufffe" for c in t)),
       rule=st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,30}", fullmatch=True))  # fmt: skip
def test_any_reason_and_rule_round_trip_through_the_tailoring_file(tmp_path_factory: pytest.TempPathFactory,
                                                                   reason: str, rule: str) -> None:  # fmt: skip
    """A reason is the file's text, escaped by the XML writer whatever it holds (<, &, quotes, ]]>): the document
    parses, and the remark reads back as written."""
    content = content_with(tmp_path_factory.mktemp("ds"), [rule])
    document = tailoring_document(HardeningRequest("cis_level1_server"), content, {rule}, {rule: reason})
    (select,) = ET.fromstring(document).iter(f"{{{XCCDF}}}select")
    assert select.get("idref") == RULE_PREFIX + rule
    assert (select[0].text or "").replace("\r\n", "\n").replace("\r", "\n") == reason.replace("\r\n", "\n").replace(
        "\r", "\n"
    )


def test_packer_s_engine_hardens_where_its_disk_comes_here_and_refuses_the_platforms_that_keep_it(
    tmp_path: Path,
) -> None:
    """Where a Packer build leaves its finished disk on this host (QEMU's output, vSphere's export), it is hardened
    and scanned; an AMI's or a Nutanix image's stays on its platform, so --hardening is refused there, naming the
    providers it works for."""
    from imagebuilder.providers.registry import PROVIDERS
    from tests.support.inproc import cli

    here = {name for name, p in PROVIDERS.items() if p.disk_comes_here(None)}
    assert here == {"vsphere", "baremetal", "cloudstack"}
    fields = {"nutanix": {"source_image_name": "ubuntu-22.04", "hci_cluster_name": "c", "hci_subnet_name": "s",
                          "hci_endpoint": "prism.example", "hci_username": "admin", "hci_password": "pw"}}  # fmt: skip
    for provider in sorted(set(PROVIDERS) - here):
        config = tmp_path / f"{provider}.json"
        config.write_text(json.dumps(fields.get(provider, {})))
        res = cli("build", "--os", "ubuntu", "--hypervisor", provider, "--release-channel", "1-36", "--dry-run",
                  "--offline", f"--{provider}-config", str(config), "--hardening", "cis_level1_server")  # fmt: skip
        assert res.code == 2 and "Traceback" not in res.text, res.text
        assert f"a {provider} build leaves its disk on the platform" in res.err, res.err
        assert "--hardening" in res.err and all(name in res.err for name in here), res.err


@pytest.mark.parametrize(("os_name", "version", "product"),
                         [("ubuntu", "22.04", "ubuntu2204"), ("ubuntu", "24.04", "ubuntu2404"),
                          ("redhat", "9", "rhel9"), ("redhat", "8.10", "rhel8")])  # fmt: skip
def test_an_iso_install_s_product_is_the_catalog_s_os(os_name: str, version: str, product: str) -> None:
    from imagebuilder.hardening.model import installed_os_release

    assert product_of(installed_os_release(os_name, version), os_name) == product


def test_packer_s_playbook_runs_the_remediation_between_the_node_s_provisioning_and_its_seal(tmp_path: Path) -> None:
    """The playbook a hardened Packer build runs: the node's two halves around the remediation, in that order, each
    by its absolute path (a path with quotes or colons stays one YAML string)."""
    import yaml

    from imagebuilder.core.render import ROOT
    from imagebuilder.hardening.remediate import node_playbook

    odd = tmp_path / "a: 'b\" #c" / "hardening-cis_level1_server.yml"
    odd.parent.mkdir()
    plays = yaml.safe_load(node_playbook(tmp_path / "node-hardened.yml", odd).read_text())
    imports = [p["ansible.builtin.import_playbook"] for p in plays]
    assert imports == [str(ROOT / "ansible" / "node-provision.yml"), str(odd),
                       str(ROOT / "ansible" / "node-finish.yml")]  # fmt: skip
    node = yaml.safe_load((ROOT / "ansible" / "node.yml").read_text())
    assert [Path(p["ansible.builtin.import_playbook"]).name for p in node] == [Path(imports[0]).name,
                                                                              Path(imports[2]).name]  # fmt: skip
