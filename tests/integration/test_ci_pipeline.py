"""Issue 44, proven by running it: the GitLab pipeline ``build.matrix --emit gitlab-ci`` writes, executed for real by
gitlab-ci-local (``./scripts/setup.sh --test`` installs it) with the shell executor, each job in a folder of its own
(``--shell-isolation``: only artifacts, caches and ``needs`` carry anything between jobs), on a small matrix: one
OS layer, two release lines (stand-in releases), the chroot engine, a publish to a TUF repository folder whose
keys come in as GitLab file variables. The repository is then read with python-tuf (``download.image``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.common import ROOT, run

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(2400)]
GITLAB_CI_LOCAL = ROOT / ".tools/bin/gitlab-ci-local"
CHANNELS = ("1-23", "1-24")
FILE_VARIABLES = "gitlab-ci-local-file-variables-*"  # gitlab-ci-local's folders of file variables, in /tmp


def _project(tmp_path: Path) -> Path:
    """A checkout of this repository (its committed files, as a CI clones it), with its own git remote."""
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "remote", "set-url", "origin", "https://gitlab.example/ib/ib.git"],
                   check=True)  # fmt: skip
    return project


def _file_variable_dirs() -> set[Path]:
    return set(Path("/tmp").glob(FILE_VARIABLES))


def _pipeline(project: Path, *jobs: str) -> subprocess.CompletedProcess[str]:
    """gitlab-ci-local on ``project``: the whole pipeline, or only ``jobs``.

    gitlab-ci-local writes each job's file variables (here the repository's private keys) to a folder of its own
    under /tmp and leaves it there; a GitLab runner removes them with the job. The run's folders are removed
    afterwards, so the suite leaves no key behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}
    before = _file_variable_dirs()
    try:
        return subprocess.run([str(GITLAB_CI_LOCAL), "--shell-isolation", "--no-color", *jobs], cwd=project,
                              env=env, capture_output=True, text=True, timeout=2000, check=False)  # fmt: skip
    finally:
        for made in _file_variable_dirs() - before:
            shutil.rmtree(made)


def _log(res: subprocess.CompletedProcess[str], job: str) -> str:
    return "\n".join(ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith(job))


def test_the_emitted_gitlab_pipeline_builds_each_layer_once_and_publishes_once(
    tmp_path: Path, base_image: tuple[Path, str]
) -> None:
    from imagebuilder.attest.keys import generate
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    assert GITLAB_CI_LOCAL.exists(), "gitlab-ci-local is missing: run ./scripts/setup.sh --test"
    mirror = tmp_path / "mirror"
    for channel in CHANNELS:
        make_standin_release(mirror, load_catalog().channel(channel))
    image, digest = base_image
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    keys, repo = tmp_path / "keys", tmp_path / "repo"
    assert run("repo.keygen", "--dest", str(keys)).code == 0
    init = run("repo.init", "--repo", str(repo), "--keys", str(keys))
    assert init.code == 0, init.err
    root = repo / "metadata" / "1.root.json"
    versions_before = json.loads((repo / "metadata" / "timestamp.json").read_text())["signed"]["version"]

    project = _project(tmp_path)
    emitted = run("build.matrix", "--pairs", "ubuntu:baremetal", "--release-channel", ",".join(CHANNELS),
                  "--baremetal-config", str(config), "--mirror", str(mirror), "--offline", "--engine", "chroot",
                  "--runtime", "os", "--disk-gb", "4", "--min-disk-gb", "5", "--ci-publish", str(repo), "--ci-sign",
                  "--runs-on", "shell", "--emit", "gitlab-ci",
                  "--emit-file", str(project / ".gitlab-ci.yml"))  # fmt: skip
    assert emitted.code == 0, emitted.err
    # the repository's keys as GitLab hands file variables to a job: a path to a file holding the value
    variables = {f"IMAGE_BUILDER_TUF_{role.upper()}_KEY": str(keys / f"{role}.pem")
                 for role in ("targets", "snapshot", "timestamp")}  # fmt: skip
    generate(tmp_path / "build.pem")  # the key every build signs its provenance with
    variables["IMAGE_BUILDER_SIGNING_KEY"] = str(tmp_path / "build.pem")
    (project / ".gitlab-ci-local-variables.yml").write_text(json.dumps(variables))

    first = _pipeline(project)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-6000:]
    for job in ("os-layer-ubuntu-20-04", f"build-ubuntu-baremetal-efi-chroot: [{CHANNELS[0]}]",
                f"build-ubuntu-baremetal-efi-chroot: [{CHANNELS[1]}]", "publish"):  # fmt: skip
        assert f"PASS  {job}" in out, (job, out[-4000:])
    # build.matrix's table: the OS layer column, then the result
    layer = _log(first, "os-layer-ubuntu-20-04")
    assert re.search(r"built\s*│\s*layer", layer), layer[-2000:]
    for channel in CHANNELS:  # each image job built on the layer its needs handed it: no debootstrap, no layer build
        log = _log(first, f"build-ubuntu-baremetal-efi-chroot: [{channel}]")
        assert re.search(r"cached\s*│\s*built", log) and "debootstrap" not in log, log[-3000:]
    # one publish, one new repository version, both images in it: read back with python-tuf (download.image)
    timestamp = json.loads((repo / "metadata" / "timestamp.json").read_text())["signed"]["version"]
    assert timestamp == versions_before + 1, "one new repository version for the pipeline"
    versions = sorted(int(p.name.split(".")[0]) for p in (repo / "metadata").glob("*.targets.json"))
    assert versions == [1, 2], versions  # consistent snapshots: the first, and the pipeline's one new version
    targets = json.loads((repo / "metadata" / "2.targets.json").read_text())["signed"]["targets"]
    images = sorted(t for t in targets if t.endswith(".gz"))
    assert len(images) == 2 and all("v1.2" in t for t in images), sorted(targets)
    for name in images:
        got = run("download.image", "--repo", str(repo), "--root", str(root), "--target", name,
                  "--dest", str(tmp_path / "fetched"))  # fmt: skip
        assert got.code == 0, got.err
    # a rerun of the layer job with unchanged inputs finds the layer in the CI's cache and builds none
    second = _pipeline(project, "os-layer-ubuntu-20-04")
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    relayer = _log(second, "os-layer-ubuntu-20-04")
    assert re.search(r"cached\s*│\s*layer", relayer) and "debootstrap" not in relayer, relayer[-3000:]
    shutil.rmtree(project / ".gitlab-ci-local", ignore_errors=True)
