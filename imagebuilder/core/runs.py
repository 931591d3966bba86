"""Which run a resource belongs to, and whether that run is gone.

A run is named by its pid and its kernel start time (field 22 of ``/proc/<pid>/stat``): a pid alone may name another
process since (pids are reused), the pair never does. Workspaces, scratch folders and the processes a run starts
carry that name, so that after a SIGKILL, an out-of-memory kill or a power cut (no clean-up handler runs) the next
run can tell what a dead run left from what a live one uses. Kept apart from :mod:`imagebuilder.core.disk`, which
acts on what is found, so that every task can tag its children without importing it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the variable every child of a run inherits: ``<pid>-s<start>`` of the run (:func:`run_tag`)
RUN_ENV = "IMAGE_BUILDER_RUN"


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (state first, start time 20th); empty when no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid``, None when no such process runs."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


def gone(pid: int, start: str | None) -> bool:
    """Whether the run ``pid`` (started at ``start``, when recorded) is gone: no such process, or one that started
    at another time has its pid now."""
    now = start_time(pid)
    return now is None or (start is not None and now != start)


def boot_id() -> str:
    """This boot's ID ("" when unreadable): a run's pid and start time name it within one boot only."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def run_tag() -> str:
    """This process's name as a run: ``<pid>-s<start>``. Set as :data:`RUN_ENV` by every task, so that Packer and
    the QEMU and Ansible it starts, debootstrap or a boot check's QEMU carry it in their environment (a cgroup's job
    without one): an out-of-memory kill ends this process only, its children run on, and the next run finds them."""
    pid = os.getpid()
    return f"{pid}-s{start_time(pid)}"


def tag_owner(tag: str) -> tuple[int, str | None] | None:
    """The run a :func:`run_tag` names: its pid and start time (None when ``tag`` is no such name)."""
    pid, _, start = tag.partition("-s")
    return (int(pid), start if start.isdigit() else None) if pid.isdigit() else None


def daemon_env() -> dict[str, str]:
    """The environment for a service a task starts on purpose to outlive it (``dhcp.install``'s dhcpd where no systemd
    runs): this process's, without the run's tag, so no later run takes the service for a dead run's leftover."""
    return {k: v for k, v in os.environ.items() if k != RUN_ENV}
