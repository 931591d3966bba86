"""The test harness's own cross-worker turns (tests.support.common.vm_turn): builds share the machine, the node check
has it alone, and a node check that waits goes before builds that ask after it; and its scheduler
(tests/support/schedule.py): the filler worker runs no module that boots a guest, at a low priority."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.common import ROOT
from tests.support.schedule import HEAVY, NICENESS

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


MODULE = textwrap.dedent(
    """
    import os
    from pathlib import Path


    def test_{n}(tmp_path_factory):
        out = Path(os.environ["SCHEDULE_OUT"])
        (out / f"{{os.path.basename(__file__)}}-{n}-{{os.environ['PYTEST_XDIST_WORKER']}}-{{os.nice(0)}}").touch()
    """
)


def clean_env() -> dict[str, str]:
    """This process's environment without pytest-xdist's worker variables: a run started from a worker must not
    take itself for one (its controller would lower its own priority)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}


def _run_scheduled(suite: Path, out: Path) -> None:
    """The suite in ``suite`` on three workers, the last the filler, as ``invoke test`` runs the real one; each
    test marks what ran where in ``out``."""
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.schedule", "-n", "3", "--filler-worker", "--dist",
         "loadfile", "--no-loadscope-reorder", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)],
        cwd=suite, env={**clean_env(), "PYTHONPATH": str(ROOT), "SCHEDULE_OUT": str(out)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_filler_worker_runs_only_light_modules_at_a_low_priority(tmp_path: Path) -> None:
    """Three workers over four modules that boot guests (named as the real ones) and six light ones: every test runs
    once, the last worker takes only light modules and runs them at nice 10, the others at their own priority; a
    module's tests stay on one worker (--dist loadfile)."""
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    heavy, light = list(HEAVY[:4]), [f"test_light_{i}.py" for i in range(6)]
    for name in heavy + light:
        (suite / name).write_text("".join(MODULE.format(n=n) for n in range(3)))
    base = os.nice(0)
    _run_scheduled(suite, out)
    runs = [p.name.rsplit("-", 3) for p in out.iterdir()]
    assert sorted((m, int(n)) for m, n, _, _ in runs) == sorted((m, n) for m in heavy + light for n in range(3))
    workers = {m: {(w, int(nice)) for mm, _, w, nice in runs if mm == m} for m in heavy + light}
    assert all(len(on) == 1 for on in workers.values()), workers
    filler = {m for m, on in workers.items() if next(iter(on))[0] == "gw2"}
    assert filler and filler <= set(light), workers
    low = min(base + NICENESS, 19)  # nice stops at 19
    assert all(next(iter(on))[1] == (low if m in filler else base) for m, on in workers.items()), workers


TIMED = textwrap.dedent(
    """
    import os, time
    from pathlib import Path


    def test_{n}():
        time.sleep({seconds})
        out = Path(os.environ["SCHEDULE_OUT"])
        (out / f"{{os.path.basename(__file__)}}-{n}-{{os.environ['PYTEST_XDIST_WORKER']}}").touch()
    """
)


def test_a_heavy_worker_takes_its_next_module_only_once_its_own_is_done(tmp_path: Path) -> None:
    """The first heavy module is long after a quick first test; three more heavy ones take 3 s each. xdist would
    hand the first one's worker another heavy module once that quick test ended (two tests left), to wait behind the
    long ones; here the other heavy worker runs all three while the first is busy."""
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    # the collection's order is the files' here (no tests/conftest.py): the long one is the first collected
    heavy, light = sorted(HEAVY[:4]), [f"test_light_{i}.py" for i in range(3)]
    (suite / heavy[0]).write_text("".join(TIMED.format(n=n, seconds=s) for n, s in enumerate((0, 8, 8))))
    for name in heavy[1:]:
        (suite / name).write_text("".join(TIMED.format(n=n, seconds=1) for n in range(3)))
    for name in light:
        (suite / name).write_text("".join(TIMED.format(n=n, seconds=0) for n in range(3)))
    _run_scheduled(suite, out)
    ran = {(m, w) for m, _, w in (p.name.rsplit("-", 2) for p in out.iterdir())}
    first = {w for m, w in ran if m == heavy[0]}
    assert len(first) == 1, ran
    assert {m for m, w in ran if w in first and m in heavy} == {heavy[0]}, sorted(ran)


def test_a_server_that_exits_at_start_fails_at_once_and_one_that_never_answers_fails_at_its_deadline(
    tmp_path: Path,
) -> None:
    """The tests' one startup wait (tests.support.common.wait_until) measures the server, not the machine's load: a
    server that dies is named at once, one that never answers at the deadline, one that answers late is waited for."""
    import pytest

    from tests.support.common import wait_until

    dead = subprocess.Popen(["sh", "-c", "exit 3"])
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"^the server exited at start \(exit 3\)$"):
        wait_until(lambda: False, dead, "the server", timeout=60)
    assert time.monotonic() - started < 10
    silent = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        with pytest.raises(AssertionError, match=r"^the server did not start within 1 s$"):
            wait_until(lambda: False, silent, "the server", timeout=1)
        assert 1 <= time.monotonic() - started < 10
        flag = tmp_path / "ready"
        late = subprocess.Popen(["sh", "-c", f"sleep 2; touch {flag}; sleep 30"])
        wait_until(flag.exists, late, "the late server", timeout=60)
        late.kill()
        late.wait()
    finally:
        silent.kill()
        silent.wait()


def test_a_long_or_failed_phase_is_named_as_it_ends_with_its_worker_and_cpu_time(tmp_path: Path) -> None:
    """tests/support/timeline.py on two workers: a phase past the threshold is a line with the time of day, its
    duration, the worker and the CPU time it took (everything it started included, an orphan too: a test that
    waits spends almost none); a failed phase is a line, whatever its length, with its assertion; a short one is
    none; a module is a line as it ends, with its totals."""
    import re

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a.py").write_text(textwrap.dedent(
        """
        import os, subprocess, sys, time

        BURN = [sys.executable, "-c",
                "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 2.5: pass"]

        def test_burns():
            subprocess.run(BURN, check=True)

        def test_orphans(tmp_path):
            # the burner's parent exits at once: init reaps it, and its time never reaches this process's children
            flag = tmp_path / "done"
            subprocess.run(["sh", "-c", '("$@"; touch "$0") > /dev/null 2>&1 &', str(flag), *BURN], check=True)
            while not flag.exists():
                time.sleep(0.1)

        def test_waits():
            time.sleep(2.5)

        def test_quick():
            pass
        """))  # fmt: skip
    (suite / "test_b.py").write_text(
        "def test_fails():\n    assert 1 + 1 == 3, 'the sum'\n\n"
        "def test_fails_at_length():\n    assert False, '\\n'.join(f'line {n}' for n in range(40)) + '\\nTHE END'\n"
    )
    failed = tmp_path / "failed.txt"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.timeline", "-n", "2", "--dist", "loadfile", "-q",
         "-p", "no:cacheprovider",
         "--rootdir", str(suite), str(suite)],
        cwd=suite, env={**clean_env(), "PYTHONPATH": str(ROOT), "IMAGE_BUILDER_LONG_PHASE": "2",
                        "IMAGE_BUILDER_FAILED_TESTS": str(failed)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    line = r"\[\d\d:\d\d:\d\d\] +(\d+) s call (passed|failed) on gw[01] \(cpu (\d+) s\): test_\w\.py::(\w+)"
    lines = {m[3]: (int(m[0]), m[1], int(m[2])) for m in re.findall(line, res.stdout)}
    assert set(lines) == {"test_burns", "test_orphans", "test_waits", "test_fails", "test_fails_at_length"}, res.stdout
    assert lines["test_burns"][1] == "passed" and lines["test_burns"][2] >= 2, lines
    assert lines["test_orphans"][2] >= 2, "an orphan's time is counted (the worker's own accounting group)"
    assert lines["test_waits"][0] >= 2 and lines["test_waits"][2] == 0, lines
    assert lines["test_fails"][1] == "failed"
    assert "AssertionError: the sum" in res.stdout.split("test_b.py::test_fails", 1)[1].splitlines()[1]
    assert failed.read_text() == "test_b.py::test_fails\ntest_b.py::test_fails_at_length\n"
    # a long message: its first lines and its last, where a program's output ends (its error)
    long = res.stdout.split("test_b.py::test_fails_at_length", 1)[1].split("\n[", 1)[0]
    assert "line 0" in long and "THE END" in long and "line 20" not in long, long
    # and a module, as it ends on its worker: its duration, CPU time and test count
    done = re.findall(r"\] +(\d+) s module done on gw[01] \(cpu (\d+) s, (\d+) tests\): test_a\.py$", res.stdout, re.M)
    assert len(done) == 1 and int(done[0][0]) >= 5 and int(done[0][1]) >= 4 and done[0][2] == "4", res.stdout
