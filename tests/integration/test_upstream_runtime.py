"""The line's runtime from its projects' own releases (issue 42), against the real pieces: the runc pins read from
containerd's source on the Go module proxy, and ``mirror.create`` carrying the files and their checksum files over
a real HTTP server, then an air-gapped plan reading them from the copy. The image built and booted with it is
``test_chroot_engine.py``'s matrix test (its 1-24 image)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.support.common import run
from tests.support.runtime_cases import standin_upstream_runtime


@pytest.mark.slow
def test_each_pin_is_the_runc_its_containerd_release_names_in_its_source() -> None:
    """config/release-channels.yaml's runc_pins against containerd's own script/setup/runc-version (the Go module
    proxy's copy of each release; remembered in ~/.cache/image-builder after the first read)."""
    from imagebuilder.core.progress import silent
    from imagebuilder.release import source
    from imagebuilder.release.catalog import load_catalog

    go = source._Go(silent)
    for containerd, runc in load_catalog().upstream_runtime.runc_pins:
        assert source._runc_version(go, containerd) == runc, containerd


def _upstream(root: Path, channel: str = "1-34") -> dict[str, tuple[str, bytes]]:
    """A stand-in release of the distro's kind (no runtime in it) and the line's runtime files at their upstream
    paths with their checksum files: artifact name -> (url, bytes)."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release
    from imagebuilder.release.upstream import upstream_files

    line = load_catalog().channel(channel)
    make_standin_release(root, line)
    data = standin_upstream_runtime(root, channel)
    return {p.name: (p.url, data[p.name]) for p in upstream_files(line.runtime)}


def _in(mirror: Path, url: str) -> Path:
    return mirror / url.split("://", 1)[1].split("/", 1)[1]


def test_mirror_create_carries_the_lines_runtime_and_an_air_gapped_plan_reads_it(
    tmp_path: Path, served: tuple[Path, str]
) -> None:
    upstream, url = served
    files = _upstream(upstream)
    copy = tmp_path / "copy"
    args = ("mirror.create", "--release-channel", "1-34", "--source", url, "--dest", str(copy))
    dry = run(*args, "--dry-run")
    assert dry.code == 0 and all(str(_in(copy, u)) in dry.out for u, _ in files.values()), dry.out + dry.err
    assert not copy.exists() or not any(copy.rglob("*.tar.gz")), "the dry run writes nothing"
    res = run(*args)
    assert res.code == 0, res.err
    for name, (u, body) in files.items():  # at their upstream paths, byte for byte, with their checksum files
        assert _in(copy, u).read_bytes() == body, name
        sums = list(_in(copy, u).parent.glob("*.sha256*"))
        assert sums, f"{name}'s checksum file is carried"
    again = run(*args)
    assert again.code == 0 and "downloaded" not in again.out.replace("0 downloaded", ""), again.out
    # the build reads the copy alone: the runtime planned is the line's, with the digests its checksum files give
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--mirror",
              str(copy), "--offline", "--dry-run", "--output", "json", cwd=tmp_path)  # fmt: skip
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["runtime"]["source"] == "release" and plan["runtime"]["containerd"] == "v2.1.4"
    assert plan["runtime"]["runc"] == "v1.3.0" and plan["runtime"]["config_version"] == 3
    got = {a["name"]: a["sha256"] for a in plan["artifacts"] if a["name"] in files}
    assert got == {n: hashlib.sha256(b).hexdigest() for n, (_, b) in files.items()}
    text = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--mirror",
               str(copy), "--offline", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert text.code == 0 and "containerd v2.1.4, runc v1.3.0, crictl v1.36.0" in text.out, text.out


def test_a_file_that_is_not_what_its_checksum_file_says_is_not_mirrored(
    tmp_path: Path, served: tuple[Path, str]
) -> None:
    upstream, url = served
    files = _upstream(upstream)
    runc_url, _ = files["runc"]
    _in(upstream, runc_url).write_bytes(b"a runc someone swapped")
    copy = tmp_path / "copy"
    res = run("mirror.create", "--release-channel", "1-34", "--source", url, "--dest", str(copy))
    assert res.code == 1 and "verification" in res.err and "Traceback" not in res.err, res.err
    assert not _in(copy, runc_url).exists(), "nothing of it is kept"
    assert not list(copy.rglob("*.yaml")), "a mirror that names an artifact holds it: the manifest is written last"


def test_a_mirror_made_before_this_names_the_fix_and_exits_2(tmp_path: Path) -> None:
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path / "old", load_catalog().channel("1-34"))  # the manifest, no runtime files
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--mirror",
              str(tmp_path / "old"), "--offline", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert res.code == 2 and "--mirror" in res.err and "mirror.create" in res.err, res.err
    assert "Traceback" not in res.err
    # the OS's package, asked for, needs none of it (and warns nothing for 1-34: containerd 1.x still runs it)
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--mirror",
              str(tmp_path / "old"), "--offline", "--dry-run", "--runtime", "os", cwd=tmp_path)  # fmt: skip
    assert res.code == 0 and "the OS's containerd package" in res.out, res.out + res.err
