"""Every example a task's ``--help`` ends with runs (issue 61): with ``--dry-run`` where the task has one, in a folder
holding the files the examples name (made from config/examples and the flag harness's inputs).

An example that runs whole here exits 0. An example of a task that needs what this test does not make (a vCenter,
Prism, CloudStack, S3, a KMS, a DHCP interface, a real built image beside its SBOM and manifest) must be a whole
command line: it may fail on the server or on what a file holds, never on the command line itself (an unknown flag,
a missing required one, a value the flag does not take). tests/unit/test_help.py checks that every flag an example
names exists on its task."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from imagebuilder.cli import _help as helptext
from imagebuilder.cli import namespace
from tests.support import harness
from tests.support.common import ROOT
from tests.support.inproc import cli

#: tasks whose examples need what this test does not make, and what
REMOTE = {
    "ami.export": "S3 (the bucket is checked)", "attest.public-key": "a KMS",
    "cloudstack.template-register": "CloudStack's API", "dhcp.leases": "the DHCP host's lease file",
    "dhcp.verify": "a DHCP interface", "download.bottlerocket": "the OS-1 TUF repository",
    "download.hook": "the bundle's assets host", "download.image": "the repository's URL",
    "nutanix.image-upload": "Prism Central", "template.customize": "a vCenter", "template.import": "a vCenter",
    "template.tag": "a vCenter", "template.validate": "a vCenter", "vsphere.setup-user": "a vCenter",
    "vsphere.thumbprint": "a vCenter", "mirror.create": "the distro's release host", "image.verify": "a real image",
    "image.diff": "two real images", "image.rebuild": "the mirror its provenance names",
    "dhcp.install": "the DHCP host's packages", "host.clean": "this host's runs",
    "attest.sign": "a build's own provenance", "image.publish": "a built image with its SBOM",
    "release.build": "the Go module proxy",
}  # fmt: skip
#: what an error about the command line itself says (an example must never get one)
COMMAND_LINE_ERRORS = ("No idea what", "required flag missing", "give exactly one of", "is not one of them",
                       "did you mean", "Did you mean", "shapes the emitted pipeline")  # fmt: skip
#: tasks whose examples run the suite or the linters (the suite runs them itself)
NOT_RUN = {"test": "runs the whole suite", "lint": "runs ruff, mypy and ansible-lint over the checkout"}


def _prepare(folder: Path) -> None:
    """The files the examples name, in ``folder``."""
    harness.prepare(folder / "h")
    cfg = folder / "h" / "cfg"
    examples = ROOT / "config" / "examples"
    for name, source in (("vsphere.json", examples / "vsphere-ubuntu.json"), ("bm.json", cfg / "bm.json"),
                         ("dhcp.yaml", cfg / "dhcp.yaml"), ("user.yaml", cfg / "user.yaml"),
                         ("cluster.yaml", cfg / "cluster.yaml"), ("nutanix.json", cfg / "nutanix.json"),
                         ("customize.yaml", cfg / "customize.yaml"),
                         ("signing.pem", cfg / "key.pem"), ("new-targets.pem", cfg / "new-key.pem"),
                         ("ubuntu.ova", cfg / "x.ova")):  # fmt: skip
        shutil.copy2(source, folder / name)
    shutil.copytree(cfg / "keys", folder / "keys")
    shutil.copytree(folder / "h" / "out" / "repo", folder / "repo")
    (folder / "ubuntu.gz").write_bytes(b"")
    (folder / "ubuntu.gz.sha256").write_text(f"{hashlib.sha256(b'').hexdigest()}  ubuntu.gz\n")
    statement = json.loads((cfg / "p.intoto.json").read_text())
    (folder / "ubuntu.gz.intoto.json").write_text(json.dumps(statement).replace('"i.gz"', '"ubuntu.gz"'))
    shutil.copy2(folder / "repo" / "metadata" / "1.root.json", folder / "root.json")
    (folder / "rebuild").mkdir()
    (folder / "rebuild" / "ubuntu.gz").write_bytes(b"")
    (folder / "output").mkdir()
    shutil.copy2(cfg / "packer-manifest.json", folder / "output" / "packer-manifest.json")


def _examples() -> list[tuple[str, str]]:
    return [(task, helptext.render(e)) for task in sorted(namespace.task_names) if task not in NOT_RUN
            for e in helptext.examples(namespace[task].__doc__)]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("examples")
    _prepare(top)
    return top


@pytest.mark.parametrize(("task", "example"), _examples(), ids=lambda v: v if " " not in v else None)
def test_every_example_in_help_runs(folder: Path, task: str, example: str) -> None:
    args = example.split()[1:]
    if harness.has_dry_run(task) and "--dry-run" not in args:
        args.append("--dry-run")
    env = {**harness.ENV, "HOME": str(folder / "h" / "home"), "XDG_CACHE_HOME": str(folder / "h" / "home" / ".cache")}
    outcome = cli(*[a.strip("'") for a in _shell_words(" ".join(args))], env=env, cwd=folder)
    if task in REMOTE:
        wrong = [e for e in COMMAND_LINE_ERRORS if e in outcome.text]
        assert not wrong, f"{example} (needs {REMOTE[task]}): its command line is refused\n{outcome.text[-600:]}"
        assert "internal error" not in outcome.text and outcome.code in (0, 1, 2), outcome.text[-600:]
    else:
        assert outcome.code == 0, f"{example}: exit {outcome.code}\n{outcome.text[-600:]}"


def _shell_words(text: str) -> list[str]:
    import shlex

    return shlex.split(text)
