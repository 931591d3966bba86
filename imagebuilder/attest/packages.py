"""An image's installed packages, from its own package database, for its SBOM and for ``image.diff``.

The raw data comes from one collector, ``ansible/roles/sbom/files/inventory.py``: run on the build VM by the sbom
role (every engine, every provider: an AMI never reaches this host) or here on a mounted image
(:func:`collect`). It hands over the dpkg status file with each package's declared license line (DEP-5 copyright
files), or rpm's own query; this module parses both. Licenses become SPDX expressions only where every name in
them has a known SPDX identifier: a guess would be a false statement in a document people audit, so anything else
is left as ``NOASSERTION``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.hostinfo import parse_os_release
from imagebuilder.core.paths import BUNDLE

COLLECTOR = BUNDLE / "ansible" / "roles" / "sbom" / "files" / "inventory.py"

#: Debian (DEP-5) and Fedora/RHEL short license names -> SPDX identifiers, by lower-cased name
_NAMES: dict[str, str] = {
    **{f"gpl-{v}": f"GPL-{v}.0-only" for v in ("1", "2", "3")},
    **{f"gpl-{v}+": f"GPL-{v}.0-or-later" for v in ("1", "2", "3")},
    **{f"gpl-{v}.0": f"GPL-{v}.0-only" for v in ("1", "2", "3")},
    **{f"gpl-{v}.0+": f"GPL-{v}.0-or-later" for v in ("1", "2", "3")},
    **{f"gplv{v}": f"GPL-{v}.0-only" for v in ("1", "2", "3")},
    **{f"gplv{v}+": f"GPL-{v}.0-or-later" for v in ("1", "2", "3")},
    **{f"lgpl-{v}": f"LGPL-{v}-only" for v in ("2.0", "2.1", "3.0")},
    **{f"lgpl-{v}+": f"LGPL-{v}-or-later" for v in ("2.0", "2.1", "3.0")},
    "lgpl-2": "LGPL-2.0-only", "lgpl-2+": "LGPL-2.0-or-later", "lgpl-3": "LGPL-3.0-only",
    "lgpl-3+": "LGPL-3.0-or-later", "lgplv2": "LGPL-2.0-only", "lgplv2+": "LGPL-2.0-or-later",
    "lgplv3": "LGPL-3.0-only", "lgplv3+": "LGPL-3.0-or-later",
    "agpl-3": "AGPL-3.0-only", "agpl-3+": "AGPL-3.0-or-later",
    "apache-2.0": "Apache-2.0", "apache-2": "Apache-2.0", "asl 2.0": "Apache-2.0",
    "expat": "MIT", "mit": "MIT", "x11": "X11", "isc": "ISC", "0bsd": "0BSD",
    "bsd-2-clause": "BSD-2-Clause", "bsd-3-clause": "BSD-3-Clause", "bsd-4-clause": "BSD-4-Clause",
    "mpl-1.1": "MPL-1.1", "mpl-2.0": "MPL-2.0", "mplv2.0": "MPL-2.0", "epl-1.0": "EPL-1.0", "epl-2.0": "EPL-2.0",
    "zlib": "Zlib", "bsl-1.0": "BSL-1.0", "cc0-1.0": "CC0-1.0", "cc0": "CC0-1.0", "unlicense": "Unlicense",
    "cc-by-3.0": "CC-BY-3.0", "cc-by-4.0": "CC-BY-4.0", "cc-by-sa-3.0": "CC-BY-SA-3.0",
    "cc-by-sa-4.0": "CC-BY-SA-4.0", "gfdl-1.2+": "GFDL-1.2-or-later", "gfdl-1.3+": "GFDL-1.3-or-later",
    "gfdl-1.3": "GFDL-1.3-only", "curl": "curl", "openssl": "OpenSSL", "postgresql": "PostgreSQL", "vim": "Vim",
    "libpng": "Libpng", "ftl": "FTL", "openldap-2.8": "OLDAP-2.8", "sleepycat": "Sleepycat", "wtfpl": "WTFPL",
    "psf-2": "PSF-2.0", "python": "Python-2.0", "artistic": "Artistic-1.0", "artistic-2.0": "Artistic-2.0",
    "bzip2-1.0.6": "bzip2-1.0.6", "ofl-1.1": "OFL-1.1",
}  # fmt: skip
#: every identifier an expression we write may hold
SPDX_IDS = frozenset(_NAMES.values())
_SPDX_BY_LOWER = {i.lower(): i for i in SPDX_IDS}


@dataclass(frozen=True)
class Package:
    """One installed package, as its database has it."""

    name: str
    version: str  #: dpkg's version (epoch included), or rpm's ``[epoch:]version-release``
    arch: str
    source: str | None = None  #: the source package it was built from
    license: str | None = None  #: an SPDX expression, or None (NOASSERTION)


@dataclass(frozen=True)
class Inventory:
    kind: str  #: ``deb`` or ``rpm`` (the PURL type)
    distro: str  #: os-release ``ID`` (``ubuntu``, ``debian``, ``rhel``)
    distro_version: str  #: os-release ``VERSION_ID``
    packages: tuple[Package, ...]
    #: the container runtime's binaries the image holds: path -> sha256 (the collector's ``RUNTIME``)
    runtime: dict[str, str] = field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        """Name (with ``:arch``/``.arch`` where it tells packages apart) -> version, as ``image.diff`` compares."""
        if self.kind == "rpm":
            return {f"{p.name}.{p.arch}": p.version.split(":", 1)[-1] for p in self.packages}
        return {p.name + (f":{p.arch}" if p.arch not in ("", "all", "amd64") else ""): p.version for p in self.packages}


def _spdx_term(name: str) -> str | None:
    key = name.strip().lower()
    return _NAMES.get(key) or _SPDX_BY_LOWER.get(key)


def _spdx_sum(text: str, op: str) -> str | None:
    parts = [p for p in re.split(rf"\s+{op}\s+", text.strip(), flags=re.IGNORECASE) if p]
    mapped = [_spdx_product(p) if op == "or" else _spdx_term(p) for p in parts]
    if not mapped or any(m is None for m in mapped):
        return None
    joined = f" {op.upper()} ".join(m for m in mapped if m)
    return joined


def _spdx_product(text: str) -> str | None:
    return _spdx_sum(text, "and")


def spdx_license(text: str | None) -> str | None:
    """A Debian (DEP-5) or RPM license field as an SPDX expression, or None when any name in it is unknown.
    DEP-5: ``and`` binds tighter than ``or``, and a comma closes what comes before it (``A or B, and C``)."""
    if not text or not text.strip() or "(" in text or "with" in text.lower().split():
        return None
    groups = [g.strip() for g in text.split(",")]
    out: str | None = None
    for i, group in enumerate(groups):
        op = "AND"
        if i:
            head, _, rest = group.partition(" ")
            if head.lower() not in ("and", "or"):
                return None
            op, group = head.upper(), rest
        expr = _spdx_sum(group, "or")
        if expr is None:
            return None
        out = expr if out is None else f"({out}) {op} ({expr})"
    return out


def _copyright_license(text: str) -> str | None:
    """The ``License:`` of the ``Files: *`` paragraph the collector kept (only from a machine-readable file)."""
    lines = text.split("\n")
    if not lines or not lines[0].startswith("Format:"):
        return None
    for line in lines[1:]:
        if line.startswith("License:"):
            return spdx_license(line.split(":", 1)[1])
    return None


def parse_dpkg_status(status: str, licenses: dict[str, str] | None = None) -> list[Package]:
    """The installed packages of a dpkg status file (``Status: ... installed``), with each package's declared
    license where its copyright file is machine-readable (``licenses``: name -> the collector's lines)."""
    out = []
    for block in status.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line[0].isspace() and ": " in line:
                key, _, value = line.partition(": ")
                fields[key] = value.strip()
        if not fields.get("Status", "").endswith(" installed") or "Package" not in fields:
            continue
        name = fields["Package"]
        source = fields.get("Source", "").split(" ")[0] or None
        text = (licenses or {}).get(name)
        out.append(Package(name, fields.get("Version", ""), fields.get("Architecture", ""), source,
                           _copyright_license(text) if text else None))  # fmt: skip
    return sorted(out, key=lambda p: (p.name, p.arch))


def parse_rpm_query(text: str) -> list[Package]:
    """Lines of the collector's ``rpm -qa --qf`` (NAME, EPOCHNUM, VERSION, RELEASE, ARCH, LICENSE, SOURCERPM)."""
    out = []
    for line in text.split("\n"):
        cols = line.split("\t")
        if len(cols) != 7 or cols[0] == "gpg-pubkey":  # the keyring's pseudo-packages are not software
            continue
        name, epoch, version, release, arch, lic, srpm = cols
        full = f"{version}-{release}" if epoch in ("", "0", "(none)") else f"{epoch}:{version}-{release}"
        source = re.sub(r"-[^-]+-[^-]+\.src\.rpm$", "", srpm) if srpm.endswith(".src.rpm") else None
        out.append(Package(name, full, arch, source, spdx_license(lic)))
    return sorted(out, key=lambda p: (p.name, p.arch))


def parse_inventory(raw: Any, source: str) -> Inventory:
    """The collector's JSON document (see the module docstring)."""
    if not isinstance(raw, dict) or raw.get("format") != 1:
        raise ExternalError(f"{source} is not a package inventory of this version (format 1)")
    release = parse_os_release(str(raw.get("os_release") or ""))
    distro, version = release.get("ID", "linux"), release.get("VERSION_ID", "")
    found = raw.get("runtime")
    found = found if isinstance(found, dict) else {}
    runtime = {str(k): str(v) for k, v in found.items() if re.fullmatch(r"(/[\w.+-]+)+", str(k))
               and re.fullmatch(r"[0-9a-f]{64}", str(v))}  # fmt: skip
    if isinstance(raw.get("dpkg_status"), str):
        licenses = raw.get("copyright") if isinstance(raw.get("copyright"), dict) else {}
        return Inventory("deb", distro, version, tuple(parse_dpkg_status(raw["dpkg_status"], licenses)), runtime)
    if isinstance(raw.get("rpm"), str):
        return Inventory("rpm", distro, version, tuple(parse_rpm_query(raw["rpm"])), runtime)
    raise ExternalError(f"{source}: the image has neither a dpkg nor an rpm database")


def collect(root: Path) -> Inventory:
    """The inventory of an image mounted at ``root`` (read-only is enough), by the same collector the build runs."""
    proc = subprocess.run([sys.executable, str(COLLECTOR), str(root)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ExternalError(f"reading the package database under {root} failed: {proc.stderr.strip()[-500:]}")
    return parse_inventory(json.loads(proc.stdout), str(root))


def load_inventory(path: Path) -> Inventory:
    """An inventory the sbom role wrote (build) as JSON."""
    from imagebuilder.core.files import load_json_object

    return parse_inventory(load_json_object(path, "package inventory"), str(path))
