"""The modern Packers (1.9.4, 1.16.0) and their plugins, as ../shared/tools/build-packer.sh builds them from the
release sources (``./scripts/setup.sh --test`` does, into ~/.cache/packer-from-source), and the plugin floors that
scripts/build_plugin_floors.py builds from the Go module proxy (the same setup step). A test that needs them skips on
a developer's machine without them, and fails in CI (``CI=true``), where they must be there. A folder that holds only
some of them (the shared script builds a subset with ``--plugins``) counts as missing, naming what is missing and the
command that completes it, never as a cause of other failures."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagebuilder.builder.packer_plugins import PLUGINS, TESTED_PACKERS, requirements_for
from tests.support.common import ROOT

MODERN = TESTED_PACKERS[1:]  # Debian's 1.6.6 is the first
#: where ./scripts/setup.sh --test builds them (overridable: IMAGE_BUILDER_PACKERS, IMAGE_BUILDER_PLUGIN_FLOORS)
PACKERS = Path(os.environ.get("IMAGE_BUILDER_PACKERS", Path.home() / ".cache/packer-from-source"))
FLOORS = Path(os.environ.get("IMAGE_BUILDER_PLUGIN_FLOORS", Path.home() / ".cache/image-builder/packer-plugin-floors"))


#: what completes the folders (it builds only what is missing: a partial cache is completed, a whole one reused)
SETUP = "./scripts/setup.sh --test"


def _need(path: Path, what: str, *names: str) -> Path:
    """``path``, when it holds every one of ``names``; else the test fails in CI and skips elsewhere, naming what is
    missing and the command that completes it."""
    missing = [name for name in names if not (path / name).exists()]
    if not missing:
        return path
    message = f"{what} missing at {path} ({', '.join(missing)}): run {SETUP}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def packer(version: str) -> Path:
    """The path of Packer ``version`` built from its release source."""
    return _need(PACKERS / "bin", f"Packer {version}", f"packer-{version}") / f"packer-{version}"


def newest_plugins() -> Path:
    """The folder of the newest plugins (the releases in ../shared/packer-src), as --packer-plugins takes it."""
    return _need(PACKERS / "plugins", "the newest Packer plugins", *_plugin_files())


def floor_plugins() -> Path:
    """The folder of the plugins at the versions the templates' required_plugins floors name."""
    return _need(FLOORS, "the floor Packer plugins", *_plugin_files())


def _plugin_files() -> list[str]:
    """Every plugin a template requires, binary and source address: a folder without one of them is not whole."""
    return [f for r in requirements_for(PLUGINS) for f in (f"packer-plugin-{r.type}", f"{r.type}.source")]


#: how a line of a build's output says Ansible begins a task (the ansible plugin's and the chroot engine's output)
TASK = "TASK ["


@dataclass
class Interrupted:
    """A build a user interrupted: its process (whose tag its children carry), exit code, output, tasks begun."""

    pid: int
    code: int
    output: str
    tasks: list[str]


def ctrl_c_at(
    argv: list[str], env: dict[str, str], *, at: str = TASK, count: int = 1, ready: Callable[[], bool] | None = None
) -> Interrupted:
    """Run ``argv`` in a process group of its own (as a terminal runs a job), read its output up to the ``count``-th
    line that holds ``at`` (by default the line that begins an Ansible task), wait there until ``ready()`` (when
    given: what the test checks of the running build must have been seen), and press Ctrl-C (SIGINT to the group,
    as the terminal sends it). The tasks begun are the text after ``TASK [``; a build that ends before that line
    fails the test."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    tasks: list[str] = []
    found = 0
    for line in proc.stdout:
        seen.append(line)
        if TASK in line:
            tasks.append(line.split(TASK, 1)[1].strip())
        found += at in line
        if found == count:
            break
    else:
        raise AssertionError(f"the build ended before {at!r} ({count}): {proc.wait()}\n{''.join(seen[-40:])}")
    deadline = time.monotonic() + 120
    while ready is not None and not ready():
        assert proc.poll() is None and time.monotonic() < deadline, "".join(seen[-40:])
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.stdout.read()
    code = proc.wait(timeout=300)
    proc.stdout.close()
    return Interrupted(proc.pid, code, "".join(seen) + rest, tasks)
