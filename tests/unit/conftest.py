"""The rule of tests/unit/, enforced: a unit test runs in this process only. It starts no program (no CLI as a
subprocess, no Packer, qemu-img, dhcpd or shell) and opens no socket (no server, not even on 127.0.0.1), needs no root,
no network namespace, no guest and no vcsim, and carries none of their markers. Such a test is quick by construction,
so ``invoke test --quick`` (this folder) stays the edit-test loop; a test that needs any of these belongs in
tests/integration/, where the real components run. A unit test that tries one fails, naming the rule."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

RULE = "a unit test starts no program and opens no socket: move it to tests/integration/ (tests/unit/conftest.py)"


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError(RULE)


@pytest.fixture(autouse=True)
def _in_process_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket.socket, "bind", _refuse)
    yield
