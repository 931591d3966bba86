"""Which Packer runs a build, and the plugins its templates need: checked, and installed, before anything starts.

From Packer 1.7 every builder and provisioner is a plugin that a template declares in ``packer { required_plugins
{...} }``; Packer refuses to start a build whose plugins are missing. That refusal comes after the build has
rendered, fetched its source image and, on vSphere, talked to vCenter. So a build asks here first, in seconds:

- :class:`PackerInfo` is the Packer a build runs (``--packer PATH``, else ``packer`` on PATH) and its version.
- :data:`PLUGINS` lists what each Packer builder folder's template requires, with the lowest plugin version the
  templates are proven with (the "floor": every pair validates on it, see docs/packer.md).
- :func:`check_plugins` compares that with what Packer itself has installed (``packer plugins installed``, or the
  folder layout on Packer < 1.8) in the folder Packer uses (:func:`plugin_folder`), and with a folder of plugin
  binaries for air-gapped sites (``--packer-plugins DIR``, or the mirror's copy). Its :class:`PluginCheck` says,
  per plugin, whether it is installed, will be installed from that folder, will be fetched by ``packer init``, or
  cannot be had (exit 2 naming the plugin, the constraint, what was found and the command that fixes it).
- :func:`install_plugins` carries the check out: ``packer plugins install --path BIN SOURCE`` (Packer 1.10+), the
  1.7-1.9 folder layout with its ``_SHA256SUM`` file, or ``packer init`` when the build may go online.

Packer 1.6 builds plugins in and reads no ``required_plugins``: there is nothing to check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import total_ordering
from pathlib import Path
from typing import Any, Literal

from imagebuilder.core import fetch, untrusted
from imagebuilder.core.disk import run_tempdir
from imagebuilder.core.errors import ExternalError, InputError, InputErrors
from imagebuilder.core.fetch import Expected, Mirror
from imagebuilder.core.files import atomic_write, parse_json, read_text, sha256_file

# --- versions and constraints (the grammar of Packer's required_plugins: hashicorp/go-version) -------------------

_VERSION_RE = re.compile(
    r"v?([0-9]{1,6})(?:\.([0-9]{1,6}))?(?:\.([0-9]{1,6}))?(?:-([0-9A-Za-z.]{1,40}))?(?:\+[0-9A-Za-z.]{1,40})?"
)
_OPS = ("~>", ">=", "<=", "!=", ">", "<", "=")


@total_ordering
@dataclass(frozen=True)
class Version:
    """A plugin version: up to three numbers and an optional pre-release (``1.1.4``, ``v1.0.0-dev``)."""

    numbers: tuple[int, int, int]
    #: how many numbers were written (``~> 1.2`` and ``~> 1.2.0`` differ)
    given: int = 3
    prerelease: str = ""

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION_RE.fullmatch(text.strip())
        if not match:
            raise ValueError(f"{text[:40]!r} is not a version")
        parts = [g for g in match.groups()[:3] if g is not None]
        numbers = tuple(int(p) for p in parts) + (0,) * (3 - len(parts))
        return cls((numbers[0], numbers[1], numbers[2]), len(parts), match.group(4) or "")

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        if self.numbers != other.numbers:
            return self.numbers < other.numbers
        # a pre-release sorts before its release
        return (not self.prerelease, self.prerelease) < (not other.prerelease, other.prerelease)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and (self.numbers, self.prerelease) == (other.numbers, other.prerelease)

    def __hash__(self) -> int:
        return hash((self.numbers, self.prerelease))

    def __str__(self) -> str:
        text = ".".join(map(str, self.numbers))
        return f"{text}-{self.prerelease}" if self.prerelease else text


@dataclass(frozen=True)
class Constraint:
    """``>= 1.0.9``, ``~> 1.1``, ``>= 1.2, < 2``: every term must hold. As go-version checks them, a pre-release
    version meets a constraint only when a term names a pre-release of the same numbers."""

    terms: tuple[tuple[str, Version], ...]

    @classmethod
    def parse(cls, text: str) -> Constraint:
        terms = []
        for raw in text.split(","):
            term = raw.strip()
            op = next((o for o in _OPS if term.startswith(o)), "=")
            terms.append((op, Version.parse(term.removeprefix(op).strip() if term.startswith(op) else term)))
        if not terms:
            raise ValueError("an empty constraint")
        return cls(tuple(terms))

    def allows(self, version: Version) -> bool:
        if version.prerelease and not any(v.prerelease and v.numbers == version.numbers for _, v in self.terms):
            return False
        return all(_holds(op, version, bound) for op, bound in self.terms)

    @property
    def floor(self) -> Version | None:
        """The lowest version a ``>=``/``~>``/``=`` term admits (the "floor" docs/packer.md lists)."""
        floors = [v for op, v in self.terms if op in (">=", "~>", "=")]
        return max(floors) if floors else None

    def __str__(self) -> str:
        return ", ".join(f"{op} {v}" for op, v in self.terms)


def _holds(op: str, version: Version, bound: Version) -> bool:
    plain = Version(version.numbers, 3, version.prerelease)
    if op == "=":
        return plain == Version(bound.numbers, 3, bound.prerelease)
    if op == "!=":
        return plain != Version(bound.numbers, 3, bound.prerelease)
    if op == ">":
        return plain > bound
    if op == "<":
        return plain < bound
    if op == ">=":
        return plain >= bound
    if op == "<=":
        return plain <= bound
    # ~>: at least the bound, and the same numbers up to the one before the last one written
    if plain < bound:
        return False
    keep = max(bound.given - 1, 1)
    return version.numbers[:keep] == bound.numbers[:keep]


# --- what the templates require ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One entry of a template's ``required_plugins``: ``name = { source = ..., version = ... }``."""

    name: str
    source: str
    version: str

    @property
    def constraint(self) -> Constraint:
        return Constraint.parse(self.version)

    @property
    def type(self) -> str:
        """The plugin's type, the last part of its source (``github.com/hashicorp/qemu`` -> ``qemu``)."""
        return self.source.rsplit("/", 1)[-1]


#: the Packers the test suite builds with: Debian's (the last with the plugins built in) and the modern ones users
#: run (tests/support/packers.py builds those from their release sources)
TESTED_PACKERS = ("1.6.6", "1.9.4", "1.16.0")

#: the plugins each Packer builder folder's template declares for Packer >= 1.7 (built into Packer 1.6), with
#: the lowest versions every pair validates with on Packer 1.9 and 1.16 (tests/integration/test_packer_versions.py)
PLUGINS: dict[str, tuple[Requirement, ...]] = {
    "vsphere": (Requirement("vsphere", "github.com/hashicorp/vsphere", ">= 1.1.1"),),
    "qemu": (Requirement("qemu", "github.com/hashicorp/qemu", ">= 1.0.9"),),
    "amazon": (Requirement("amazon", "github.com/hashicorp/amazon", ">= 1.2.1"),),
    "nutanix": (Requirement("nutanix", "github.com/nutanix-cloud-native/nutanix", ">= 1.3.0"),),
}
#: every template provisions with Ansible
ANSIBLE_PLUGIN = Requirement("ansible", "github.com/hashicorp/ansible", ">= 1.0.3")


def requirements_for(builders: Iterable[str]) -> tuple[Requirement, ...]:
    """The plugins the templates of these builder folders require, each once."""
    found = {r.source: r for b in builders for r in (*PLUGINS[b], ANSIBLE_PLUGIN)}
    return tuple(found.values())


def known_plugin(name: str) -> Requirement | None:
    """The requirement of a plugin the templates use, by its type (``qemu``), or None."""
    return next((r for r in requirements_for(PLUGINS) if r.type == name), None)


# --- the Packer that runs ------------------------------------------------------------------------------------


def _packer_process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A Packer child's environment: no version check against HashiCorp's server (air-gapped sites), no colour."""
    return {**(os.environ if env is None else env), "CHECKPOINT_DISABLE": "1", "PACKER_NO_COLOR": "1"}


#: the oldest Packer every pair is built and validated on (Debian's; docs/packer.md): an older one is refused when
#: it is found, before anything is planned on it
PACKER_FLOOR = (1, 6, 6)


@dataclass(frozen=True)
class PackerInfo:
    path: str
    version: tuple[int, int, int]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def has_plugin_blocks(self) -> bool:
        """``packer { required_plugins {...} }`` and ``packer init`` exist from Packer 1.7."""
        return self.version >= (1, 7, 0)

    @property
    def installs_from_path(self) -> bool:
        """``packer plugins install --path BIN SOURCE`` exists from Packer 1.10."""
        return self.version >= (1, 10, 0)

    @property
    def lists_plugins(self) -> bool:
        """``packer plugins installed`` exists from Packer 1.8."""
        return self.version >= (1, 8, 0)

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "version": self.version_text}

    @classmethod
    def detect(cls, packer: str | None = None, *, flag: str = "--packer") -> PackerInfo:
        """The Packer at ``packer`` (a path, as ``--packer`` gives it), else ``packer`` on PATH."""
        if packer:
            given = Path(packer)
            info = untrusted.path_stat(given, "packer", flag)
            if info is None or not stat.S_ISREG(info.st_mode) or not os.access(given, os.X_OK):
                raise InputError(f"{untrusted.shown(packer)!r} is not an executable file", field=flag,
                                 expected="the path of a packer")  # fmt: skip
            path: str | None = str(given.absolute())
        else:
            path = shutil.which("packer")
        if not path:
            raise ExternalError(
                "packer is not installed",
                hint="run ./scripts/setup.sh (Debian's Packer 1.6.6), install Packer from"
                " https://developer.hashicorp.com/packer/install, or pass --packer PATH",
            )
        try:
            proc = subprocess.run([path, "version"], capture_output=True, text=True, timeout=60, check=False,
                                  env=_packer_process_env())  # fmt: skip
        except OSError as exc:
            raise InputError(f"{path} cannot run: {exc.strerror}", field=flag, expected="a Packer binary") from exc
        match = re.search(r"Packer v?([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})", proc.stdout) or re.search(
            r"^v?([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})", proc.stdout
        )
        if proc.returncode != 0 or not match:
            raise InputError(
                f"'{path} version' did not print a Packer version: {(proc.stdout or proc.stderr)[:200]!r}",
                field=flag,
                expected="a Packer binary",
            )
        major, minor, patch = (int(g) for g in match.groups())
        found = (major, minor, patch)
        if found < PACKER_FLOOR:
            floor = ".".join(map(str, PACKER_FLOOR))
            what = f"{path} is Packer {major}.{minor}.{patch}, older than {floor} (the oldest the templates build on)"
            if packer:
                raise InputError(what, field=flag, expected=f"Packer {floor} or newer (docs/packer.md)")
            raise ExternalError(what, hint=f"install Packer {floor} or newer (./scripts/setup.sh installs Debian's"
                                " 1.6.6), or pass --packer PATH")  # fmt: skip
        return cls(path, found)


# --- where Packer keeps plugins, and what it has ----------------------------------------------------------------


def plugin_folder(packer: PackerInfo, env: Mapping[str, str] | None = None) -> Path:
    """The folder Packer installs plugins into (and, from 1.10, the only one it loads them from):
    ``PACKER_PLUGIN_PATH`` when set, else ``plugins`` in Packer's config folder, found as Packer finds it
    (``PACKER_CONFIG_DIR``/.packer.d, an existing ``~/.packer.d``, ``$XDG_CONFIG_HOME/packer``, ``~/.config/packer``).
    """
    env = os.environ if env is None else env
    if value := env.get("PACKER_PLUGIN_PATH"):
        parts = [p for p in value.split(os.pathsep) if p]
        if len(parts) > 1 and packer.installs_from_path:
            raise InputError(
                f"Packer {packer.version_text} takes one folder, not a list: {value!r}",
                field="PACKER_PLUGIN_PATH",
                expected="one folder",
            )
        return Path(parts[-1]).absolute()  # Packer 1.7-1.9 installs into the last folder of the list
    if config := env.get("PACKER_CONFIG_DIR"):
        return Path(config).absolute() / ".packer.d" / "plugins"
    home = env.get("HOME")
    if not home:
        raise ExternalError("HOME is not set, so Packer has no plugin folder", hint="set HOME or PACKER_PLUGIN_PATH")
    if (Path(home) / ".packer.d").exists():
        return Path(home) / ".packer.d" / "plugins"
    if xdg := env.get("XDG_CONFIG_HOME"):
        return Path(xdg) / "packer" / "plugins"
    return Path(home) / ".config" / "packer" / "plugins"


#: the name Packer gives an installed plugin binary
_INSTALLED_RE = re.compile(
    r"packer-plugin-(?P<type>[a-z0-9][a-z0-9-]*)_(?P<version>v[0-9][0-9A-Za-z.+-]*)_(?P<api>x[0-9]+\.[0-9]+)_"
    r"(?P<os>[a-z0-9]+)_(?P<arch>[a-z0-9]+)(?:\.exe)?"
)


@dataclass(frozen=True)
class Installed:
    source: str
    version: Version
    api: str
    path: Path


def _parse_installed(path: Path) -> Installed | None:
    match = _INSTALLED_RE.fullmatch(path.name)
    if not match or len(path.parts) < 4:
        return None
    source = "/".join(path.parts[-4:-1])
    try:
        version = Version.parse(match["version"])
    except ValueError:
        return None
    return Installed(source, version, match["api"], path)


def _layout_installations(folder: Path) -> list[Installed]:
    """Plugins in Packer's folder layout (``host/namespace/type/packer-plugin-..._SHA256SUM``) whose checksum file
    matches, as Packer 1.7 loads them (Packer 1.8+ says it with ``packer plugins installed``)."""
    found = []
    for path in sorted(folder.glob("*/*/*/packer-plugin-*")):
        item = _parse_installed(path)
        sums = path.with_name(path.name + "_SHA256SUM")
        if item is None or not sums.is_file():
            continue
        if sums.read_text(errors="replace").strip()[:64] == sha256_file(path):
            found.append(item)
    return found


def installed_plugins(packer: PackerInfo, env: Mapping[str, str] | None = None) -> list[Installed]:
    """The plugins this Packer would load, from Packer itself (``packer plugins installed``) where it can say."""
    if not packer.has_plugin_blocks:
        return []
    if not packer.lists_plugins:
        return _layout_installations(plugin_folder(packer, env))
    proc = subprocess.run([packer.path, "plugins", "installed"], capture_output=True, text=True, timeout=120,
                          env=_packer_process_env(env), check=False)  # fmt: skip
    if proc.returncode != 0:
        raise ExternalError(
            f"'{packer.path} plugins installed' failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-400:]}",
            hint="check PACKER_PLUGIN_PATH and the plugin folder's permissions",
        )
    items = (_parse_installed(Path(line.strip())) for line in proc.stdout.splitlines() if line.strip())
    return [i for i in items if i is not None]


# --- plugin binaries an air-gapped site brings (--packer-plugins DIR, a mirror's copy) ------------------------


@dataclass(frozen=True)
class LocalPlugin:
    """A plugin binary in a folder: its type from its name, its version and API from its own ``describe``."""

    path: Path
    type: str
    source: str
    version: Version
    api: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"file": self.path.name, "type": self.type, "source": self.source, "version": str(self.version),
                "api": self.api, "sha256": self.sha256}  # fmt: skip


_BINARY_RE = re.compile(r"packer-plugin-(?P<type>[a-z0-9][a-z0-9-]*?)(?:_v[0-9][^/]*)?")


def describe(binary: Path) -> dict[str, Any]:
    """What a plugin binary says of itself (``BIN describe``: version, sdk_version, api_version, builders...)."""
    try:
        proc = subprocess.run([str(binary), "describe"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        raise InputError(f"{binary} cannot run: {exc.strerror}", field="--packer-plugins",
                         expected="Packer plugin binaries") from exc  # fmt: skip
    try:
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        raise InputError(
            f"{binary} is not a Packer plugin: '{binary.name} describe' printed no plugin description",
            field="--packer-plugins",
            expected="Packer plugin binaries (packer-plugin-<name>)",
        )
    return data


#: a plugin's source address as Packer spells it: host/namespace/name (github.com/hashicorp/qemu)
_SOURCE_ADDRESS = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/[A-Za-z0-9_-]{1,64}/[A-Za-z0-9_-]{1,64}")
#: the version the shared build script writes after it (``github.com/hashicorp/qemu 1.1.4``)
_SOURCE_VERSION = re.compile(r"v?[0-9]{1,6}(\.[0-9]{1,6}){0,2}(-[0-9A-Za-z.]{1,40})?")


def _source_address(path: Path, kind: str) -> str:
    """The source address a ``<type>.source`` file names: one line, in Packer's grammar, naming a plugin of that
    type, optionally followed by its version (as ../shared/tools/build-packer.sh writes it). It becomes folders
    under Packer's plugin folder, so nothing else is taken (a '..' would lead out of it); the file is read as the
    other files a user gives (UTF-8, bounded, never a link), and never quoted."""
    if path.is_symlink():
        raise InputError("is a symbolic link", source=path, field="--packer-plugins", expected="a plain file")
    words = read_text(path, "plugin source file", field="--packer-plugins").split()
    if not words:
        return ""
    address = words[0]
    version_ok = len(words) == 1 or (len(words) == 2 and _SOURCE_VERSION.fullmatch(words[1]) is not None)
    if not version_ok or not _SOURCE_ADDRESS.fullmatch(address) or address.rsplit("/", 1)[1] != kind:
        raise InputError("is not the source address of this plugin", source=path, field="--packer-plugins",
                         expected=f"one line: github.com/hashicorp/{kind}, and its version if given")  # fmt: skip
    return address


def plugin_binaries(folder: Path) -> dict[str, LocalPlugin]:
    """The plugin binaries in ``folder`` by type: files named ``packer-plugin-<type>`` (as built from source) or
    ``packer-plugin-<type>_v<version>_x<api>_<os>_<arch>`` (as HashiCorp's release archives hold them). A binary's
    source address is the one a ``<type>.source`` file beside it names, else the templates' own."""
    found: dict[str, LocalPlugin] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _BINARY_RE.fullmatch(path.name)
        if not match or not path.is_file() or path.name.endswith("_SHA256SUM"):
            continue
        kind = match["type"]
        source_file = folder / f"{kind}.source"
        known = known_plugin(kind)
        if source_file.is_file() or source_file.is_symlink():
            source = _source_address(source_file, kind)
        else:
            source = known.source if known else ""
        if not source:
            continue  # a plugin no template uses, with no source address: not ours to install
        info = describe(path)
        try:
            version = Version.parse(str(info["version"]))
        except ValueError as exc:
            raise InputError(f"{path} reports version {info['version']!r}", field="--packer-plugins",
                             expected="a plugin release version") from exc  # fmt: skip
        api = str(info.get("api_version") or "x5.0")
        item = LocalPlugin(path, kind, source, version, api, sha256_file(path))
        if kind not in found or found[kind].version < version:
            found[kind] = item
    return found


# --- the check ----------------------------------------------------------------------------------------------------

Action = Literal["installed", "install from folder", "packer init", "missing", "not needed"]


@dataclass(frozen=True)
class PluginState:
    requirement: Requirement
    action: Action
    #: versions Packer has installed (any, even those that do not meet the constraint)
    installed: tuple[Version, ...] = ()
    #: the binary the build installs (``install from folder``), or the best one the folder had
    local: LocalPlugin | None = None

    def describe(self) -> str:
        r = self.requirement
        have = ", ".join(map(str, self.installed)) or "none"
        if self.action == "installed":
            return f"{r.name} {self.chosen} installed ({r.source} {r.version})"
        if self.action == "install from folder":
            assert self.local is not None
            return f"{r.name}: will install {self.local.version} from {self.local.path} ({r.source} {r.version})"
        if self.action == "packer init":
            return f"{r.name}: not installed (found: {have}); 'packer init' will install {r.source} {r.version}"
        if self.action == "not needed":
            return f"{r.name}: built into Packer < 1.7"
        local = f"; {self.local.path} is {self.local.version}" if self.local else ""
        return f"{r.name}: MISSING, needs {r.source} {r.version}, installed: {have}{local}"

    @property
    def chosen(self) -> Version | None:
        """The installed version Packer loads: the highest that meets the constraint."""
        fits = [v for v in self.installed if self.requirement.constraint.allows(v)]
        return max(fits) if fits else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.requirement.name,
            "source": self.requirement.source,
            "constraint": self.requirement.version,
            "action": self.action,
            "version": str(self.chosen) if self.chosen else None,
            "installed": [str(v) for v in self.installed],
            "from": str(self.local.path) if self.local and self.action == "install from folder" else None,
        }


@dataclass(frozen=True)
class PluginCheck:
    packer: PackerInfo
    folder: Path | None
    states: tuple[PluginState, ...]
    #: the folder of plugin binaries the check looked in, if any
    binaries: Path | None = None
    offline: bool = False
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def missing(self) -> list[PluginState]:
        return [s for s in self.states if s.action == "missing"]

    def lines(self) -> list[str]:
        head = f"packer {self.packer.version_text} ({self.packer.path})"
        if self.folder is not None:
            head += f", plugins in {self.folder}"
        return [head, *(f"  {s.describe()}" for s in self.states)]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.packer.to_json(),
            "plugin_folder": str(self.folder) if self.folder else None,
            "plugins": [s.to_json() for s in self.states],
        }

    def raise_missing(self) -> None:
        """Exit 2 naming each plugin that cannot be had: its constraint, what was found, and the fix."""
        errors = [self._missing_error(s) for s in self.missing]
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise InputErrors(errors)

    def _missing_error(self, state: PluginState) -> InputError:
        r = state.requirement
        found = ", ".join(map(str, state.installed)) or "none"
        where = f"installed in {self.folder}: {found}"
        if state.local is not None:
            where += f"; {state.local.path} is {state.local.version}"
        elif self.binaries is not None:
            where += f"; no packer-plugin-{r.type} in {self.binaries}"
        online = f"'packer plugins install {r.source} \"{r.version}\"' on a connected host"
        if self.packer.installs_from_path:
            offline = f"'packer plugins install --path packer-plugin-{r.type} {r.source}'"
        else:
            offline = "--packer-plugins DIR holding packer-plugin-" + r.type
        why = "offline, so 'packer init' cannot fetch it" if self.offline else "not installed"
        return InputError(
            f"Packer plugin {r.name} ({r.source}) {why}: needs {r.version}, {where}",
            field="--packer-plugins",
            expected=f"a plugin binary meeting {r.version}: {offline}, or {online}",
        )


def check_plugins(
    packer: PackerInfo,
    requirements: Iterable[Requirement],
    *,
    binaries: Path | None = None,
    offline: bool = False,
    env: Mapping[str, str] | None = None,
) -> PluginCheck:
    """Each required plugin's state, from what Packer has installed and what ``binaries`` holds. Reads only."""
    env = dict(os.environ if env is None else env)
    if not packer.has_plugin_blocks:
        states = tuple(PluginState(r, "not needed") for r in requirements)
        return PluginCheck(packer, None, states, binaries, offline, env)
    folder = plugin_folder(packer, env)
    have = installed_plugins(packer, env)
    local = plugin_binaries(binaries) if binaries is not None else {}
    found: list[PluginState] = []
    for r in requirements:
        versions = tuple(sorted({i.version for i in have if i.source == r.source}))
        candidate = next((p for p in local.values() if p.source == r.source), None)
        if any(r.constraint.allows(v) for v in versions):
            action: Action = "installed"
        elif candidate is not None and r.constraint.allows(candidate.version):
            action = "install from folder"
        elif not offline and binaries is None:
            action = "packer init"
        else:
            action = "missing"
        found.append(PluginState(r, action, versions, candidate))
    return PluginCheck(packer, folder, tuple(found), binaries, offline, env)


# --- installing -----------------------------------------------------------------------------------------------


def _install_layout(packer: PackerInfo, plugin: LocalPlugin, folder: Path) -> Path:
    """Packer 1.7-1.9's layout, as its ``packer init`` leaves it: the binary under its source address, named with
    its version and API, beside a ``_SHA256SUM`` file that Packer checks before it loads the binary."""
    target = folder.joinpath(*plugin.source.split("/")) / (
        f"packer-plugin-{plugin.source.rsplit('/', 1)[-1]}_v{plugin.version}_{plugin.api}_linux_amd64"
    )
    with plugin.path.open("rb") as src, atomic_write(target, "wb", perm=0o755) as dst:
        shutil.copyfileobj(src, dst)
    if sha256_file(target) != plugin.sha256:
        raise ExternalError(f"{plugin.path} changed while it was installed", hint="rerun the build")
    with atomic_write(target.with_name(target.name + "_SHA256SUM")) as fh:
        fh.write(plugin.sha256)
    return target


def _run_packer(packer: PackerInfo, args: list[str], env: Mapping[str, str], what: str, cwd: str | None = None) -> str:
    proc = subprocess.run([packer.path, *args], capture_output=True, text=True, timeout=1800,
                          env=_packer_process_env(env), check=False, cwd=cwd)  # fmt: skip
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr + proc.stdout).strip().splitlines()[-6:])
        raise ExternalError(f"{what} failed (exit {proc.returncode}): {tail}",
                            hint="give the plugins offline with --packer-plugins DIR (see docs/packer.md)")  # fmt: skip
    return proc.stdout


def plugins_block(requirements: Iterable[Requirement]) -> str:
    """A ``packer { required_plugins {...} }`` block (what ``packer init`` reads)."""
    from imagebuilder.core.render import template_env

    return template_env().get_template("packer/common/plugins.pkr.hcl.j2").render(required_plugins=list(requirements))


def install_plugins(check: PluginCheck, say: Any = None) -> PluginCheck:
    """Install what ``check`` found missing but obtainable, then check again: every plugin must now be installed.
    A plugin that cannot be had is an :class:`InputError` before anything is installed."""
    check.raise_missing()
    todo = [s for s in check.states if s.action in ("install from folder", "packer init")]
    if not todo:
        return check
    assert check.folder is not None
    for state in todo:
        if state.action != "install from folder":
            continue
        assert state.local is not None
        if say:
            say(f"installing Packer plugin {state.requirement.name} {state.local.version} from {state.local.path}")
        if check.packer.installs_from_path:
            _run_packer(check.packer, ["plugins", "install", "--path", str(state.local.path), state.requirement.source],
                        check.env, f"packer plugins install --path {state.local.path}")  # fmt: skip
        else:
            _install_layout(check.packer, state.local, check.folder)
    online = [s.requirement for s in todo if s.action == "packer init"]
    if online:
        if say:
            say(f"packer init: {', '.join(f'{r.source} {r.version}' for r in online)}")
        with run_tempdir("packer-init") as tmp:
            template = Path(tmp) / "plugins.pkr.hcl"
            template.write_text(plugins_block(online))
            _run_packer(check.packer, ["init", template.name], check.env, "packer init", cwd=str(tmp))
    after = check_plugins(check.packer, [s.requirement for s in check.states], binaries=check.binaries,
                          offline=True, env=check.env)  # fmt: skip
    left = [s for s in after.states if s.action != "installed"]
    if left:
        raise ExternalError(
            "Packer does not list these plugins after installing them: " + "; ".join(s.describe() for s in left),
            hint=f"run '{check.packer.path} plugins installed' with PACKER_LOG=1 to see why it skips them",
        )
    return after


def prepare_plugins(
    packer: PackerInfo,
    builders: Iterable[str],
    *,
    binaries: Path | None = None,
    mirror: Mirror | None = None,
    offline: bool = False,
    install: bool = True,
    say: Any = None,
) -> PluginCheck:
    """The plugins the templates of ``builders`` require, checked against what ``packer`` has; with ``install``,
    the missing ones installed (from ``binaries``, else the mirror's copy, else ``packer init`` unless
    ``offline``). Without it (a dry run) nothing is installed and a plugin that cannot be had still exits 2."""
    with run_tempdir("plugins") as tmp:
        if binaries is None and mirror is not None and packer.has_plugin_blocks:
            binaries = mirror_plugins(mirror, Path(tmp))
        check = check_plugins(packer, requirements_for(builders), binaries=binaries, offline=offline)
        if not install:
            check.raise_missing()
            return check
        return install_plugins(check, say)


# --- a mirror's copy of the plugins -------------------------------------------------------------------------------

#: the folder of a mirror that holds plugin binaries, and its index (file, source, version, api, sha256 per type)
MIRROR_FOLDER = "packer-plugins"
MIRROR_INDEX = "index.json"


def copy_plugins(plugins: Mapping[str, LocalPlugin], dest: Path) -> list[LocalPlugin]:
    """Copy plugin binaries (:func:`plugin_binaries`) into a mirror's ``dest/packer-plugins`` with an index; files
    already there with the same sha256 are kept (reruns converge)."""
    folder = dest / MIRROR_FOLDER
    copied = []
    for kind, plugin in sorted(plugins.items()):
        target = folder / f"packer-plugin-{kind}"
        if not (target.is_file() and sha256_file(target) == plugin.sha256):
            with plugin.path.open("rb") as src, atomic_write(target, "wb", perm=0o755) as dst:
                shutil.copyfileobj(src, dst)
        with atomic_write(folder / f"{kind}.source") as fh:
            fh.write(f"{plugin.source} {plugin.version}\n")
        copied.append(LocalPlugin(target, kind, plugin.source, plugin.version, plugin.api, plugin.sha256))
    with atomic_write(folder / MIRROR_INDEX) as fh:
        fh.write(json.dumps({p.type: p.to_json() for p in copied}, indent=2, sort_keys=True) + "\n")
    return copied


def mirror_index(text: str, where: str) -> dict[str, dict[str, str]]:
    """A mirror's plugin index, every entry checked (names, sha256) before any file it names is used."""
    data = parse_json(text, where)
    if not isinstance(data, dict):
        raise InputError("expected an object of plugin entries", source=where)
    out: dict[str, dict[str, str]] = {}
    for kind, entry in data.items():
        ok = isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("file", "source", "sha256"))
        if not ok or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", kind) or entry["file"] != f"packer-plugin-{kind}" \
                or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):  # fmt: skip
            raise InputError(f"entry {kind[:40]!r} is malformed", source=where,
                             expected='{"file": "packer-plugin-<name>", "source": ..., "sha256": <hex>}')  # fmt: skip
        out[kind] = {k: str(v) for k, v in entry.items()}
    return out


def mirror_plugins(mirror: Mirror, work: Path) -> Path | None:
    """The folder of plugin binaries a mirror carries (``mirror.create --packer-plugins``), or None when it has
    none. A served mirror's binaries are downloaded into ``work``, each checked against the index's sha256; a
    directory mirror's are used in place once their sha256 matches the index."""
    if mirror.is_local:
        folder = Path(mirror.base) / MIRROR_FOLDER
        index_path = folder / MIRROR_INDEX
        if not index_path.is_file():
            return None
        index = mirror_index(index_path.read_text(errors="replace"), str(index_path))
        for entry in index.values():
            binary = folder / entry["file"]
            if not binary.is_file() or sha256_file(binary) != entry["sha256"]:
                raise InputError(f"{binary} is missing or does not match the index's sha256", source=index_path,
                                 expected="the mirror as mirror.create --packer-plugins wrote it")  # fmt: skip
        return folder
    index_url = f"{mirror.base}/{MIRROR_FOLDER}/{MIRROR_INDEX}"
    raw = fetch.read_optional(index_url)
    if raw is None:
        return None
    index = mirror_index(raw.decode("utf-8", errors="replace"), index_url)
    for kind, entry in index.items():
        target = work / entry["file"]
        fetch.download(f"{mirror.base}/{MIRROR_FOLDER}/{entry['file']}", target,
                       Expected(None, {"sha256": entry["sha256"]}))  # fmt: skip
        target.chmod(0o755)
        (work / f"{kind}.source").write_text(f"{entry['source']}\n")
    return work
