"""The library's shape: layers import one way only, and shared code asks the provider registry."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from invoke.collection import Collection

from imagebuilder.cli import build
from imagebuilder.providers import registry
from imagebuilder.release.catalog import load_catalog
from tests.support.common import ROOT
from tests.support.imports import cycles, import_graph

PACKAGE = ROOT / "imagebuilder"


def test_no_import_cycles() -> None:
    graph = import_graph(PACKAGE, "imagebuilder")
    assert "imagebuilder.core.fetch" in graph and graph["imagebuilder.release.mirror"]  # the graph is really read
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b  # lazy imports count\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n")
    (pkg / "c.py").write_text("from .sub.b import x\nfrom . import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == set()  # TYPE_CHECKING never runs
    assert cycles(graph) == []
    (pkg / "sub" / "b.py").write_text("import pkg.c\n")
    assert cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def private_imports(root: Path, name: str) -> list[str]:
    """``from a.b import _x`` anywhere under ``root`` where ``_x`` is another module's private name: only a private
    submodule of the importer's own package (``from pkg.cli import _common`` in ``pkg/cli/``) is its to take."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        package = ".".join(rel.parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == name:
                folder = root.parent / node.module.replace(".", "/")
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    submodule = (folder / f"{alias.name}.py").is_file() or (folder / alias.name).is_dir()
                    if private and not (node.module == package and submodule):
                        found.append(f"{rel}: from {node.module} import {alias.name}")
    return found


def test_no_module_takes_another_modules_private_names(tmp_path: Path) -> None:
    """Issue 47: a private name is its module's to change; a caller that needs it asks for a public one."""
    assert private_imports(PACKAGE, "imagebuilder") == []
    pkg = tmp_path / "pkg"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "_common.py").write_text("def _helper(): ...\n")
    (pkg / "cli" / "build.py").write_text("from pkg.cli import _common\n")  # its own package's private module
    (pkg / "core.py").write_text("def _get(): ...\n")
    (pkg / "cli" / "fetch.py").write_text("def f():\n    from pkg.core import _get, __version__\n")
    (pkg / "other.py").write_text("from pkg.cli._common import _helper\nfrom pkg.cli import _common\n")
    assert private_imports(pkg, "pkg") == [
        "pkg/cli/fetch: from pkg.core import _get",
        "pkg/other: from pkg.cli._common import _helper",
        "pkg/other: from pkg.cli import _common",
    ]


#: the capability packages, lowest first: each imports only itself and the packages before it (its docstring says
#: so); above them only the docs generator and the command line
LAYERS = ("core", "release", "attest", "publish", "customization", "image", "hardening", "vsphere", "plan",
          "providers", "builder", "host", "flows")  # fmt: skip


def test_each_package_imports_only_the_packages_below_it() -> None:
    graph = import_graph(PACKAGE, "imagebuilder")
    for level, package in enumerate(LAYERS):
        allowed = {f"imagebuilder.{p}" for p in LAYERS[: level + 1]}
        allowed_root = {"imagebuilder"}  # the package itself: its version only
        modules = [m for m in graph if m.startswith(f"imagebuilder.{package}.")]
        assert len(modules) >= 2, f"{package}: the graph is really read"
        for module in modules:
            above = {
                m for m in graph[module] - allowed_root if not any(m == a or m.startswith(f"{a}.") for a in allowed)
            }
            assert not above, f"{module} imports {above}, above {package}"
        doc = " ".join((PACKAGE / package / "__init__.py").read_text().split())  # wrapped lines read as one
        assert "May import: " + (", ".join(f"``{p}``" for p in LAYERS[:level]) or "nothing") in doc, package
    # the vSphere connection is below its facade and the clients built on it
    below = {m for m in graph["imagebuilder.vsphere.connection"] if not m.startswith("imagebuilder.core.")}
    assert below <= {"imagebuilder.release.profile", "imagebuilder.release.catalog"}, below


def test_the_generated_layer_table_is_the_packages_own_declarations() -> None:
    """docs/architecture.md's layer table is generated from the packages' ``May import:`` lines (issue 47): they
    declare the order LAYERS holds the imports to, so the table cannot drift from the code."""
    from imagebuilder.docs import layers, packages_table

    declared = layers()
    assert [name for name, _, _ in declared] == list(LAYERS)
    assert all(below == list(LAYERS[:level]) for level, (_, below, _) in enumerate(declared))
    table = packages_table()
    assert all(f"| `imagebuilder/{name}/` |" in table for name in LAYERS) and ":mod:" not in table


def test_the_layer_rule_finds_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for sub in ("core", "image"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "image" / "qemu.py").write_text("from pkg.core import files\n")
    (pkg / "core" / "files.py").write_text("def f():\n    from pkg.image import qemu  # upward, lazily\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.core.files"] == {"pkg.image.qemu"} and graph["pkg.image.qemu"] == {"pkg.core.files"}


def test_every_provider_of_the_catalog_is_one_registered_unit() -> None:
    assert set(registry.PROVIDERS) == set(load_catalog().providers)
    for name, provider in registry.PROVIDERS.items():
        assert provider.name == name and provider.config_model.provider == name
        assert (PACKAGE.parent / "packer" / provider.builder / "node.pkr.hcl.j2").is_file()
        assert f"{name}_config" in inspect.signature(build.build.body).parameters, f"no build --{name}-config"
    for pair in load_catalog().builds:  # lint renders and validates each pair from its example
        example = PACKAGE.parent / "config" / "examples" / f"{pair.provider.name}-{pair.os.name}.json"
        assert pair.config == "optional" or example.is_file(), example


def test_shared_code_never_branches_on_a_provider_name() -> None:
    """Outside imagebuilder/providers/, no provider compared with a name and no isinstance on a config model."""
    names = set(registry.PROVIDERS)
    models = {p.config_model.__name__ for p in registry.PROVIDERS.values()}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "providers" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                parts = list(ast.walk(node))
                consts = {c.value for c in parts if isinstance(c, ast.Constant)}
                about_provider = any("provider" in ast.unparse(p).lower() for p in [node.left, *node.comparators])
                if about_provider and consts & (names | {"ami"}):
                    found.append(where)
            called = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
            if called and any(getattr(a, "id", None) in models for a in ast.walk(node)):
                found.append(where)
    assert found == []


def test_every_task_module_is_collected_the_same_way() -> None:
    """One module per namespace: each public module of imagebuilder/cli/ (but the flag layer and the program) is
    collected whole, top-level or as the namespace of its own name, and the namespace holds nothing else."""
    from imagebuilder import cli

    helpers = {"flags", "program"}
    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py") if not p.stem.startswith("_")}
    collected = {m.__name__.rpartition(".")[2] for m in (*cli.TOP_LEVEL, *cli.NAMESPACES)}
    assert modules - helpers == collected
    assert set(cli.namespace.collections) == {m.__name__.rpartition(".")[2] for m in cli.NAMESPACES}
    top = {name for m in cli.TOP_LEVEL for name in Collection.from_module(m).tasks}
    assert set(cli.namespace.tasks) == top


def test_required_flags_are_checked_in_one_place() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "flags.py" and "required flag missing" in p.read_text()
    ]
    assert not offenders, "use imagebuilder.cli.flags.required"


def test_only_the_cli_draws_progress() -> None:
    """One progress protocol (imagebuilder.core.progress): the library reports through it, only the CLI renders it."""
    graph = import_graph(PACKAGE, "imagebuilder")
    sources = {name: (PACKAGE.parent / (name.replace(".", "/") + ".py")) for name in graph}
    drawing = [
        name
        for name, path in sources.items()
        if not name.startswith("imagebuilder.cli")
        and path.is_file()
        and any(
            isinstance(node, ast.ImportFrom | ast.Import)
            and any((getattr(node, "module", None) or alias.name).split(".")[0] == "rich" for alias in node.names)
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert not drawing, f"draw progress through imagebuilder.core.progress, not rich: {drawing}"


def test_the_flows_public_surface_is_what_it_names() -> None:
    """flows/__init__.py names what the command line and other programs may call (issue 47), each loaded with its
    own flow only; every name there resolves, and nothing else is offered."""
    import importlib

    from imagebuilder import flows

    assert sorted(flows.__all__) == sorted(flows._WHERE)
    for name in flows.__all__:
        module = importlib.import_module(f"imagebuilder.flows.{flows._WHERE[name]}")
        assert getattr(flows, name) is getattr(module, name)
    with pytest.raises(AttributeError):
        _ = flows.nothing_here
