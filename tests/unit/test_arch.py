"""arm64 as a build dimension (issue 46), the parts that need no root: ``--arch`` values, the pairs built for arm64
and why the others are not, the release's artifacts picked for the asked architecture (the distro's real
manifests), the output name, the architecture facts (binfmt_misc's handler, ELF machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.builder.resolve import _artifact_name
from imagebuilder.core import arch as arch_mod
from imagebuilder.core.arch import ARCHES, arch, check_arch, elf_machine
from imagebuilder.core.errors import InputError
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.manifest import load_manifest, parse_manifest
from tests.support.common import make_manifest, reference
from tests.support.inproc import cli

CATALOG = load_catalog()


def test_the_two_arches_are_accepted_and_their_other_names_are_answered_with_the_one_to_use() -> None:
    assert [check_arch(a) for a in ("amd64", "arm64")] == ["amd64", "arm64"]
    for given_, meant in (("x86_64", "amd64"), ("aarch64", "arm64"), ("AARCH64", "arm64"), ("arm64v8", "arm64")):
        with pytest.raises(InputError, match=f"did you mean '{meant}'") as exc:
            check_arch(given_)
        assert exc.value.field == "--arch"
    with pytest.raises(InputError, match="expected amd64 or arm64"):
        check_arch("riscv64")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_other_value_is_refused_by_name_and_bounded(value: str) -> None:
    if value in ("amd64", "arm64"):
        return
    with pytest.raises(InputError) as exc:
        check_arch(value)
    assert exc.value.field == "--arch" and len(str(exc.value)) < 600


def test_ubuntu_on_bare_metal_is_built_for_arm64_and_every_other_pair_says_why_not() -> None:
    ubuntu, metal = CATALOG.os("ubuntu"), CATALOG.provider("baremetal")
    CATALOG.build_pair(ubuntu, metal).check_built_for("arm64")
    for pair in CATALOG.builds:
        pair.check_built_for("amd64")
        if (pair.os, pair.provider) == (ubuntu, metal):
            continue
        with pytest.raises(InputError) as exc:
            pair.check_built_for("arm64")
        assert f"{pair.os.name} on {pair.provider.name} is not built for arm64: " in str(exc.value)
        assert len(pair.why_not) > 20 and exc.value.field == "--arch"


@pytest.mark.parametrize("pair", [("ubuntu", "vsphere"), ("redhat", "baremetal"), ("ubuntu", "nutanix")])
def test_build_refuses_an_arm64_pair_at_plan_time(pair: tuple[str, str], tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text("{}")
    res = cli("build", "--os", pair[0], "--hypervisor", pair[1], "--release-channel", "1-24", "--arch", "arm64",
              "--dry-run", "--offline", f"--{pair[1]}-config", str(config))  # fmt: skip
    assert res.code == 2 and "is not built for arm64" in res.err and "Traceback" not in res.text, res.text


HOSTILE = ["aarch64", "arm64 ", "../arm64", "arm64\nX: 1", "{{arch}}", "a" * 5000, "ａｍｄ６４"]


@pytest.mark.parametrize("value", HOSTILE)
def test_build_refuses_a_hostile_arch_before_anything_runs(value: str, tmp_path: Path) -> None:
    res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", value,
              "--dry-run", "--offline", "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert res.code == 2 and "--arch" in res.err and "Traceback" not in res.text, res.text
    assert len(res.err) < 400 and "\nX: 1" not in res.err
    assert not (tmp_path / "out").exists()


def test_the_distros_manifests_give_each_arch_its_own_artifacts() -> None:
    for name in ("kubernetes-1-19-eks-2.yaml", "kubernetes-1-21-eks-4.yaml"):
        path = reference("eksd", name)
        amd, arm = load_manifest(str(path)), load_manifest(str(path), arch="arm64")
        assert amd.arch == "amd64" and arm.arch == "arm64"
        assert [a.name for a in amd.artifacts] == [a.name for a in arm.artifacts]
        for a, b in zip(amd.artifacts, arm.artifacts, strict=True):
            if a.kind == "image":  # multi-arch references: the same image
                assert a.uri == b.uri
                continue
            assert "arm64" in b.uri and "amd64" not in b.uri, b.uri
            assert "amd64" in a.uri and "arm64" not in a.uri, a.uri
            assert a.sha256 != b.sha256


def test_a_manifest_without_arm64_artifacts_is_refused_naming_the_first_missing_one() -> None:
    text = make_manifest("1-24", 36, "v1.24.17").replace("- arm64", "- s390x")  # the distro's, amd64 only
    assert parse_manifest(text, "m.yaml").arch == "amd64"
    with pytest.raises(InputError, match="no linux/arm64 kubelet in the release manifest") as exc:
        parse_manifest(text, "m.yaml", "arm64")
    assert exc.value.source == "m.yaml" and "release.build --arch arm64" in str(exc.value)


def test_the_output_name_ends_with_the_arch() -> None:
    name = _artifact_name("ubuntu", "v1.24.17", 36, ".gz", None, "eks", "arm64")
    assert name == "ubuntu-v1.24.17-eks-36-arm64.gz"
    assert _artifact_name("ubuntu", "v1.24.17", 36, ".gz", None, "eks") == "ubuntu-v1.24.17-eks-36-amd64.gz"


def test_elf_machine_tells_the_binaries_arch(tmp_path: Path) -> None:
    assert elf_machine(Path("/bin/sh")) == arch("amd64").elf_machine  # this host's own
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[18:20] = (183).to_bytes(2, "little")
    (tmp_path / "kubelet").write_bytes(bytes(header))
    assert elf_machine(tmp_path / "kubelet") == arch("arm64").elf_machine
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert elf_machine(tmp_path / "script") is None and elf_machine(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({}, "binfmt_misc is not mounted"),
        ({"register": ""}, "no binfmt_misc handler qemu-aarch64"),
        ({"register": "", "qemu-aarch64": "disabled\ninterpreter /x\nflags: OCF\n"}, "is disabled"),
        ({"register": "", "qemu-aarch64": "enabled\ninterpreter /x\nflags: OC\n"}, "lacks the F flag"),
        ({"register": "", "qemu-aarch64": "enabled\ninterpreter /x\nflags: POF\n"}, None),
    ],
)
def test_the_binfmt_handler_is_read_as_the_kernel_shows_it(
    files: dict[str, str], problem: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(arch_mod, "BINFMT_DIR", tmp_path)
    found = ARCHES["arm64"].emulation_problem()
    assert (found is None) if problem is None else (problem in (found or "")), found
    assert ARCHES["amd64"].emulation_problem() is None  # this host's own needs no handler


@pytest.mark.parametrize(
    "value",
    ["arm64,sparc", "aarch64", "arm64;id", "{{x}}", "arm64,x86_64", "\uff41\uff52\uff4d\uff16\uff14", "arm\u0666\u0664",
     "https://user:s3cr3t@example.com/arm64", "arm64,,arm64", "ARM64\x1b[2J"],
)  # fmt: skip
def test_the_arch_flags_refuse_a_hostile_arch_and_create_nothing(value: str, tmp_path: Path) -> None:
    """Every task that takes ``--arch`` (a build's, the mirror's, the base image's, the release's, preflight's): exit 2
    naming the flag, no traceback, no secret echoed, nothing made. Unicode digits and full-width letters are not the
    names."""
    for args in (("mirror.create", "--release-channel", "1-24", "--dest", str(tmp_path / "m")),
                 ("image.base", "--dest", str(tmp_path / "b" / "base.qcow2"), "--dry-run"),
                 ("release.build", "--kubernetes", "v1.36.3", "--dest", str(tmp_path / "r"), "--dry-run"),
                 ("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run",
                  "--offline", "--output-dir", str(tmp_path / "out")),
                 ("preflight", "--os", "ubuntu", "--hypervisor", "baremetal")):  # fmt: skip
        res = cli(*args, "--arch", value)
        assert res.code == 2 and "--arch" in res.err and "Traceback" not in res.text, res.text
        assert "s3cr3t" not in res.text and "\x1b" not in res.text
    assert not any(tmp_path.iterdir())


def test_an_arm64_build_refuses_bios_firmware(tmp_path: Path) -> None:
    res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", "arm64",
              "--firmware", "bios", "--dry-run", "--offline", "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert res.code == 2 and "--firmware: arm64 machines boot by UEFI only" in res.err, res.text


@pytest.mark.parametrize("value", ["sparc", "arm64\nX: 1", 7, ["arm64"], "x" * 10000])
def test_a_build_manifest_with_an_unknown_arch_is_bad_input_naming_it(value: object) -> None:
    from imagebuilder.core.arch import recorded

    assert recorded({}, "m.json").name == "amd64" and recorded({"arch": "arm64"}, "m.json").name == "arm64"
    with pytest.raises(InputError) as exc:
        recorded({"arch": value}, "m.json")
    assert exc.value.field == "plan.arch" and exc.value.source == "m.json" and len(str(exc.value)) < 200
    assert "\nX" not in str(exc.value)


def test_release_build_for_arm64_names_the_cross_compiler_it_lacks(tmp_path: Path) -> None:
    """On a host with Go and gcc but no cross gcc, ``release.build --arch arm64`` stops before anything runs, naming
    the compiler and the Debian package that has it (exit 1: the host lacks it, the flag is right)."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("go", "gcc", "pkg-config", "apt-get", "dpkg-deb"):
        found = shutil.which(tool)
        assert found, f"{tool} is missing here: run ./scripts/setup.sh"
        (bin_dir / tool).symlink_to(found)
    res = cli("release.build", "--kubernetes", "v1.36.3", "--arch", "amd64,arm64", "--dest", str(tmp_path / "r"),
              "--dry-run", env={"PATH": str(bin_dir)})  # fmt: skip
    assert res.code == 1, res.text
    assert "aarch64-linux-gnu-gcc (the cross compiler) is not installed" in res.err
    assert "gcc-aarch64-linux-gnu" in res.err and not (tmp_path / "r").exists()


# --- a provider config per architecture (build.matrix --arch amd64,arm64) ---------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("bm.json", {None: "bm.json"}),
        ("bm.json,arm64=bm-arm64.json", {None: "bm.json", "arm64": "bm-arm64.json"}),
        ("amd64=a.json, arm64=b.json", {"amd64": "a.json", "arm64": "b.json"}),
        ("configs/a=b.json", {None: "configs/a=b.json"}),  # a path's own '=' (no architecture before it)
        ("dir,with,commas/bm.json", {None: "dir,with,commas/bm.json"}),  # as before: one path
        ("weird=1.json,arm64=2.json", {None: "weird=1.json", "arm64": "2.json"}),
    ],
)
def test_a_config_flag_names_a_file_per_architecture(value: str, parsed: dict[str | None, str]) -> None:
    from imagebuilder.plan.request import arch_configs as _arch_configs

    assert _arch_configs(value, "--baremetal-config") == parsed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bm.json,aarch64=b.json", "did you mean 'arm64'"),
        ("bm.json,ARM64=b.json", "did you mean 'arm64'"),
        ("arm64=a.json,arm64=b.json", "names the arm64 config twice"),
        ("a.json,b.json,arm64=c.json", "names the config of every other architecture twice"),
        ("a.json,arm64=", "an entry names no file"),
        ("arm64=a.json,,amd64=b.json", "an entry names no file"),
    ],
)
def test_a_config_flag_with_a_bad_architecture_entry_is_refused(value: str, message: str) -> None:
    from imagebuilder.plan.request import arch_configs as _arch_configs

    with pytest.raises(InputError, match=message) as exc:
        _arch_configs(value, "--baremetal-config")
    assert exc.value.field == "--baremetal-config"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60))
def test_a_config_value_naming_no_architecture_is_one_path_whatever_it_holds(value: str) -> None:
    """Any value without an ``<arch>=`` entry is the path it was before architectures (commas and '=' included)."""
    from imagebuilder.core.arch import ARCH_SYNONYMS
    from imagebuilder.plan.request import arch_configs as _arch_configs

    names = (*ARCHES, *ARCH_SYNONYMS)
    if any(p.strip().split("=", 1)[0].lower() in names and "=" in p for p in value.split(",")):
        return  # a value that does name one is the other tests'
    assert _arch_configs(value, "--baremetal-config") == {None: value}


def _source(tmp_path: Path, name: str) -> Path:
    """A provider config naming a source image (a file: the plan checks it exists; nothing reads it here)."""
    import hashlib
    import json

    image = tmp_path / f"{name}.qcow2"
    image.write_bytes(name.encode())
    config = tmp_path / f"{name}.json"
    digest = hashlib.sha256(name.encode()).hexdigest()
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    return config


def test_a_single_build_takes_its_architectures_config() -> None:
    from imagebuilder.cli.build import SHARED, _request

    given = {**SHARED, "baremetal_config": "a.json,arm64=b.json"}
    common = {"os": "ubuntu", "hypervisor": "baremetal", "release_channel": "1-24"}
    assert _request(given, {**common, "arch": "arm64"}).configs == {"baremetal": "b.json"}
    assert _request(given, {**common, "arch": None}).configs == {"baremetal": "a.json"}  # amd64, the default
    only_arm = {**SHARED, "baremetal_config": "arm64=b.json"}
    assert _request(only_arm, {**common, "arch": None}).configs == {}  # none for amd64


def test_the_matrix_builds_each_architecture_from_its_own_source_and_emits_a_job_for_each(tmp_path: Path) -> None:
    """``build.matrix --arch amd64,arm64``: one entry per architecture, each from the config named for it; the
    emitted pipeline has an OS layer and a build job per architecture, the arm64 ones with ``--arch arm64`` and the
    arm64 config, the amd64 ones as they were before architectures."""
    amd, arm = _source(tmp_path, "amd"), _source(tmp_path, "arm")
    args = ("build.matrix", "--pairs", "ubuntu:baremetal", "--release-channel", "1-23,1-24", "--arch", "amd64,arm64",
            "--baremetal-config", f"{amd},arm64={arm}", "--offline", "--engine", "chroot", "--runtime", "os",
            "--emit", "gitlab-ci")  # fmt: skip
    res = cli(*args)
    assert res.code == 0, res.text
    import yaml

    doc = yaml.safe_load(res.out)
    jobs = {k: v for k, v in doc.items() if isinstance(v, dict) and "script" in v}
    assert set(jobs) == {"os-layer-ubuntu-20-04", "os-layer-ubuntu-20-04-arm64", "build-ubuntu-baremetal-efi-chroot",
                         "build-ubuntu-baremetal-arm64-efi-chroot"}  # fmt: skip
    for job, name, config in (("build-ubuntu-baremetal-efi-chroot", None, amd),
                              ("build-ubuntu-baremetal-arm64-efi-chroot", "arm64", arm),
                              ("os-layer-ubuntu-20-04-arm64", "arm64", arm)):  # fmt: skip
        command = jobs[job]["script"][-1]
        assert f"--baremetal-config {config} " in command, command
        assert ("--arch arm64" in command) == (name == "arm64"), command
    assert jobs["build-ubuntu-baremetal-arm64-efi-chroot"]["needs"][0]["job"] == "os-layer-ubuntu-20-04-arm64"
    assert jobs["build-ubuntu-baremetal-arm64-efi-chroot"]["parallel"]["matrix"][0]["RELEASE_CHANNEL"] == [
        "1-23",
        "1-24",
    ]
    # a pair not built for arm64 in the same matrix: refused naming why, nothing written
    res = cli(*args[:2], "ubuntu:baremetal,ubuntu:ami", *args[3:])
    assert res.code == 2 and "ubuntu on ami is not built for arm64" in res.err, res.text


def test_serve_names_each_architectures_image_url(tmp_path: Path) -> None:
    """``serve --dir`` with a build's two images: an osImageURL for each, by name (a machine boots its own
    architecture's); with one image, the one value as before."""
    from imagebuilder.host.serve import cluster_values

    for name in ("ubuntu-v1.36.3-source-3-amd64.gz", "ubuntu-v1.36.3-source-3-arm64.gz"):
        (tmp_path / name).write_bytes(b"x")
    values = cluster_values("http://h:8080", tmp_path)
    assert values == {
        "osImageURL (ubuntu-v1.36.3-source-3-amd64.gz)": "http://h:8080/ubuntu-v1.36.3-source-3-amd64.gz",
        "osImageURL (ubuntu-v1.36.3-source-3-arm64.gz)": "http://h:8080/ubuntu-v1.36.3-source-3-arm64.gz",
    }
    (tmp_path / "ubuntu-v1.36.3-source-3-amd64.gz").unlink()
    assert cluster_values("http://h:8080", tmp_path) == {"osImageURL": "http://h:8080/ubuntu-v1.36.3-source-3-arm64.gz"}


def test_the_matrix_builds_both_architectures_of_a_release_manifest_given_to_it(tmp_path: Path) -> None:
    """``build.matrix --release-manifest``: a release of its own (built from source, a distro's newer one) for the
    matrix's one channel, for each architecture; the emitted jobs carry it. More than one channel is refused naming
    the flag: one manifest names one release."""
    amd, arm = _source(tmp_path, "amd"), _source(tmp_path, "arm")
    manifest = tmp_path / "kubernetes-1-24-eks-9.yaml"
    manifest.write_text(make_manifest("1-24", 9, "v1.24.17"))
    args = ("build.matrix", "--pairs", "ubuntu:baremetal", "--release-channel", "1-24", "--arch", "amd64,arm64",
            "--baremetal-config", f"{amd},arm64={arm}", "--offline", "--engine", "chroot", "--runtime", "os",
            "--release-manifest", str(manifest))  # fmt: skip
    res = cli(*args, "--emit", "gitlab-ci")
    assert res.code == 0, res.text
    import yaml

    jobs = {k: v for k, v in yaml.safe_load(res.out).items() if isinstance(v, dict) and "script" in v}
    builds = [j for j in jobs if j.startswith("build-")]
    assert len(builds) == 2, jobs
    for job in builds:
        assert f"--release-manifest {manifest} " in jobs[job]["script"][-1], jobs[job]["script"][-1]
    from imagebuilder.builder.matrix import expand
    from imagebuilder.cli.build import SHARED, _request

    values = {**SHARED, "baremetal_config": f"{amd},arm64={arm}", "release_manifest": str(manifest), "offline": True,
              "engine": "chroot", "runtime": "os"}  # fmt: skip
    request = _request(values, {})
    plans = expand(request, [("ubuntu", "baremetal")], ["1-24"], ("amd64", "arm64"))
    assert [p.output_name for p in plans] == ["ubuntu-v1.24.17-eks-9-amd64.gz", "ubuntu-v1.24.17-eks-9-arm64.gz"]
    refused = cli(*args[:4], "1-23,1-24", *args[5:], "--dry-run")
    assert refused.code == 2 and "--release-manifest" in refused.err and "2 channels" in refused.err, refused.text


def test_a_huge_release_manifest_value_is_refused_without_being_echoed_whole(tmp_path: Path) -> None:
    """``build.matrix --release-manifest`` of 10,000 characters: exit 2, the message names the value's start and end,
    nothing is written."""
    res = cli("build.matrix", "--pairs", "ubuntu:baremetal", "--release-channel", "1-24", "--release-manifest",
              "a" * 10_000, "--offline", "--dry-run", "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert res.code == 2 and len(res.err) < 400 and "..." in res.err, res.err[:500]
    assert not any(tmp_path.iterdir())
