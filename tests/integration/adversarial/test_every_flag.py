"""Every flag of every task attacked with the hostile values of its kind (issue 60), generated from the tasks
themselves: a task or a flag added later is attacked without a test written for it (tests/support/harness.py says
what each run is held to). ``invoke test --quick`` runs a sample: IMAGE_BUILDER_HARNESS_SAMPLE=N keeps every Nth
case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import harness

CASES = harness.cases()
SAMPLE = int(os.environ.get("IMAGE_BUILDER_HARNESS_SAMPLE", "1") or "1")


def _chunks() -> list[list[tuple[harness.Flag, str]]]:
    """The cases of each task together (one folder prepared per task, not per case)."""
    by_task: dict[str, list[tuple[harness.Flag, str]]] = {}
    for i, case in enumerate(CASES):
        if i % SAMPLE == 0:
            by_task.setdefault(case[0].task, []).append(case)
    return list(by_task.values())


@pytest.mark.parametrize("chunk", _chunks(), ids=lambda chunk: chunk[0][0].task)
def test_every_flag_holds_the_guarantees(tmp_path: Path, chunk: list[tuple[harness.Flag, str]]) -> None:
    found: list[str] = []
    harness.prepare(tmp_path / "warm")
    harness.warm(chunk[0][0].task, tmp_path / "warm")
    for flag, value_name in chunk:
        case = tmp_path / f"{len(found)}-{flag.name.strip('-')}-{value_name}"
        harness.prepare(case)
        run = harness.attack(flag, value_name, case)
        found += [f"{flag.task} {flag.name}={value_name}: {p}" for p in harness.problems(run, case)]
    assert not found, "\n".join(found[:40]) + (f"\n... and {len(found) - 40} more" if len(found) > 40 else "")


def test_the_harness_reaches_every_task_and_flag() -> None:
    """Generated, not listed: every task of the namespace (but the developer tasks it names) and every flag that
    takes a value are attacked, each with the generic values and its kind's."""
    from imagebuilder.cli import namespace

    attacked = {(flag.task, flag.name) for flag, _ in CASES}
    with_flags = {t for t in set(namespace.task_names) - set(harness.NOT_RUN) if harness.flags_of(t)}
    assert {t for t, _ in attacked} == with_flags and len(with_flags) >= 40
    assert len(attacked) >= 240  # the 244 valued flags of the 41 user tasks of 2026-12-07, and more with each new one
    per_flag: dict[tuple[str, str], set[str]] = {}
    for flag, value_name in CASES:
        per_flag.setdefault((flag.task, flag.name), set()).add(value_name)
    assert all(set(harness.GENERIC) <= names for names in per_flag.values())
    assert all(set(harness.PATHS) <= per_flag[(f.task, f.name)] for f, _ in CASES if f.kind.startswith("path"))


def test_a_new_flag_gets_a_kind_from_its_name() -> None:
    from imagebuilder.cli.flags import flag_kind

    assert flag_kind("--report-file") == "path-out" and flag_kind("backup_dest") == "path-out"
    assert flag_kind("--vmware-config") == "document" and flag_kind("--proxy-url") == "url"
    assert flag_kind("--signing-key") == "key" and flag_kind("--cache-gb") == "number"
    assert flag_kind("--whatever") == "text"
