"""Packer's version constraints and plugin layout, in process: the constraint grammar, where Packer keeps plugins
and how a plugin's source address and version are read. The checks that run Packer 1.9 and 1.16 themselves (built
from their release sources) are in tests/integration/test_packer_versions.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.builder.packer_plugins import (
    PLUGINS,
    Constraint,
    PackerInfo,
    Version,
    mirror_index,
    plugin_folder,
    requirements_for,
)
from imagebuilder.core.errors import InputError
from tests.support import packers

# --- the constraint grammar (hashicorp/go-version, as required_plugins uses it) -------------------------------


@pytest.mark.parametrize(
    ("constraint", "version", "allowed"),
    [
        (">= 1.0.9", "1.0.9", True),
        (">= 1.0.9", "1.0.8", False),
        (">= 1.0.9", "v1.1.4", True),
        ("~> 1.1", "1.9.0", True),
        ("~> 1.1", "2.0.0", False),
        ("~> 1.1.2", "1.1.9", True),
        ("~> 1.1.2", "1.2.0", False),
        ("~> 1.1.2", "1.1.1", False),
        (">= 1.2, < 2", "1.9.9", True),
        (">= 1.2, < 2", "2.0.0", False),
        ("= 1.0.3", "1.0.3", True),
        ("1.0.3", "1.0.4", False),
        ("!= 1.0.3", "1.0.4", True),
        (">= 1.0.0", "1.1.0-dev", False),  # a pre-release meets only a constraint that names one
        (">= 1.1.0-dev", "1.1.0-dev", True),
    ],
)
def test_constraints_hold_as_packer_checks_them(constraint: str, version: str, allowed: bool) -> None:
    assert Constraint.parse(constraint).allows(Version.parse(version)) is allowed


@pytest.mark.parametrize("text", ["", ">=", "1.x", ">= 1.0.0 || 2", "=> 1.0", "~> ", "1.0.0.0", "v", ">= -1"])
def test_malformed_constraints_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a version"):
        Constraint.parse(text)


numbers = st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))


@given(numbers, numbers)
def test_a_floor_admits_exactly_what_is_not_lower(floor: tuple[int, int, int], version: tuple[int, int, int]) -> None:
    text = ".".join(map(str, version))
    assert Constraint.parse(">= " + ".".join(map(str, floor))).allows(Version.parse(text)) is (version >= floor)
    assert Constraint.parse("< " + ".".join(map(str, floor))).allows(Version.parse(text)) is (version < floor)


@given(numbers, numbers)
def test_pessimistic_constraints_pin_all_but_the_last_number(
    bound: tuple[int, int, int], version: tuple[int, int, int]
) -> None:
    v = Version.parse(".".join(map(str, version)))
    three = Constraint.parse("~> " + ".".join(map(str, bound)))
    assert three.allows(v) is (version >= bound and version[:2] == bound[:2])
    two = Constraint.parse(f"~> {bound[0]}.{bound[1]}")
    assert two.allows(v) is (version >= (bound[0], bound[1], 0) and version[0] == bound[0])


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_as_a_version(text: str) -> None:
    try:
        Constraint.parse(text)
    except ValueError as exc:
        assert "not a version" in str(exc) or "empty" in str(exc)


def test_every_requirement_has_a_floor_and_the_catalog_builders() -> None:
    for req in requirements_for(PLUGINS):
        assert req.constraint.floor is not None and str(req.constraint) == req.version
    assert [r.name for r in requirements_for(["qemu"])] == ["qemu", "ansible"]


# --- where Packer keeps its plugins (as hashicorp/packer-plugin-sdk's pathing finds its folder) ----------------

P19 = PackerInfo("/p/packer-1.9.4", (1, 9, 4))
P116 = PackerInfo("/p/packer-1.16.0", (1, 16, 0))


def test_plugin_folder_follows_packers_own_rules(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert plugin_folder(P116, {"HOME": str(home)}) == home / ".config/packer/plugins"
    assert plugin_folder(P116, {"HOME": str(home), "XDG_CONFIG_HOME": "/x"}) == Path("/x/packer/plugins")
    assert plugin_folder(P116, {"HOME": str(home), "PACKER_CONFIG_DIR": "/c"}) == Path("/c/.packer.d/plugins")
    assert plugin_folder(P116, {"HOME": str(home), "PACKER_PLUGIN_PATH": "/pp"}) == Path("/pp")
    (home / ".packer.d").mkdir()  # an old config folder wins over XDG
    assert plugin_folder(P116, {"HOME": str(home), "XDG_CONFIG_HOME": "/x"}) == home / ".packer.d/plugins"
    # Packer 1.9 installs into the last folder of a list; 1.10+ refuses a list
    assert plugin_folder(P19, {"HOME": str(home), "PACKER_PLUGIN_PATH": "/a:/b"}) == Path("/b")
    with pytest.raises(InputError, match=r"PACKER_PLUGIN_PATH: Packer 1\.16\.0 takes one folder"):
        plugin_folder(P116, {"HOME": str(home), "PACKER_PLUGIN_PATH": "/a:/b"})


@pytest.mark.parametrize(
    "index",
    [
        {"qemu": {"file": "../../etc/passwd", "source": "github.com/hashicorp/qemu", "sha256": "a" * 64}},
        {"qemu": {"file": "packer-plugin-qemu", "source": "github.com/hashicorp/qemu", "sha256": "nothex"}},
        {"../x": {"file": "packer-plugin-../x", "source": "s", "sha256": "a" * 64}},
        {"qemu": "packer-plugin-qemu"},
        ["packer-plugin-qemu"],
    ],
)
def test_a_hostile_mirror_index_is_refused(index: object) -> None:
    with pytest.raises(InputError, match=r"index\.json"):
        mirror_index(json.dumps(index), "index.json")


# --- with the real Packers -------------------------------------------------------------------------------------


@pytest.fixture(params=packers.MODERN)
def modern(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackerInfo:
    """A modern Packer with an empty plugin folder of its own (PACKER_PLUGIN_PATH, as a site may set it)."""
    monkeypatch.setenv("PACKER_PLUGIN_PATH", str(tmp_path / "plugins"))
    return PackerInfo.detect(str(packers.packer(request.param)))
