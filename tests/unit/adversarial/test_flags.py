"""Hostile and careless flag values, for every task that takes a typed flag, a destination or a URL.

Each case must exit 2, name the flag, print no traceback and create nothing. Run in process
(tests.support.inproc); tests/integration/adversarial/test_flags.py runs a sample through the real console script."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.common import ROOT
from tests.support.inproc import cli

BAD_NUMBERS = ["abc", "1_0", " 8", "0x10", "1e3", "", "-", "１２", "9" * 40]
#: (task args before the flag, flag, a value that is out of range)
NUMERIC_FLAGS = [
    (["serve", "--dir", "."], "--port", "99999"),
    (["serve", "--dir", "."], "--port", "0"),
    (["dhcp.verify", "--interface", "lo"], "--timeout", "-5"),
    (["image.verify", "--image", "README.md"], "--boot-timeout", "0"),
    (["image.base", "--dest", "{tmp}/b.qcow2", "--dry-run"], "--size-gb", "65"),
    (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run"],
     "--disk-gb", "1"),
    (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24"], "--min-disk-gb", "0"),
    (["demo", "--dest", "{tmp}/d", "--dry-run"], "--disk-gb", "3"),
    (["preflight", "--os", "ubuntu", "--hypervisor", "baremetal"], "--min-disk-gb", "-1"),
]  # fmt: skip


def _fill(args: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in args]


@pytest.mark.parametrize("value", BAD_NUMBERS)
@pytest.mark.parametrize(("before", "flag", "out_of_range"), NUMERIC_FLAGS)
def test_numbers_are_digits_in_range(
    tmp_path: Path, before: list[str], flag: str, out_of_range: str, value: str
) -> None:
    for bad in (value, out_of_range):
        res = cli(*_fill(before, tmp_path), flag, bad)
        assert res.code == 2, (flag, bad, res.text)
        assert flag in res.err, res.err
    assert not list(tmp_path.iterdir()), "nothing created"


URLS = ["ftp://host/x", "file:///etc/passwd", "http://", "https://exa mple.com/", "https://h:99999/", "gopher://h/",
        "https://u:S3CRET-URL@host/x", "javascript:alert(1)", "https://[::1/"]  # fmt: skip
URL_FLAGS = [
    (["download.bottlerocket", "--variant", "vsphere", "--kubernetes", "1.24", "--dry-run"], "--metadata-url"),
    (["download.bottlerocket", "--variant", "vsphere", "--kubernetes", "1.24", "--dry-run"], "--targets-url"),
    (["download.bottlerocket", "--variant", "vsphere", "--kubernetes", "1.24", "--dry-run"], "--root"),
    (["download.hook", "--dry-run"], "--manifest"),
    (["mirror.create", "--release-channel", "1-24", "--dest", "{tmp}/m", "--dry-run"], "--source"),
    (["mirror.create", "--release-channel", "1-24", "--dest", "{tmp}/m", "--dry-run"], "--release-manifest"),
    (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run"], "--mirror"),
    (["image.base", "--dest", "{tmp}/b.qcow2", "--dry-run"], "--mirror"),
    (["template.import", "--os", "ubuntu", "--kubernetes", "1.24", "--dry-run"], "--ova"),
]  # fmt: skip


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize(("before", "flag"), URL_FLAGS)
def test_urls_have_an_allowed_scheme_and_a_host(tmp_path: Path, before: list[str], flag: str, url: str) -> None:
    res = cli(*_fill(before, tmp_path), flag, url, env={"GOVC_URL": "https://127.0.0.1:1/sdk"})
    assert res.code == 2, (flag, url, res.text)
    assert "S3CRET-URL" not in res.text
    assert not (tmp_path / "m").exists() and not (tmp_path / "b.qcow2").exists()


def test_destinations_that_are_files_or_cannot_be_created(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    a_dir = tmp_path / "dir"
    a_dir.mkdir()
    dhcp = ROOT / "config" / "examples" / "dhcp.yaml"
    cases = [
        (["download.hook", "--dest", str(a_file)], "--dest"),
        (["download.hook", "--dest", f"{a_file}/sub"], "--dest"),
        (["download.bottlerocket", "--variant", "vsphere", "--kubernetes", "1.24", "--dest", str(a_file)], "--dest"),
        (["dhcp.render", "--config", str(dhcp), "--dest", str(a_file)], "--dest"),
        (["dhcp.render", "--config", str(dhcp), "--dest", f"{a_file}/x"], "--dest"),
        (["config.schema", "--provider", "vsphere", "--dest", str(a_dir)], "--dest"),
        (["config.schema", "--provider", "vsphere", "--dest", f"{a_file}/schema.json"], "--dest"),
        (["serve", "--dir", str(a_dir), "--access-log", str(a_dir)], "--access-log"),
        (["serve", "--dir", str(a_dir), "--access-log", f"{a_file}/log"], "--access-log"),
        (["serve", "--dir", str(a_dir), "--nginx-config", str(a_dir)], "--nginx-config"),
        (["serve", "--dir", str(a_dir), "--nginx-config", f"{a_file}/site"], "--nginx-config"),
        (["serve", "--dir", str(a_file)], "--dir"),
        (["mirror.create", "--release-channel", "1-24", "--dest", str(a_file), "--dry-run"], "--dest"),
        (["demo", "--dest", str(a_file), "--dry-run"], "--dest"),
        (["image.base", "--dest", str(a_dir), "--dry-run"], "--dest"),
        (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run",
          "--output-dir", str(a_file)], "--output-dir"),
        (["image.verify", "--image", str(a_dir)], "--image"),
        (["image.verify", "--image", str(tmp_path / "missing.gz")], "--image"),
        (["image.customize", "--image", str(a_file), "-f", str(a_dir), "--dest", "x.gz"], "-f"),
        (["image.customize", "--image", str(a_dir), "-f", str(a_file), "--dest", "x.gz"], "--image"),
        (["image.customize", "--image", str(a_file), "-f", str(a_file), "--dest", str(a_dir)], "--dest"),
        (["image.customize", "--image", str(a_file), "-f", str(a_file), "--dest", f"{a_file}/x"], "--dest"),
        (["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run",
          "--customize", str(a_dir)], "--customize"),
        (["dhcp.render", "--config", str(a_dir)], "--config"),
        (["host.prepare", "--root", str(a_file), "--dry-run"], "--root"),
    ]  # fmt: skip
    for args, flag in cases:
        res = cli(*args)
        assert res.code == 2, (args, res.text)
        assert flag in res.err, (args, res.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"] and not list(a_dir.iterdir())


#: a dry-run build on the newest line, to which a hostile flag is added
ON_1_36 = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-36", "--dry-run"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["serve", "--dir", ".", "--bind", "999.1.1.1"], "--bind"),
        (["serve", "--dir", ".", "--bind", "localhost; rm -rf /"], "--bind"),
        (["dhcp.verify", "--interface", "eth0\nx"], "--interface"),
        (["dhcp.verify", "--interface", "no-such-if0"], "--interface"),
        (
            ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--output", "yaml"],
            "--output",
        ),
        (["image.base", "--dest", "x.qcow2", "--suite", "bookworm; reboot", "--dry-run"], "--suite"),
        (["template.import", "--ova", "x.ova", "--os", "ubuntu", "--kubernetes", "1.24", "--name", "../x"], "--ova"),
        (["vsphere.setup-user"], "--file"),
        (["cluster.validate"], "--file"),
        (["dhcp.render"], "--config"),
        (["image.verify"], "--image"),
        (["image.customize", "-f", "c.yaml", "--dest", "x.gz"], "--image"),
        (["template.customize", "--os", "ubuntu", "--kubernetes", "1.24", "-f", "c.yaml"], "--template"),
        (["template.customize", "--template", "/DC0/vm/t", "--os", "ubuntu", "--kubernetes", "1.24"], "-f"),
        (
            [
                "template.customize",
                "--template",
                "/DC0/vm/t",
                "--os",
                "ubuntu",
                "--kubernetes",
                "1.24",
                "-f",
                "missing.yaml",
            ],
            "-f",
        ),
        (["config.schema", "--provider", "vsphere", "--customize"], "--customize"),
        (["serve"], "--dir"),
        (["mirror.create", "--dest", "m"], "--release-channel"),
        (["config.schema"], "--provider"),
        (["preflight", "--hypervisor", "baremetal"], "--os"),
        (["host.prepare", "--dry-run", "--root", ".", "--user", "--help"], "--user"),
        (["host.prepare", "--dry-run", "--root", ".", "--user", "root;reboot"], "--user"),
        (["host.prepare", "--dry-run", "--root", ".", "--http-proxy", "ftp://proxy:3128"], "--http-proxy"),
        (["host.prepare", "--dry-run", "--root", ".", "--https-proxy", "http://u:S3CR3T@p:99999"], "--https-proxy"),
        (["host.prepare", "--dry-run", "--root", ".", "--no-proxy", "a;b"], "--no-proxy"),
        (["host.prepare", "--dry-run", "--root", ".", "--no-proxy", "x\nexport EVIL=1"], "--no-proxy"),
        *[([*ON_1_36, "--runtime", bad], "--runtime") for bad in ("distro", "x" * 10000, "os\n")],
        (["build.matrix", *ON_1_36[1:], "--runtime", "/proc/self/environ"], "--runtime"),
        *[
            (["mirror.create", "--release-channel", "1-36", "--dest", "m", "--eksa-release", bad], "--eksa-release")
            for bad in ("v0.21.3\n", "v" + "9" * 10000, "v０.21.3", "https://u:S3CR3T@h/v0.21.3", "/proc/self/environ")
        ],
        (["release.build", "--kubernetes", "v1.36.3", "--containerd", "v2.3.1\n", "--dest", "r"], "--containerd"),
        (
            ["release.build", "--kubernetes", "v1.36.3", "--containerd", "v" + "9" * 10000, "--dest", "r"],
            "--containerd",
        ),
        (["release.build", "--kubernetes", "v1.36.3", "--containerd", "../../v2.3.1", "--dest", "r"], "--containerd"),
        # a malformed pin is refused before root.json is fetched (the root URL below refuses connections: a fetch
        # would exit 1, not 2)
        *[
            (
                [
                    "download.bottlerocket",
                    "--variant",
                    "baremetal",
                    "--kubernetes",
                    "1.33",
                    "--root",
                    "http://127.0.0.1:9/root.json",
                    "--root-sha512",
                    bad,
                ],
                "--root-sha512",
            )
            for bad in ("zz", "0" * 127, "0" * 129, "g" * 128, "０" * 128, "0" * 64 + "\n" + "0" * 63)
        ],
        (
            [
                "download.image",
                "--repo",
                "http://127.0.0.1:9/",
                "--root",
                "http://127.0.0.1:9/root.json",
                "--target",
                "a.gz",
                "--root-sha512",
                "0" * 64,
            ],
            "--root-sha512",
        ),
    ],
)
def test_other_values_and_missing_flags(tmp_path: Path, args: list[str], flag: str) -> None:
    res = cli(*args, cwd=tmp_path)
    assert res.code == 2, res.text
    assert flag in res.err, res.err
    assert "S3CR3T" not in res.text
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "source",
    [
        b"github.com/hashicorp/\xff\xfeqemu\n",
        b"../../../../etc/qemu\n",
        b"github.com/hashicorp/../../qemu\n",
        b"github.com/hashicorp/ansible\n",
        b"x" * 300_000,
        b"github.com/hashicorp/qemu\ngithub.com/evil/qemu\n",
        b"github.com/hashicorp/qemu 1.1.4 ../../evil\n",
        "link",
    ],
)
def test_a_plugin_source_file_is_one_address_of_its_plugin(tmp_path: Path, source: bytes | str) -> None:
    """A ``<type>.source`` beside a plugin binary names where Packer keeps it (folders under its plugin folder): one
    source address in Packer's grammar, of that plugin, read as any user file is (UTF-8, bounded, not a link), or
    exit 2 naming the file without quoting it (outside review: non-UTF-8 bytes were an internal error)."""
    from imagebuilder.builder.packer_plugins import plugin_binaries
    from imagebuilder.core.errors import InputError

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "packer-plugin-qemu").write_bytes(b"#!/bin/sh\nexit 1\n")
    if source == "link":
        (tmp_path / "secret").write_text("github.com/hashicorp/qemu\n")
        (folder / "qemu.source").symlink_to(tmp_path / "secret")
    else:
        assert isinstance(source, bytes)
        (folder / "qemu.source").write_bytes(source)
    with pytest.raises(InputError) as refused:
        plugin_binaries(folder)
    assert "qemu.source" in str(refused.value) and "evil" not in str(refused.value) and "xxxx" not in str(refused.value)


@pytest.mark.parametrize(
    "root", [b"hello\n", b"\xff\xfe", b'{"signed": {"_type": "targets"}, "signatures": []}', b"[]"]
)
def test_a_root_that_is_not_root_metadata_is_the_flags_fault(tmp_path: Path, root: bytes) -> None:
    """download.image's --root is the user's trust anchor: a file that is not TUF root metadata exits 2 naming
    --root (outside review: it was blamed on the repository, exit 1)."""
    given = tmp_path / "given" / "root.json"
    given.parent.mkdir()
    given.write_bytes(root)
    (tmp_path / "repo" / "metadata").mkdir(parents=True)
    res = cli("download.image", "--repo", str(tmp_path / "repo"), "--root", str(given), "--target", "a.gz",
              "--dest", str(tmp_path / "dl"), cwd=tmp_path)  # fmt: skip
    assert res.code == 2 and "--root" in res.err and ("not TUF root metadata" in res.err or "not root" in res.err), (
        res.err
    )
    assert not (tmp_path / "dl").exists()
