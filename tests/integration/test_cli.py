"""The command line end to end: the real ``image-builder`` and ``invoke`` programs in subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from imagebuilder.cli import namespace
from imagebuilder.cli.program import short_name
from imagebuilder.docs import config_reference, layout_table, packages_table, release_lines_table
from tests.support.common import EXAMPLES, PAIRS, ROOT, build_args, reference, run

SECRETS = ("change-me", "change-me-api-key", "change-me-secret-key")


def test_both_programs_list_every_task_with_help() -> None:
    for program in ("image-builder", "invoke"):
        res = run("--list", program=program)
        assert res.code == 0, res.err
        for name in namespace.task_names:
            shown = short_name(namespace, name)  # build.build is listed as build, the name users type
            line = next((ln for ln in res.out.splitlines() if ln.strip().startswith(shown + " ")), None)
            assert line is not None and len(line.split()) > 1, f"{program} --list lacks help for {name}"


def test_every_flag_has_help() -> None:
    for name in namespace.task_names:
        task = namespace[name]
        assert task.__doc__ or task.body.__doc__, name
        for arg in task.get_arguments():
            assert arg.help, f"{name} --{arg.name} has no help text"


@pytest.mark.parametrize(
    ("pair", "config"), list(PAIRS.items()), ids=lambda v: "-".join(v) if isinstance(v, tuple) else ""
)
def test_dry_run_every_pair_fast_and_writes_nothing(pair: tuple[str, str], config: str | None, tmp_path: Path) -> None:
    # how fast a dry run answers is measured against its peers by bench/startup.py, not timed here (under the
    # filler's priority beside two emulated guests it took 5 s)
    os_name, provider = pair
    res = run(*build_args(os_name, provider), "--dry-run", "--offline", cwd=tmp_path)
    assert res.code == 0, res.err
    assert f"{os_name} " in res.out and f"for {provider}" in res.out
    assert "kubernetes          v1.24.17" in res.out
    assert "kubernetes-1-24-eks-36" in res.out
    assert list(tmp_path.iterdir()) == [], "a dry run must write nothing"
    for secret in SECRETS:
        assert secret not in res.out + res.err


def test_output_kind_and_name_per_provider() -> None:
    expected = {
        "vsphere": ("ova", "ubuntu-v1.24.17-eks-36-amd64.ova"),
        "baremetal": ("raw.gz", "ubuntu-v1.24.17-eks-36-amd64.gz"),
        "ami": ("ami", "ubuntu-v1.24.17-eks-36-amd64"),
        "nutanix": ("qcow2", "ubuntu-v1.24.17-eks-36-amd64.qcow2"),
    }
    for provider, (kind, name) in expected.items():
        res = run(*build_args("ubuntu", provider), "--dry-run", "--offline", "--output", "json")
        assert res.code == 0, res.err
        plan = json.loads(res.out)
        assert (plan["output"]["kind"], plan["output"]["name"]) == (kind, name)
    cs = json.loads(run(*build_args("redhat", "cloudstack"), "--dry-run", "--offline", "--output", "json").out)
    assert cs["output"]["name"] == "redhat-v1.24.17-eks-36-amd64.qcow2"
    assert cs["os_version"] == "8"


def test_json_plan_contents_and_masked_secrets() -> None:
    res = run(*build_args("redhat", "vsphere", "1-22"), "--dry-run", "--offline", "--output", "json")
    plan = json.loads(res.out)
    assert plan["dry_run"] is True
    assert (plan["os"], plan["os_kind"], plan["provider"], plan["provider_kind"]) == (
        "redhat",
        "OS-3",
        "vsphere",
        "platform",
    )
    assert (plan["release_channel"], plan["kubernetes_version"], plan["distro_release"]) == ("1-22", "v1.22.17", 28)
    assert plan["release_manifest"] == {
        "source": "https://distro.eks.amazonaws.com/kubernetes-1-22/kubernetes-1-22-eks-28.yaml",
        "resolved": False,
        "note": "not resolved offline (--offline)",
    }
    assert plan["config"]["password"] == "********"
    assert plan["config"]["enterprise_password"] == "********"
    assert any("subscription" in s for s in plan["steps"])
    assert "change-me" not in res.out


def test_spec_kind_names_give_the_same_plan() -> None:
    canonical = run(*build_args("ubuntu", "vsphere"), "--dry-run", "--offline", "--output", "json")
    kinds = run(
        "build", "--os", "os2", "--hypervisor", "platform", "--release-channel", "1-24",
        "--platform-config", str(EXAMPLES / "vsphere-ubuntu.json"), "--dry-run", "--offline", "--output", "json",
    )  # fmt: skip
    assert canonical.code == kinds.code == 0
    assert json.loads(canonical.out) == json.loads(kinds.out)


def test_invoke_and_image_builder_agree() -> None:
    args = [*build_args("ubuntu", "nutanix"), "--dry-run", "--offline", "--output", "json"]
    assert json.loads(run(*args).out) == json.loads(run(*args, program="invoke").out)


def test_os_version_and_name_override() -> None:
    res = run(
        *build_args("ubuntu", "baremetal"),
        "--os-version",
        "22.04",
        "--name",
        "edge-node.gz",
        "--dry-run",
        "--offline",
        "--output",
        "json",
    )
    plan = json.loads(res.out)
    assert plan["os_version"] == "22.04"
    assert plan["output"]["name"] == "edge-node.gz"
    bad = run(*build_args("ubuntu", "baremetal"), "--name", "../etc/passwd", "--dry-run")
    assert bad.code == 2 and "--name" in bad.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["build", "--hypervisor", "vsphere", "--release-channel", "1-24"], "--os"),
        (["build", "--os", "ubuntu", "--release-channel", "1-24"], "--hypervisor"),
        (["build", "--os", "ubuntu", "--hypervisor", "baremetal"], "--release-channel"),
        (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1.38"], "1-21, 1-22"),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "124"],
            "1-21, 1-22, 1-23, 1-24",
        ),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-38"],
            "1-21, 1-22, 1-23, 1-24",
        ),
        (
            ["build", "--os", "bottlerocket", "--hypervisor", "vsphere", "--release-channel", "1-24"],
            "download.bottlerocket",
        ),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "cloudstack", "--release-channel", "1-24"],
            "vsphere, baremetal, ami, nutanix",
        ),
        (["build", "--os", "debian", "--hypervisor", "vsphere", "--release-channel", "1-24"], "ubuntu (os2)"),
        (["build", "--os", "ubuntu", "--hypervisor", "vsphere", "--release-channel", "1-24"], "--vsphere-config"),
        (
            [
                "build",
                "--os",
                "ubuntu",
                "--hypervisor",
                "baremetal",
                "--release-channel",
                "1-24",
                "--ami-config",
                "x.json",
            ],
            "--ami-config",
        ),
        (
            [
                "build",
                "--os",
                "ubuntu",
                "--hypervisor",
                "baremetal",
                "--release-channel",
                "1-24",
                "--os-version",
                "18.04",
            ],
            "20.04, 22.04",
        ),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--output", "yaml"],
            "text or json",
        ),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-chanel", "1-24"],
            "did you mean '--release-channel'",
        ),
        (["biuld"], "did you mean 'build'"),
        (
            [
                "build",
                "--os",
                "ubuntu",
                "--hypervisor",
                "vsphere",
                "--release-channel",
                "1-24",
                "--vsphere-config",
                "/no/such.json",
            ],
            "/no/such.json: vsphere config file not found",
        ),
        (
            [
                "build",
                "--os",
                "ubuntu",
                "--hypervisor",
                "baremetal",
                "--release-channel",
                "1-24",
                "--mirror",
                "/no/such/dir",
            ],
            "mirror directory does not exist",
        ),
        (
            [
                "build",
                "--os",
                "ubuntu",
                "--hypervisor",
                "vsphere",
                "--release-channel",
                "1-24",
                "--vsphere-config",
                "a.json",
                "--platform-config",
                "b.json",
            ],
            "given twice",
        ),
    ],
)
@pytest.mark.parametrize("program", ["image-builder", "invoke"])
def test_bad_input_exits_2_and_writes_nothing(args: list[str], needle: str, program: str, tmp_path: Path) -> None:
    res = (
        run(*args, "--dry-run", "--output-dir", str(tmp_path / "out"), program=program)
        if args[0] == "build" and "--output" not in args
        else run(*args, program=program)
    )
    assert res.code == 2, (res.code, res.out, res.err)
    assert needle in res.err
    assert res.err.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_bad_config_file_names_file_field_and_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "vs.json"
    bad.write_text(json.dumps({"vcenter_server": "https://vc", "usernme": "u", "linked_clone": "yes"}))
    res = run(*build_args("ubuntu", "vsphere")[:7], "--vsphere-config", str(bad), "--dry-run")
    assert res.code == 2
    lines = res.err.splitlines()
    assert all(line.startswith(f"error: {bad}: ") for line in lines), res.err
    assert any("usernme: unknown field" in ln and "did you mean 'username'" in ln for ln in lines)
    assert any("vcenter_server: must be a host name or IP address, not a URL" in ln for ln in lines)
    assert any('linked_clone: must be the string "true" or "false"' in ln for ln in lines)
    assert any("password: required field is missing (expected vCenter password (secret))" in ln for ln in lines)
    broken = tmp_path / "broken.json"
    broken.write_text('{"a": 1,,}')
    res = run(*build_args("ubuntu", "vsphere")[:7], "--vsphere-config", str(broken), "--dry-run")
    assert res.code == 2 and "invalid JSON at line 1, column 9" in res.err


def test_release_manifest_override_uses_its_number_and_version(tmp_path: Path) -> None:
    sample = reference("eksd", "kubernetes-1-21-eks-4.yaml")
    res = run(
        *build_args("ubuntu", "baremetal", "1-21"), "--release-manifest", str(sample), "--dry-run", "--output", "json"
    )
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert (plan["kubernetes_version"], plan["distro_release"]) == ("v1.21.2", 4)
    assert plan["release_name"] == "kubernetes-1-21-eks-4"
    assert plan["output"]["name"] == "ubuntu-v1.21.2-eks-4-amd64.gz"
    assert plan["release_manifest"]["resolved"] is True
    kubelet = next(a for a in plan["artifacts"] if a["name"] == "kubelet")
    assert kubelet["sha256"] == "6bc6a526555f92b740cf11e490a1011680bdc037b2827faa2936066a12326388"
    mismatch = run(*build_args("ubuntu", "baremetal", "1-24"), "--release-manifest", str(sample), "--dry-run")
    assert mismatch.code == 2
    assert "spec.channel is 1-21, but --release-channel is 1-24" in mismatch.err
    assert str(sample) in mismatch.err


def test_release_manifest_from_url_and_unreachable(http_server: str) -> None:
    url = f"{http_server}/kubernetes-1-24/kubernetes-1-24-eks-36.yaml"
    res = run(*build_args("ubuntu", "ami"), "--release-manifest", url, "--dry-run", "--output", "json")
    assert res.code == 0, res.err
    assert json.loads(res.out)["release_manifest"]["source"] == url
    gone = run(*build_args("ubuntu", "ami"), "--release-manifest", f"{http_server}/missing.yaml", "--dry-run")
    assert gone.code == 1
    assert "HTTP 404" in gone.err and "try:" in gone.err


@pytest.mark.parametrize("kind", ["dir", "url"])
def test_mirror_resolves_artifacts(kind: str, mirror_dir: Path, http_server: str) -> None:
    mirror = str(mirror_dir) if kind == "dir" else http_server
    res = run(*build_args("ubuntu", "baremetal"), "--mirror", mirror, "--dry-run", "--output", "json")
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["release_manifest"]["resolved"] is True
    assert plan["release_manifest"]["source"].startswith(mirror)
    names = {a["name"] for a in plan["artifacts"]}
    assert {"kubelet", "kubeadm", "kubectl", "cni-plugins", "etcd", "pause", "coredns", "kube-apiserver"} <= names
    for a in plan["artifacts"]:
        if a["kind"] != "image":
            assert len(a["sha256"]) == 64
            assert a["fetch_from"].startswith(mirror)
            # at the upstream path: the distro's, or (the line's runtime) its project's on github.com
            assert a["fetch_from"].endswith(a["uri"].split("://", 1)[1].split("/", 1)[1]), a
    text = run(*build_args("ubuntu", "baremetal"), "--mirror", mirror, "--dry-run")
    assert "binary  kubelet" in text.out


def test_unreachable_upstream_plans_without_artifacts() -> None:
    res = run(*build_args("ubuntu", "baremetal"), "--dry-run")
    assert res.code == 0
    assert "not resolved offline" in res.out


def test_a_real_build_runs_preflight_first_and_needs_the_artifacts(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")}
    args = [*build_args("ubuntu", "ami"), "--offline", "--output-dir", str(tmp_path / "out"), "--skip-check", "host-os"]
    failing = run(*args, "--min-disk-gb", "999999", env=env)
    assert failing.code == 1 and "[FAIL] disk" in failing.out and "preflight failed: disk" in failing.err
    res = run(*args, "--min-disk-gb", "1", env=env)
    # offline with no mirror the node artifacts are unknown: stopped before anything boots or is written
    assert res.code == 2, res.err
    assert "release manifest is not resolved" in res.err
    assert not (tmp_path / "out").exists() and not (tmp_path / "ws").exists()


@pytest.mark.parametrize("provider", ["vsphere", "platform", "cloudstack", "nutanix", "hci", "ami", "baremetal"])
def test_config_schema(provider: str) -> None:
    res = run("config.schema", "--provider", provider)
    assert res.code == 0, res.err
    schema = json.loads(res.out)
    assert schema["additionalProperties"] is False


def test_config_schema_to_file_and_bad_provider(tmp_path: Path) -> None:
    dest = tmp_path / "vsphere.schema.json"
    assert run("config.schema", "--provider", "vsphere", "--dest", str(dest)).code == 0
    schema = json.loads(dest.read_text())
    assert "platform_server" in schema["then"]["required"]  # unless source_image_url (a local OVA)
    bad = run("config.schema", "--provider", "vspere")
    assert bad.code == 2 and "did you mean 'vsphere'" in bad.err


def test_generated_doc_sections_are_current() -> None:
    import imagebuilder.cli.program  # noqa: F401  (it registers the command line's sections)
    from imagebuilder.cli._help import CLI_SECTIONS
    from imagebuilder.docs import SECTIONS, names_table

    for page, _, _, make in (*SECTIONS, *CLI_SECTIONS):
        assert make() in (ROOT / "docs" / page).read_text(), f"docs/{page}: run 'invoke docs'"
    assert {make for *_, make in SECTIONS} == {config_reference, layout_table, packages_table, release_lines_table,
                                               names_table}  # fmt: skip
    assert [page for page, *_ in CLI_SECTIONS] == ["building.md"]


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_link_in_the_docs_resolves() -> None:
    """README.md and every page of docs/: a relative link names a file of the repository, and its #anchor a heading
    of that page (a page renamed or a heading reworded breaks a test, not a reader's click)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 10
    checked = 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists() and ROOT in dest.parents, f"{page.name}: {target} names no file of the repository"
            if anchor:
                assert anchor in _anchors(dest.read_text()), f"{page.name}: {target}: no such heading in {dest.name}"
            checked += 1
    assert checked > 20, "the links were really read"


def test_the_readme_is_an_entry_a_newcomer_reads_in_minutes() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 200
    assert not [n for n, line in enumerate(lines, 1) if len(line) > 120], "no README line over 120 characters"
    # the first screen: what it is, the two set-up commands, then the first image
    assert readme.index("`image-builder` builds Kubernetes node images") < readme.index("## Set up")
    assert readme.index("./scripts/setup.sh && .venv/bin/invoke demo") < readme.index("## Your first image")
    assert readme.index("## Your first image") < readme.index("## Tasks") and lines.index("## Your first image") < 40
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"docs/{page.name} is not listed in the README"


def test_the_readmes_first_image_is_what_the_tool_plans(tmp_path: Path) -> None:
    """The README's first build names the newest line, and each line of the plan it shows is a line of the plan that
    command prints (offline here; the output path is the user's folder)."""
    from imagebuilder.release.catalog import load_catalog

    readme = (ROOT / "README.md").read_text()
    part = readme.split("## Your first image", 1)[1]
    command = part.split("```sh", 1)[1].split("```", 1)[0].strip()
    shown = part.split("```text", 1)[1].split("```", 1)[0].splitlines()
    assert f"--release-channel {load_catalog().newest_channel().name} " in command + " "
    words = command.split()[1:]
    assert words[0] == "build" and "--dry-run" in words
    res = subprocess.run([str(ROOT / ".venv/bin/image-builder"), *words, "--offline"], cwd=tmp_path,
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    printed = res.stdout.replace(str(tmp_path), ".")
    for line in shown:
        text = " ".join(line.split("...")[0].split()).rstrip(" ,(")  # what the README elides with "..." is left out
        if text:
            assert text in " ".join(printed.split()), line


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """README command 2 is what CI runs, nothing beside it (issue 48): a step CI took that the README left out is
    how the two drifted apart."""
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.split("```sh", 1)[1].split("```", 1)[0].splitlines()
                if line and not line.startswith("#")]  # fmt: skip
    assert commands == [
        "./scripts/setup.sh && .venv/bin/invoke demo",
        "./scripts/setup.sh --test && .venv/bin/invoke test",
    ]
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[1], ci
    assert all(line.startswith(("set ", "cd ", "export CI=")) for line in ci[:-1]), ci


def test_setup_refuses_an_unknown_option_before_installing_anything() -> None:
    setup = str(ROOT / "scripts/setup.sh")
    res = subprocess.run(["bash", setup, "--tset"], capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "unknown option '--tset'" in res.stderr and "--test" in res.stderr, res.stderr
    assert "==>" not in res.stdout
    shown = subprocess.run(["bash", setup, "--help"], capture_output=True, text=True, check=True)
    assert "--test" in shown.stdout and "--bench" in shown.stdout and "set -" not in shown.stdout


def test_layout_table_lists_every_module() -> None:
    table = layout_table()
    for path in (ROOT / "imagebuilder").rglob("*.py"):
        rel = path.relative_to(ROOT)
        shown = f"{rel.parent.as_posix()}/" if path.name == "__init__.py" else rel.as_posix()
        assert f"| `{shown}` | " in table, shown
    assert "|  |" not in table, "a module without a docstring"


def test_dry_runs_write_nothing(tmp_path: Path, mirror_dir: Path) -> None:
    demo = run("demo", "--dry-run", "--dest", str(tmp_path / "demo"))
    assert demo.code == 0 and "would run: build --os ubuntu --hypervisor baremetal" in demo.out
    # which engine auto picks here, and why (issue 61)
    assert re.search(r"--engine auto  \((chroot|packer): auto: ", demo.out), demo.out
    base = run("image.base", "--dest", str(tmp_path / "base.qcow2"), "--dry-run")
    assert base.code == 0 and "cloud-init" in base.out
    mirror = run(
        "mirror.create",
        "--release-channel",
        "1-24",
        "--dest",
        str(tmp_path / "m"),
        "--source",
        str(mirror_dir),
        "--dry-run",
    )
    # 5 binaries/tarballs, 4 image tarballs, and the line's runtime: containerd, runc, crictl
    assert mirror.code == 0 and mirror.out.count("would download") == 12, mirror.out
    assert run("docs", "--dry-run").out.startswith("up to date")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]  # only the fixture's own directory


def test_the_demo_prints_each_steps_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: the demo's steps with when each began and how long it took (a warning is no step of its own)."""
    from imagebuilder.cli import _common

    now = iter([0.0, 5.0, 905.0, 906.0, 907.0, 1030.0])
    monkeypatch.setattr(_common.time, "monotonic", lambda: next(now))
    lines: list[str] = []
    clock = _common.StepClock(lines.append)
    clock("base image: reused")
    clock("release: Kubernetes v1.36.3 from upstream source")
    clock("warning: a note")
    clock("[ok  ] disk   4 GiB free\n[ok  ] cpus   2")  # the preflight's report
    clock.done()
    assert lines == [
        "[0m05s] base image: reused",
        "           (base image: 15m00s)",
        "[15m05s] release: Kubernetes v1.36.3 from upstream source",
        "warning: a note",
        "[ok  ] disk   4 GiB free\n[ok  ] cpus   2",
        "           (release: 2m05s)",
        "[17m10s] done",
    ]
