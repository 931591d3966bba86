"""How `invoke test` spreads the test modules over pytest-xdist's workers: a worker per core for the modules that boot
emulated guests or build images, and one more, at a low CPU priority, for the rest.

Why: under TCG the guests keep every core busy for most of a run, and the rest of the suite is mostly waiting (DHCP
leases, vcsim, SSH timeouts against guests that never come). Run after the guests on the same workers, that waiting
left a core idle for much of the last quarter of a run. A third worker at normal priority was measured too: it took
a third guest beside the two builds and slowed every guest far beyond its share (docs/testing.md). The filler worker
takes no module of :data:`HEAVY`, and its processes run at nice 10, so a busy core gives it a tenth of its time
and an idle one all of it: the waiting happens beside the guests instead of after them.

The scheduler is xdist's own ``--dist loadfile`` (one module per worker at a time, in the collection's order) with
one rule added: the filler takes only modules outside :data:`HEAVY`, the other workers take the heavy ones first.
The hooks below are tests/conftest.py's (and a plugin of their own, ``-p tests.support.schedule``, for the test of
this scheduler).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

#: the modules that boot emulated guests, build images or keep a core busy for minutes, longest first (the order
#: the workers start them in), and the harness's own tests (they time processes against each other): only the
#: workers at normal priority run them. (Not the filler, even once it has nothing else: while two guests keep the
#: cores busy, a tenth of a core would stretch these past their timeouts.) The arm64 module goes second: it needs
#: no amd64 base image, so its worker builds while the first makes that image (the modern Packers' module, second
#: before, waited minutes for it).
HEAVY = (
    "test_e2e_offline.py",
    "test_arm64.py",
    "test_hardening.py",
    "test_e2e_packers.py",
    "test_customize_guest.py",
    "test_chroot_engine.py",
    "test_ci_pipeline.py",
    "test_reproducible.py",
    "test_fault_injection.py",
    "test_repository_kills.py",
    "test_hostprep.py",
    "test_packer_versions.py",
    "test_bootcheck.py",
    "test_emulated_boot.py",
    "test_wheel.py",
    "test_harness.py",
)
#: how much lower the filler's priority is (nice): under CFS a nice-10 thread beside a nice-0 one gets about a tenth
NICENESS = 10


def is_filler_process() -> bool:
    """Whether this pytest process is the filler worker of a run with ``--filler-worker`` (the last worker)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    return bool(worker and count.isdigit() and worker == f"gw{int(count) - 1}")


def _module(scope: str) -> str:
    return scope.rsplit("/", 1)[-1]


class FillerScheduling(LoadFileScheduling):
    """``--dist loadfile`` whose last worker (the filler) takes only the modules outside :data:`HEAVY`."""

    def _is_filler(self, node: Any) -> bool:
        return bool(node.gateway.id == f"gw{len(self.nodes) - 1}") and len(self.nodes) > 1

    def _assign_work_unit(self, node: Any) -> None:
        filler = self._is_filler(node)
        light = next((s for s in self.workqueue if _module(s) not in HEAVY), None)
        heavy = None if filler else next((s for s in self.workqueue if _module(s) in HEAVY), None)
        scope = heavy or light
        if scope is None:  # the filler, with only heavy modules left
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        """xdist's, except that a worker at normal priority takes its next module only with one test of its own left.

        xdist hands a worker another module as soon as two of its tests are left, ahead of time. A heavy module then
        waited behind an hour-long one on its worker while another worker fell idle: the modern Packers' module,
        handed to the offline test's worker when its first quick test ended, started 40 minutes late (seen in a
        local CI run on 2026-11-30). One test left is as late as it can be: a worker holds its last test back until
        it knows what comes next (or that nothing does), for the fixtures' teardown."""
        if not self._is_filler(node) and not node.shutting_down and self._pending_of(self.assigned_work[node]) > 1:
            return
        super()._reschedule(node)

    def mark_test_complete(self, node: Any, item_index: int | str, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        # the filler waits for light modules without tests of its own to complete: look at it whenever another
        # worker completes one (a light module may be next, or nothing may be left for it at all)
        for other in self.nodes:
            if other is not node and self._is_filler(other) and not self._pending_of(self.assigned_work.get(other, {})):
                self._reschedule(other)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--filler-worker",
        action="store_true",
        help="with -n N --dist loadfile: the last worker runs only the modules outside the heavy ones, at a low CPU "
        "priority (tests/support/schedule.py)",
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FillerScheduling | None:
    if config.getoption("filler_worker") and config.getoption("dist", None) == "loadfile":
        return FillerScheduling(config, log)
    return None


def pytest_configure(config: pytest.Config) -> None:
    """In the filler worker, lower this process's priority (its children, image-builder, vcsim and the DHCP
    servers among them, inherit it)."""
    if config.getoption("filler_worker") and is_filler_process():
        os.nice(NICENESS)
