"""The package installs as a wheel and works away from the checkout: the template bundle travels inside it, and
`lint` checks the templates it ships."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.common import ROOT

pytestmark = pytest.mark.slow

BUNDLE = ("packer", "ansible", "templates", "cloud-init", "config")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel built from this checkout (a regular, non-editable build) and its files installed in a folder."""
    base = tmp_path_factory.mktemp("wheel")
    dist, target = base / "dist", base / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return wheel, target


def _run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # the installed copy comes first on the path, ahead of this checkout's editable install
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run(
        [sys.executable, "-c", "from imagebuilder.cli.program import main; main()", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_carries_every_bundle_file(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in BUNDLE:
        shipped = sorted(
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")
        )
        assert shipped, folder
        missing = [name for name in shipped if f"imagebuilder/_bundle/{name}" not in names]
        assert not missing, f"not in the wheel: {missing[:5]}"


def test_installed_package_runs_outside_the_checkout(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, target = installed
    where = _run(target, tmp_path, "--version")
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import imagebuilder, imagebuilder.core.paths as p; print(imagebuilder.__file__, p.BUNDLE)",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found[0].startswith(str(target)), found
    assert found[1] == str(target / "imagebuilder" / "_bundle"), found
    assert where.returncode == 0, where.stderr

    plan = _run(target, tmp_path, "build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
                "--dry-run")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert "packer: qemu builder" in plan.stdout
    assert not list(tmp_path.iterdir()), "a dry run created files"

    schema = _run(target, tmp_path, "config.schema", "--provider", "vsphere")
    assert schema.returncode == 0, schema.stderr
    assert '"vcenter_server"' in schema.stdout

    # lint checks the templates the package ships (source checks need a checkout)
    lint = _run(target, tmp_path, "lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "skipped" in lint.stdout
    # the seven pairs, and the bare-metal one for arm64 too
    assert lint.stdout.count(" ok") == 8 and "baremetal   arm64  ok" in lint.stdout, lint.stdout

    tests = _run(target, tmp_path, "test")
    assert tests.returncode == 2
    assert "works on a checkout of the repository" in tests.stderr
