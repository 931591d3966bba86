"""The import graph of start-up (issue 28): ``--list``, a task's ``--help`` and the first error of a bad flag load
only what answering them needs, never the cloud SDKs, pyVmomi, python-tuf or rich (bench/startup.py measures the
CPU time; this keeps the graph from growing back)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.common import ROOT

HEAVY = ("boto3", "botocore", "pyVmomi", "tuf", "securesystemslib", "rich", "jinja2", "pydantic", "cryptography")

PROBE = """
import json, sys
sys.argv = ["image-builder", *json.loads(sys.argv[1])]
from imagebuilder.cli.program import program
try:
    program.run()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}), file=sys.stderr)
"""


def loaded(*args: str) -> tuple[int, set[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


def test_help_loads_the_validation_layer_only() -> None:
    """``build --help`` states the profile's and the host config's facts (the product's release variable, the free
    disk a build needs), read through the one validation layer (pydantic); nothing else heavy (issue 61)."""
    code, modules = loaded("build", "--help")
    assert code == 0
    heavy = sorted(m for m in HEAVY if m in modules and m != "pydantic")
    assert not heavy, f"build --help imported {heavy}"


@pytest.mark.parametrize(
    "args",
    [
        ("--list",),
        ("build", "--os", "nope", "--hypervisor", "baremetal", "--release-channel", "1-34"),
        ("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-34", "--disk-gb", "x"),
        ("build.matrix", "--os", "ubuntu", "--hypervisor", "nope", "--release-channel", "1-34"),
        ("template.validate", "--template", "/DC0/vm/t", "--os", "nope", "--kubernetes", "1.24"),
        ("template.import", "--ova", "x.ova", "--os", "ubuntu", "--kubernetes", "9.99"),
        ("vsphere.setup-user", "-f", "/no/such/user.yaml", "--password", "env:X"),
        ("download.bottlerocket", "--variant", "vsphere", "--kubernetes", "1.24", "--dest", "/dev/null/x"),
        ("ami.export", "--manifest", "/no/such/manifest.json", "--bucket", "b"),
        ("preflight", "--os", "nope", "--hypervisor", "baremetal"),
        ("build", "--vsphere-config", "/no/such.json"),  # the required flags are missing: said before the planner
        ("demo", "--kubernetes", "nope", "--dry-run"),
        ("release.build", "--dest", "/dev/null/x"),
        ("config.schema", "--provider", "nope"),
        ("dhcp.verify", "--timeout", "nope"),
    ],
)
def test_start_up_loads_no_heavy_module(args: tuple[str, ...]) -> None:
    code, modules = loaded(*args)
    assert code in (0, 2), (args, code)
    heavy = sorted(m for m in HEAVY if m in modules)
    assert not heavy, f"{' '.join(args)} imported {heavy}"


def _first_checked_flag(task: str) -> str | None:
    """The flag of ``task`` a bad value is given to: its first choice, number or version flag, else its first."""
    from tests.support.harness import flags_of

    found = flags_of(task)
    ranked = [f for f in found if f.kind in ("choice", "number", "duration", "version")] or found
    return ranked[0].name if ranked else None


def _every_task() -> list[str]:
    from tests.support.harness import NOT_RUN, tasks

    return [t for t in tasks() if t not in NOT_RUN and _first_checked_flag(t)]


@pytest.mark.parametrize("task", _every_task())
def test_every_tasks_bad_flag_is_answered_before_the_heavy_modules_load(task: str) -> None:
    """Generated from the namespace (issue 60): a task added later is held to it without a line here. Its first
    choice, number or version flag given another script's digit and an escape is refused (exit 2) before the cloud
    SDKs, python-tuf, pydantic or the cryptography stack load; bench/startup.py times it."""
    from imagebuilder.cli.flags import flag_kind

    flag = _first_checked_flag(task)
    assert flag is not None
    # a path no OS takes (a name over 255 bytes) for a path; another script's digit and an escape for the rest
    bad = "/" + "n" * 300 if flag_kind(flag) in ("path-in", "path-out", "document", "key") else "٣\x1b[2J"
    code, modules = loaded(task, flag, bad)
    assert code == 2, (task, flag, code)
    heavy = sorted(m for m in HEAVY if m in modules)
    assert not heavy, f"{task} {flag} imported {heavy} before refusing the flag"
