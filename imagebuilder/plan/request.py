"""The rules of a build request that hold wherever it comes from (issue 61): the command line, a flow called from
Python, a CI job. A provider's config file by its provider name or alias, one per architecture
(``bm.json,arm64=bm-arm64.json``); a matrix's pairs (``ubuntu:baremetal``) or its OSes times its providers; one
release manifest for one channel. Light on purpose: the command line calls these before the planner loads, so a bad
flag is answered at once."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from imagebuilder.core.arch import ARCH_NAMES, ARCH_SYNONYMS, check_arch
from imagebuilder.core.errors import InputError
from imagebuilder.release.catalog import load_catalog

#: ``<arch>=`` at the start of a config entry (a word: a path's own ``=`` elsewhere is a path's)
_ARCH_ENTRY = re.compile(r"([A-Za-z0-9_-]+)=(.*)", re.S)


def arch_configs(value: str, flag: str) -> dict[str | None, str]:
    """A config flag's value: a path (every architecture's), or comma-separated entries each ``<arch>=<path>`` or a
    path for the others (``bm.json,arm64=bm-arm64.json``): a matrix of both architectures needs a source image of
    each. A value with no entry naming an architecture (or a synonym: refused with the name to use) is one path,
    commas and all."""

    def named(part: str) -> bool:
        m = _ARCH_ENTRY.fullmatch(part)
        return m is not None and (m.group(1).lower() in ARCH_NAMES or m.group(1).lower() in ARCH_SYNONYMS)

    parts = value.split(",")
    if not any(named(p.strip()) for p in parts):
        return {None: value}
    out: dict[str | None, str] = {}
    for part in (p.strip() for p in parts):
        m = _ARCH_ENTRY.fullmatch(part)
        arch = check_arch(m.group(1), flag) if m is not None and named(part) else None
        path = m.group(2) if arch is not None and m is not None else part
        if not path:
            raise InputError(f"an entry names no file: {part!r}", field=flag, expected="<arch>=<file> or <file>")
        if arch in out:
            what = f"the {arch} config" if arch else "the config of every other architecture"
            raise InputError(f"names {what} twice", field=flag, expected="each architecture once")
        out[arch] = path
    return out


def config_files(given: Mapping[str, str | None]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The config files given by provider name or alias (``{"platform": "vs.json"}``, as ``--platform-config``
    names it): (provider -> path for every architecture, architecture -> provider -> path). A provider given twice,
    under its name and an alias, is refused."""
    catalog = load_catalog()
    configs: dict[str, str] = {}
    per_arch: dict[str, dict[str, str]] = {}
    for key, value in given.items():
        if not value:
            continue
        real = catalog.provider(key).name  # config/matrix.yaml owns the aliases
        if real in configs or any(real in c for c in per_arch.values()):
            raise InputError(f"--{real}-config given twice (once as --{key}-config)", field=f"--{key}-config")
        for arch, path in arch_configs(value, f"--{key}-config").items():
            if arch is None:
                configs[real] = path
            else:
                per_arch.setdefault(arch, {})[real] = path
    return configs, per_arch


def matrix_pairs(pairs: Sequence[str], oses: Sequence[str], providers: Sequence[str]) -> list[tuple[str, str]]:
    """What a matrix builds: its ``os:provider`` pairs, or each OS with each provider (never both)."""
    if pairs and (oses or providers):
        raise InputError("--pairs and --os/--hypervisor both list what to build", field="--pairs", expected="one")
    if not pairs:
        return [(o, h) for o in oses for h in providers]
    out = []
    for item in pairs:
        os_name, sep, provider = item.partition(":")
        if not sep or not os_name or not provider:
            raise InputError(f"{item!r} is not os:provider", field="--pairs", expected="e.g. ubuntu:baremetal")
        out.append((os_name, provider))
    return out


def check_matrix(release_manifest: str | None, channels: Sequence[str]) -> None:
    """A release manifest names one release: a matrix that builds from one has one channel, the manifest's."""
    if release_manifest is not None and len(channels) != 1:
        raise InputError(
            f"one release manifest names one release, and the matrix has {len(channels)} channels",
            field="--release-manifest",
            expected="one --release-channel: the manifest's",
        )
