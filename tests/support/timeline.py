"""What a run's log says as it goes (a plugin: tests/conftest.py takes its hooks, the harness's tests load it with
``-p tests.support.timeline``): every test phase of a minute or more, or failed, as it ends, with the time of day,
the worker and the CPU time it took, so a run the CI stops at its deadline still shows where its time went; and the
failed tests' names in a file ``invoke test`` prints last."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: the tests that failed in this run, written where ``$IMAGE_BUILDER_FAILED_TESTS`` says (``invoke test`` names them
#: last, after pytest's report: a CI log's tail then says which tests failed however long their reports are)
_FAILED: list[str] = []


#: a phase of a test (its setup, call or teardown) this long, or failed, is named as it ends, with the time of day: the
#: CI's log then shows where a run's time went, and what failed, even when the run is stopped before pytest's list of
#: the slowest tests and its failure reports
LONG_PHASE = float(os.environ.get("IMAGE_BUILDER_LONG_PHASE", "60"))  # the harness test sets it lower


#: the cgroup v1 CPU accounting hierarchy: a worker and everything it starts is counted there, orphans included
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
#: this process's own accounting group, when it could make one
_GROUP: list[Path] = []


def _account_in_own_group() -> None:
    """Move this process into a CPU accounting group of its own (children inherit it): a Packer build's QEMU runs
    under a plugin process that is killed at the end, and a killed run's QEMU is orphaned, so neither reaches this
    process's reaped-children time (a Packer test showed 23 s of CPU for 431 s of booting). Without a writable
    hierarchy, the reaped children's time it is."""
    group = CPUACCT / "image-builder-tests" / str(os.getpid())
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    _GROUP[:] = [group]


def _leave_own_group() -> None:
    if _GROUP:
        try:
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            _GROUP[0].rmdir()  # fails while an orphan of a test still runs in it: left for the next run's sweep
        except OSError:
            pass


def _cpu_seconds() -> float:
    """The CPU time of this worker and of everything it started (its accounting group's), or else of the children
    it has reaped: a phase's share of the machine, where its duration also counts the waiting beside other workers."""
    if _GROUP:
        try:
            return int((_GROUP[0] / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            pass
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    started = item.stash.get(_PHASE_CPU, None)
    if started is not None:
        report.user_properties.append(("cpu", round(_cpu_seconds() - started, 1)))


def _phase_begins(item: pytest.Item) -> Iterator[None]:
    """Each phase (setup, call, teardown) notes the CPU time it begins at."""
    item.stash[_PHASE_CPU] = _cpu_seconds()
    yield


pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_phase_begins)
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_phase_begins)
pytest_runtest_teardown = pytest.hookimpl(hookwrapper=True)(_phase_begins)


#: where a test phase's CPU time began (the makereport hook reads it)
_PHASE_CPU = pytest.StashKey[float]()
#: a module this long, or this much CPU time, is named when it ends (the light ones add up: their sum is the run's)
LONG_MODULE = LONG_PHASE / 6


class _Module:
    """A module under way on one worker, as the controller sees its reports (xdist's loadfile runs a module on one
    worker, its tests in a row: the worker's first report of another module means this one is done)."""

    def __init__(self, name: str, start: float) -> None:
        self.name, self.start, self.stop, self.cpu, self.tests = name, start, start, 0.0, 0

    def add(self, report: pytest.TestReport) -> None:
        cpu = dict(report.user_properties).get("cpu")
        self.cpu += cpu if isinstance(cpu, int | float) else 0.0
        self.stop = max(self.stop, report.stop)
        self.tests += report.when == "setup"

    def line(self, where: str) -> str:
        import time

        wall = self.stop - self.start
        return (f"[{time.strftime('%H:%M:%S', time.localtime(self.stop))}] {wall:5.0f} s module done{where} "
                f"(cpu {self.cpu:.0f} s, {self.tests} tests): {self.name}")  # fmt: skip


#: the module each worker is running (by worker id; "main" without xdist)
_RUNNING: dict[str, _Module] = {}


def _module_done(module: _Module, worker: str) -> None:
    if _REPORTER and max(module.stop - module.start, module.cpu) >= LONG_MODULE:
        _REPORTER[0].write("\n")
        _REPORTER[0].write_line(module.line(f" on {worker}" if worker != "main" else ""))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)
    worker = getattr(getattr(report, "node", None), "gateway", None)
    key = worker.id if worker is not None else "main"
    if (report.duration >= LONG_PHASE or report.failed) and _REPORTER:
        import time

        where = f" on {key}" if worker is not None else ""
        _REPORTER[0].write("\n")  # xdist's progress dots leave the line open
        cpu = dict(report.user_properties).get("cpu")
        spent = f" (cpu {cpu:.0f} s)" if isinstance(cpu, int | float) else ""
        _REPORTER[0].write_line(
            f"[{time.strftime('%H:%M:%S')}] {report.duration:5.0f} s {report.when} {report.outcome}{where}{spent}: "
            f"{report.nodeid}"
        )
        if report.failed:  # why, in a few lines: the full report comes at the end, if the run gets there
            # its first lines (the assertion) and its last (where a long message, a program's output, ends: its error)
            said = [line for line in report.longreprtext.splitlines() if line.startswith("E ")]
            why = said if len(said) <= 12 else [*said[:4], "E     ...", *said[-8:]]
            for line in why or report.longreprtext.splitlines()[-3:]:
                _REPORTER[0].write_line(f"    {line[:300]}")
    name = report.nodeid.split("::", 1)[0]
    running = _RUNNING.get(key)
    if running is None or running.name != name:
        if running is not None:
            _module_done(running, key)
        running = _RUNNING[key] = _Module(name, report.start)
    running.add(report)


#: the controller's terminal reporter (pytest_runtest_logreport writes the long phases through it)
_REPORTER: list[pytest.TerminalReporter] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_controller(session):
        _sweep_empty_groups()
        _account_in_own_group()
    if not hasattr(session.config, "workerinput"):  # the controller: the workers' output is not the log's
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            _REPORTER[:] = [reporter]


def _is_controller(session: pytest.Session) -> bool:
    """Whether this process is xdist's controller, which runs no test (without xdist the one process runs them)."""
    return not hasattr(session.config, "workerinput") and session.config.getoption("numprocesses", None) not in (
        None,
        0,
    )


def _sweep_empty_groups() -> None:
    """Remove the accounting groups of earlier runs' workers that no process is in any more."""
    for group in (CPUACCT / "image-builder-tests").glob("[0-9]*"):
        try:
            if not (group / "cgroup.procs").read_text().strip():
                group.rmdir()
        except OSError:
            pass


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _is_controller(session):
        _leave_own_group()
    if hasattr(session.config, "workerinput"):  # a worker: the controller sees every worker's reports and reports
        return
    for key, running in sorted(_RUNNING.items()):
        _module_done(running, key)
    where = os.environ.get("IMAGE_BUILDER_FAILED_TESTS")
    if where:
        Path(where).write_text("".join(f"{n}\n" for n in _FAILED))
