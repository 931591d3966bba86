"""Packer 1.9 and 1.16 (built from their release sources) and their plugins: the version constraint grammar, where
Packer keeps plugins, the check before a build (a missing plugin is exit 2 before anything starts, offline
included), offline installation from --packer-plugins and from a mirror, preflight's report, and every pair
validated and fmt-checked on both Packers with the newest and with the floor plugin versions. The real builds on
them are in tests/integration/test_e2e_packers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuilder.builder.lint import lint_templates
from imagebuilder.builder.packer_plugins import (
    PLUGINS,
    PackerInfo,
    Requirement,
    check_plugins,
    installed_plugins,
    plugin_binaries,
    prepare_plugins,
    requirements_for,
)
from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.core.fetch import Mirror
from tests.support import packers
from tests.support.common import run

# --- the constraint grammar (hashicorp/go-version, as required_plugins uses it) -------------------------------


# --- where Packer keeps its plugins (as hashicorp/packer-plugin-sdk's pathing finds its folder) ----------------


# --- with the real Packers -------------------------------------------------------------------------------------


@pytest.fixture(params=packers.MODERN)
def modern(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackerInfo:
    """A modern Packer with an empty plugin folder of its own (PACKER_PLUGIN_PATH, as a site may set it)."""
    monkeypatch.setenv("PACKER_PLUGIN_PATH", str(tmp_path / "plugins"))
    return PackerInfo.detect(str(packers.packer(request.param)))


def test_the_version_is_read_from_the_binary(modern: PackerInfo) -> None:
    assert modern.version_text in packers.MODERN and modern.has_plugin_blocks


def test_a_missing_plugin_offline_exits_2_before_anything_starts(modern: PackerInfo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--offline",
              "--packer", modern.path, "--output-dir", str(out), "--dry-run")  # fmt: skip
    assert res.code == 2, res.out + res.err
    for needed in ("Packer plugin qemu (github.com/hashicorp/qemu) offline", "needs >= 1.0.9", "installed in",
                   "Packer plugin ansible", "--packer-plugins"):  # fmt: skip
        assert needed in res.err, res.err
    fix = "packer plugins install --path packer-plugin-qemu github.com/hashicorp/qemu"
    assert (fix in res.err) is modern.installs_from_path
    assert not out.exists() and not (tmp_path / "plugins").exists(), "nothing created"
    # the real run stops at the same place, before preflight, a download or a VM
    real = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--offline",
               "--packer", modern.path, "--output-dir", str(out))  # fmt: skip
    assert real.code == 2 and "Packer plugin qemu" in real.err and "[ok  ]" not in real.out
    assert not out.exists()
    # online, with a folder that lacks them: still before the release manifest is fetched (a download)
    empty = tmp_path / "empty"
    empty.mkdir()
    online = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34",
                 "--release-manifest", "http://127.0.0.1:9/never-fetched.yaml", "--packer", modern.path,
                 "--packer-plugins", str(empty), "--output-dir", str(out))  # fmt: skip
    assert online.code == 2 and f"no packer-plugin-qemu in {empty}" in online.err, online.err
    assert "never-fetched" not in online.err and not out.exists()


def test_a_plugin_below_the_constraint_names_what_was_found(modern: PackerInfo) -> None:
    newest = packers.newest_plugins()
    prepare_plugins(modern, ["qemu"], binaries=newest)
    too_new = Requirement("qemu", "github.com/hashicorp/qemu", ">= 99.0")
    check = check_plugins(modern, [too_new], binaries=newest, offline=True)
    with pytest.raises(InputError) as err:
        check.raise_missing()
    text = str(err.value)
    assert "needs >= 99.0" in text and "installed in" in text and ": 1.1.4" in text, text
    assert f"{newest}/packer-plugin-qemu is 1.1.4" in text


def test_plugins_install_offline_and_a_rerun_installs_nothing(modern: PackerInfo, tmp_path: Path) -> None:
    newest = packers.newest_plugins()
    said: list[str] = []
    check = prepare_plugins(modern, ["qemu", "vsphere"], binaries=newest, say=said.append)
    assert {s.requirement.name: s.action for s in check.states} == dict.fromkeys(("qemu", "vsphere", "ansible"),
                                                                                  "installed")  # fmt: skip
    assert len([s for s in said if s.startswith("installing Packer plugin")]) == 3
    # Packer itself lists them, from the folder it uses, with their _SHA256SUM files
    listed = {i.source: i for i in installed_plugins(modern)}
    assert {str(listed[r.source].version) for r in requirements_for(["qemu"])} == {"1.1.4", "1.1.6"}
    assert all(i.path.is_relative_to(tmp_path / "plugins") for i in listed.values())
    assert all(Path(f"{i.path}_SHA256SUM").is_file() for i in listed.values())
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "plugins").rglob("*")}
    said.clear()
    again = prepare_plugins(modern, ["qemu", "vsphere"], binaries=newest, say=said.append)
    assert not said and {s.action for s in again.states} == {"installed"}
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "plugins").rglob("*")} == before


def test_not_a_plugin_in_the_folder_is_refused(modern: PackerInfo, tmp_path: Path) -> None:
    folder = tmp_path / "bins"
    folder.mkdir()
    fake = folder / "packer-plugin-qemu"
    fake.write_text("#!/bin/sh\necho not a plugin\n")
    fake.chmod(0o755)
    with pytest.raises(InputError, match="is not a Packer plugin"):
        prepare_plugins(modern, ["qemu"], binaries=folder)
    assert not (tmp_path / "plugins").exists()


@pytest.mark.parametrize("plugins", ["newest", "floor"])
def test_every_pair_validates_and_is_formatted(modern: PackerInfo, plugins: str, tmp_path: Path) -> None:
    """Each pair rendered, ``packer validate`` (full, plugins loaded: nutanix too) and ``fmt -check``, with the
    newest plugin releases and with exactly the floor versions the templates' required_plugins name."""
    folder = packers.newest_plugins() if plugins == "newest" else packers.floor_plugins()
    results = lint_templates(tmp_path / "work", modern, plugins=folder)
    assert len(results) == 8 and not [r for r in results if r.syntax_only]  # 7 pairs, one of them for arm64 too
    failed = [f"{r.os}+{r.provider}: {r.output}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    versions = {i.source: str(i.version) for i in installed_plugins(modern)}
    if plugins == "floor":  # the floors themselves were loaded, not something newer
        assert versions == {r.source: str(r.constraint.floor) for r in requirements_for(PLUGINS)}
    else:
        assert versions == {
            r.source: str(v.version) for r in requirements_for(PLUGINS) for v in [plugin_binaries(folder)[r.type]]
        }


def test_preflight_shows_packer_and_each_plugin(modern: PackerInfo, tmp_path: Path) -> None:
    newest = packers.newest_plugins()
    preflight = ("preflight", "--os", "ubuntu", "--hypervisor", "baremetal", "--packer", modern.path, "--skip-check",
                 "disk")  # fmt: skip
    online = run(*preflight)
    head = f"packer {modern.version_text} ({modern.path}), plugins in {tmp_path / 'plugins'}"
    assert f"[WARN] packer   {head}" in online.out, online.out
    assert "qemu: not installed (found: none); 'packer init' will install github.com/hashicorp/qemu >= 1.0.9" in (
        online.out
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    offline = run(*preflight, "--packer-plugins", str(empty))
    assert f"[FAIL] packer   {head}" in offline.out, offline.out
    assert "qemu: MISSING, needs github.com/hashicorp/qemu >= 1.0.9, installed: none" in offline.out
    assert offline.code == 1 and "preflight failed: packer" in offline.err
    res = run(*preflight, "--packer-plugins", str(newest))
    assert f"qemu: will install 1.1.4 from {newest}/packer-plugin-qemu" in res.out, res.out
    assert "[WARN] packer" in res.out
    prepare_plugins(modern, ["qemu"], binaries=newest)
    res = run(*preflight)
    assert "[ok  ] packer" in res.out and "qemu 1.1.4 installed" in res.out and "ansible 1.1.6 installed" in res.out


def test_a_mirror_carries_the_plugins(modern: PackerInfo, tmp_path: Path, served: tuple[Path, str]) -> None:
    """mirror.create --packer-plugins copies them beside the release; a build from that mirror, as a folder or
    served over HTTP, finds them there with no --packer-plugins."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    upstream = tmp_path / "upstream"
    make_standin_release(upstream, load_catalog().channel("1-24"))
    root, url = served
    newest = packers.newest_plugins()
    dry = run("mirror.create", "--release-channel", "1-24", "--source", str(upstream), "--dest", str(root),
              "--packer-plugins", str(newest), "--dry-run", "--runtime", "os")  # fmt: skip
    assert dry.code == 0 and dry.out.count("would copy") == 6 and not (root / "packer-plugins").exists()
    made = run("mirror.create", "--release-channel", "1-24", "--source", str(upstream), "--dest", str(root),
               "--packer-plugins", str(newest), "--runtime", "os")  # fmt: skip
    assert made.code == 0, made.err
    assert "plugin" in made.out and (root / "packer-plugins" / "index.json").is_file()
    index = json.loads((root / "packer-plugins" / "index.json").read_text())
    assert index["qemu"]["version"] == "1.1.4" and index["qemu"]["source"] == "github.com/hashicorp/qemu"
    build = ("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--packer",
             modern.path, "--dry-run", "--runtime", "os")  # fmt: skip
    local = run(*build, "--mirror", str(root))
    assert local.code == 0, local.err
    assert f"qemu: will install 1.1.4 from {root}/packer-plugins/packer-plugin-qemu" in local.out, local.out
    remote = run(*build, "--mirror", url, "--output", "json")
    assert remote.code == 0, remote.err
    states = {p["name"]: p for p in json.loads(remote.out)["packer"]["plugins"]}
    assert states["qemu"]["action"] == "install from folder" and states["ansible"]["constraint"] == ">= 1.0.3"
    # the real install from the served mirror: each binary downloaded and checked against the index first
    check = prepare_plugins(modern, ["qemu"], mirror=Mirror.parse(url))
    assert {str(s.chosen) for s in check.states} == {"1.1.4", "1.1.6"}
    # a tampered binary at the mirror is refused, and nothing of it is installed
    (root / "packer-plugins" / "packer-plugin-vsphere").write_bytes(b"#!/bin/sh\n")
    with pytest.raises(InputError, match="does not match the index"):
        prepare_plugins(modern, ["vsphere"], mirror=Mirror.parse(str(root)))
    assert "github.com/hashicorp/vsphere" not in {i.source for i in installed_plugins(modern)}


def test_the_plan_and_matrix_name_the_packer(modern: PackerInfo, tmp_path: Path) -> None:
    newest = packers.newest_plugins()
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--offline",
              "--packer", modern.path, "--packer-plugins", str(newest), "--dry-run", "--output", "json")  # fmt: skip
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["packer"]["version"] == modern.version_text and plan["packer"]["path"] == modern.path
    assert {p["name"] for p in plan["packer"]["plugins"]} == {"qemu", "ansible"}
    assert not (tmp_path / "plugins").exists(), "a dry run installs nothing"
    matrix = run("build.matrix", "--pairs", "ubuntu:baremetal,ubuntu:ami", "--release-channel", "1-34",
                 "--offline", "--packer", modern.path, "--packer-plugins", str(newest), "--dry-run",
                 "--ami-config", str(Path("config/examples/ami-ubuntu.json").resolve()))  # fmt: skip
    assert matrix.code == 0, matrix.err
    assert f"packer {modern.version_text}" in matrix.out and "amazon: will install 1.8.2" in matrix.out


def test_errors_name_every_missing_plugin_at_once(modern: PackerInfo) -> None:
    check = check_plugins(modern, requirements_for(["vsphere"]), offline=True)
    with pytest.raises(InputErrors) as err:
        check.raise_missing()
    assert [e.detail.split(" (")[0] for e in err.value.errors] == ["Packer plugin vsphere", "Packer plugin ansible"]
