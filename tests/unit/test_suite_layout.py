"""The layout of tests/ is its rule (docs/testing.md): tests/unit/ holds the in-process tests, the edit-test loop
(``invoke test --quick``), and tests/integration/ the ones that run the real components. This test times nothing: it
lists the markers pytest gave every collected test, including those tests/conftest.py adds by module and by fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.cli.dev import HEAVY_MARKERS
from tests.support.common import ROOT

UNIT = ROOT / "tests" / "unit"


def test_no_unit_test_carries_a_heavy_marker(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    unit = [item for item in items if Path(str(item.path)).is_relative_to(UNIT)]
    assert request.node in unit, "this test sees the session's collected tests"
    heavy = sorted({f"{item.nodeid} ({mark.name})" for item in unit for mark in item.iter_markers()
                    if mark.name in HEAVY_MARKERS})  # fmt: skip
    assert heavy == [], "a test that needs root, a namespace, a guest, vcsim or a long run goes in tests/integration/"


def test_every_test_module_is_in_a_folder_of_its_kind() -> None:
    """No test module left at the top of tests/ or in a folder that is not a kind (support code is not tests)."""
    modules = sorted(p.relative_to(ROOT / "tests") for p in (ROOT / "tests").rglob("test_*.py"))
    assert modules and all(m.parts[0] in ("unit", "integration") for m in modules), modules
    assert (UNIT / "adversarial").is_dir() and (ROOT / "tests" / "integration" / "adversarial").is_dir()


def test_the_guard_refuses_a_program_and_a_socket() -> None:
    """tests/unit/conftest.py makes the rule hold: starting a program or opening a socket fails the test."""
    import socket
    import subprocess

    with pytest.raises(AssertionError, match="tests/integration"):
        subprocess.run(["true"], check=False)
    with socket.socket() as sock, pytest.raises(AssertionError, match="tests/integration"):
        sock.connect(("127.0.0.1", 9))


def test_every_import_of_the_suite_and_the_benchmarks_resolves() -> None:
    """Every ``from tests... import`` and ``from imagebuilder... import`` in tests/ and bench/, the lazy ones inside
    fixtures included, names a module and names that exist: a helper moved or a module replaced breaks this test
    in seconds rather than a fixture's setup deep in an end-to-end run (a support module overwritten by the split
    of issue 47 did that)."""
    import ast
    import importlib

    missing = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.split(".")[0] not in ("tests", "imagebuilder"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ModuleNotFoundError:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    assert missing == []


def test_a_fixture_s_local_shortcut_is_refused_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """IMAGE_BUILDER_TEST_BASE_IMAGE and its kind skip a fixture's kill-and-rerun and its image checks: under CI they
    fail the test, naming the variable; locally they give their value."""
    from tests.support.common import local_shortcut

    for name in ("IMAGE_BUILDER_TEST_BASE_IMAGE", "IMAGE_BUILDER_TEST_ARM64_BASE"):
        monkeypatch.setenv(name, "/srv/base.qcow2")
        monkeypatch.delenv("CI", raising=False)
        assert local_shortcut(name) == "/srv/base.qcow2"
        monkeypatch.setenv("CI", "true")
        with pytest.raises(pytest.fail.Exception, match=name):
            local_shortcut(name)
        monkeypatch.delenv(name)
        assert local_shortcut(name) is None, "unset, there is nothing to refuse"
