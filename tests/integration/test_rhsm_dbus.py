"""The Satellite activation key goes to rhsmd over D-Bus, never on a command line (issue 16).

The real redhat_subscription role runs with the real ansible-playbook against a real dbus-daemon, where a
stand-in for rhsmd's documented D-Bus API (tests/support/rhsm_dbus.py, a contract stand-in: no RHSM runs here)
records what it receives and which processes hold the key in their argv while it is registering."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.common import BIN, ROOT, stop, wait_until

KEY = "ak-Dbus-Secret-Marker-6620"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-dbus and python3-gi (the setup installs them)


@pytest.fixture
def rhsm(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    address = f"unix:path={tmp_path / 'bus'}"
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", f"--address={address}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_until((tmp_path / "bus").exists, daemon, "dbus-daemon")
    record = tmp_path / "record.json"
    fake = subprocess.Popen([SYSTEM_PYTHON, str(ROOT / "tests/support/rhsm_dbus.py"), address, str(record)],
                            env={**os.environ, "RHSM_EXPECTED_KEY": KEY}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready", fake.stderr
        yield address, record
    finally:
        for proc in (fake, daemon):
            stop(proc)


def run_role(tmp_path: Path, address: str, key: str) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "register.yml"
    playbook.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n"
        f"  vars: {{ansible_python_interpreter: {SYSTEM_PYTHON}}}\n"
        "  roles:\n    - role: redhat_subscription\n      vars:\n        redhat_subscription_state: present\n"
        "        redhat_subscription_method: activation_key\n        redhat_subscription_org_id: Example_Org\n"
    )
    env = {**os.environ, "RHSM_ACTIVATION_KEY": key, "DBUS_SYSTEM_BUS_ADDRESS": address,
           "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"), "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_activation_key_reaches_rhsm_over_dbus_and_no_argv(rhsm: tuple[str, Path], tmp_path: Path) -> None:
    address, record = rhsm
    res = run_role(tmp_path, address, KEY)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    seen = json.loads(record.read_text())
    assert seen["org"] == "Example_Org" and seen["keys"] == [KEY]
    assert seen["options"] == {} and seen["connection_options"] == {}
    assert seen["argv_holders"] == [], "while registering, no process had the key in its command line"
    assert seen["started"] and seen["stopped"], "the private registration bus was started and stopped"
    assert KEY not in res.stdout + res.stderr


def test_a_refused_key_fails_with_rhsms_message_and_not_the_key(rhsm: tuple[str, Path], tmp_path: Path) -> None:
    address, record = rhsm
    wrong = "ak-Wrong-Marker-0042"
    res = run_role(tmp_path, address, wrong)
    assert res.returncode != 0
    assert json.loads(record.read_text())["stopped"], "Stop runs even when the registration fails"
    assert wrong not in res.stdout + res.stderr
    assert "censored" in res.stdout, "no_log hides the failing task's details, message included"
