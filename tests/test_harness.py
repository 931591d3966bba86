"""The test harness's own cross-worker turns (tests.support.common.vm_turn): builds share the machine, the node check
has it alone, and a node check that waits goes before builds that ask after it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.common import ROOT

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from tests.support.common import SHARED, vm_turn
    shared, name, alone, hold = Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "alone", float(sys.argv[5])
    SHARED[:] = [shared]
    log = shared / "log"
    with vm_turn(alone=alone):
        with log.open("a") as fh:
            fh.write(f"{name} start {time.monotonic()}\\n")
        time.sleep(hold)
        with log.open("a") as fh:
            fh.write(f"{name} end {time.monotonic()}\\n")
    """
)


def _holder(shared: Path, name: str, mode: str, hold: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(ROOT), str(shared), name, mode, str(hold)])


def _events(shared: Path) -> dict[tuple[str, str], float]:
    lines = (shared / "log").read_text().split("\n")
    return {(n, e): float(t) for n, e, t in (line.split() for line in lines if line)}


def _started(shared: Path, name: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (shared / "log").exists() and f"{name} start" in (shared / "log").read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never started")


def test_shared_turns_overlap_and_an_alone_turn_waits_for_them_and_goes_first(tmp_path: Path) -> None:
    first = _holder(tmp_path, "build-1", "shared", 3)
    _started(tmp_path, "build-1")
    second = _holder(tmp_path, "build-2", "shared", 1)
    _started(tmp_path, "build-2")  # two builds at once: shared turns do not wait for each other
    check = _holder(tmp_path, "nodecheck", "alone", 1)
    time.sleep(1)  # the node check waits for both builds
    late = _holder(tmp_path, "build-3", "shared", 0.1)  # asked after the node check: goes after it
    for proc in (first, second, check, late):
        assert proc.wait(timeout=60) == 0
    ev = _events(tmp_path)
    assert ev[("build-2", "start")] < ev[("build-1", "end")], "shared turns overlap"
    assert ev[("nodecheck", "start")] >= max(ev[("build-1", "end")], ev[("build-2", "end")]), "alone means alone"
    assert ev[("build-3", "start")] >= ev[("nodecheck", "end")], "a waiting alone turn is not starved"
