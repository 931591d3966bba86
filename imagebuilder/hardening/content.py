"""ComplianceAsCode's content: a product's data stream (``ssg-<product>-ds.xml``), built from the project's source
release or found in a folder the user gives.

Why build it: the content Debian packages (``ssg-debian``, 0.1.65) predates the CIS profiles of the OSes this tool
builds, and an air-gapped site needs the content without a download at build time. The source release comes
through the Go module proxy, as Kubernetes does (:mod:`imagebuilder.release.source`): no git, no other host. Only the
data stream of the product asked for is built (CMake, about two minutes on 2 cores), without the guides and tables,
and it is cached by its inputs (the release, the product, the recipe): a second build reads it from the cache.

A folder given with ``--hardening-content`` is taken as it is: an air-gapped site's copy of these data streams,
``/usr/share/xml/scap/ssg/content`` of a distro's package, or a site's own tailored content."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.core.errors import ExternalError, InputError, did_you_mean
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.paths import cache_root
from imagebuilder.core.progress import Say, follow, silent
from imagebuilder.core.safepath import safe_join
from imagebuilder.core.untrusted import open_regular
from imagebuilder.hardening.model import PROFILE_PREFIX, cac_name, load_settings
from imagebuilder.release.source import cached_build, cached_output, module_dir

#: how the content is built: part of the cache key (bump it when the CMake options change)
RECIPE = 1
#: CMake's options: the one product's data stream, nothing else (no guides, tables, playbooks, validation)
CMAKE_OPTIONS = ("-DSSG_PRODUCT_DEFAULT=OFF", "-DSSG_ANSIBLE_PLAYBOOKS_ENABLED=OFF", "-DSSG_BASH_SCRIPTS_ENABLED=OFF",
                 "-DSSG_SEPARATE_SCAP_FILES_ENABLED=OFF", "-DSSG_BUILD_DISA_DELTA_FILES=OFF",
                 "-DSSG_SCAP_VALIDATION_ENABLED=OFF", "-DSSG_OVAL_SCHEMATRON_VALIDATION_ENABLED=OFF",
                 "-DSSG_LINKCHECKER_VALIDATION_ENABLED=OFF", "-DSSG_BATS_TESTS_ENABLED=OFF",
                 "-DSSG_SHELLCHECK_BASH_FIXES_VALIDATION_ENABLED=OFF", "-DSSG_JINJA2_CACHE_ENABLED=OFF")  # fmt: skip
#: the largest data stream read (ComplianceAsCode's are 10 to 40 MB)
DATASTREAM_LIMIT = 256 * 1024 * 1024
#: what building the content needs on this host besides Python's jinja2 and yaml (Debian's package names in docs)
BUILD_TOOLS = ("go", "cmake", "make", "xsltproc", "xmllint", "oscap")


@dataclass(frozen=True)
class Content:
    """One product's data stream, and where it came from (recorded in the manifest, the provenance and the SBOM)."""

    product: str
    datastream: Path
    sha256: str
    #: ``github.com/ComplianceAsCode/content v0.1.82 (built from source)`` or ``folder /srv/ssg``
    origin: str
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return {"product": self.product, "datastream": self.datastream.name, "sha256": self.sha256,
                "origin": self.origin, "version": self.version}  # fmt: skip


def content_cache() -> Path:
    return cache_root() / "hardening-content"


def datastream_name(product: str) -> str:
    """``ssg-<product>-ds.xml``, for a product named by the content's own rule."""
    try:
        return f"ssg-{cac_name(product, 'product')}-ds.xml"
    except ValueError as exc:
        raise InputError(str(exc), field="product") from None


def find_content(folder: Path, product: str) -> Content:
    """The data stream of ``product`` in the user's ``folder`` (``--hardening-content``): exit 2 naming what the
    folder does hold when it has none for this product."""
    path = safe_join(folder, datastream_name(product), what="data stream")
    if not path.is_file():
        held_there = sorted(p.name.removeprefix("ssg-").removesuffix("-ds.xml") for p in folder.glob("ssg-*-ds.xml"))
        raise InputError(f"no data stream for {product} ({path.name}) in this folder"
                         + did_you_mean(product, held_there), source=folder, field="--hardening-content",
                         expected="a folder of ComplianceAsCode data streams holding " + path.name
                         + (f" (it holds {', '.join(held_there)})" if held_there else ""))  # fmt: skip
    return Content(product, path, sha256_file(path), f"folder {folder}", _benchmark_version(path))


def _cache_entry(product: str) -> tuple[Path, dict[str, Any], tuple[str]]:
    """(folder, cache key, outputs) of ``product``'s content built from the source release, cached as
    ``release.build`` caches its components (:func:`imagebuilder.release.source.cached_build`)."""
    settings = load_settings().content
    key = {"module": settings.module, "version": settings.version, "product": product, "recipe": RECIPE}
    return content_cache() / f"{settings.version}-{product}", key, (datastream_name(product),)


def _built(product: str, datastream: Path) -> Content:
    settings = load_settings().content
    origin = f"{settings.module} {settings.version} (built from source)"
    return Content(product, datastream, sha256_file(datastream), origin, settings.version)


def built_content(product: str, *, say: Say = silent) -> Content:
    """``product``'s data stream built from the content's source release (config/hardening.yaml), cached."""
    settings = load_settings().content
    folder, key, outputs = _cache_entry(product)
    bin_dir = cached_build(folder, key, outputs,
                           lambda out: _build(settings.module, settings.version, product, out, say))  # fmt: skip
    return _built(product, bin_dir / outputs[0])


def _source_tree(module: str, version: str, product: str) -> Path:
    """The content's source release in the Go module cache (downloaded from the proxy when not there): exit 2 when
    it has no ``product``."""
    try:
        source = module_dir(module, version)
    except ExternalError as exc:
        raise ExternalError(exc.message, hint="check the Go module proxy is reachable (GOPROXY), or give"
                            " --hardening-content a folder of built data streams") from None  # fmt: skip
    if not (source / "products" / product).is_dir():
        offered = sorted(p.name for p in (source / "products").iterdir() if p.is_dir())
        raise InputError(f"ComplianceAsCode {version} has no product {product}" + did_you_mean(product, offered),
                         field="os-release", expected=f"an OS of its products: {', '.join(offered)}")  # fmt: skip
    return source


def check_source_profile(product: str, profile: str) -> str:
    """That the content's source release has ``profile`` for ``product`` (its profile file), without building it:
    a dry run's check. Returns the release's name."""
    settings = load_settings().content
    source = _source_tree(settings.module, settings.version, product)
    offered = sorted(p.name.removesuffix(".profile") for p in (source / "products" / product / "profiles").glob(
        "*.profile"))  # fmt: skip
    if profile not in offered:
        raise InputError(f"the {product} content has no profile {profile}" + did_you_mean(profile, offered),
                         field="--hardening", expected="one of " + ", ".join(offered))  # fmt: skip
    return f"{settings.module} {settings.version}"


def _build(module: str, version: str, product: str, out: Path, say: Say) -> None:
    """Build ``product``'s data stream into ``out`` (a fresh folder of the cache entry)."""
    tools = require_tools(*BUILD_TOOLS)
    say(f"hardening content: downloading {module}@{version} from the Go module proxy")
    source = _source_tree(module, version, product)
    tree = out.parent / "src"
    shutil.copytree(source, tree, symlinks=True)  # the module cache is read-only; CMake writes into the tree
    for path in (tree, *tree.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)
    build = tree / "build"
    build.mkdir(exist_ok=True)
    log = out.parent / "build.log"
    option = f"-DSSG_PRODUCT_{product.upper()}=ON"
    say(f"hardening content: building the {product} data stream (CMake, about two minutes)")
    # this Python (the tool's own environment holds jinja2 and yaml), not whichever python3 is first on PATH
    steps = (["cmake", "..", *CMAKE_OPTIONS, option, f"-DPython_EXECUTABLE={sys.executable}"],
             ["make", f"-j{os.cpu_count() or 1}", f"{product}-content"])  # fmt: skip
    for args in steps:
        with log.open("a") as fh:
            code = follow([tools.get(args[0], args[0]), *args[1:]], cwd=build, env=dict(os.environ), log=fh,
                          redact=lambda s: s, say=say, pick=_progress)  # fmt: skip
        if code != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
            raise ExternalError(f"building the {product} content failed (exit {code}): {tail}",
                                hint=f"the whole output is in {log}; the build needs cmake, make, xsltproc,"
                                     " xmllint and oscap (./scripts/setup.sh installs them)")  # fmt: skip
    made = build / datastream_name(product)
    if not made.is_file():
        raise ExternalError(f"the content build made no {made.name}", hint=f"read {log}")
    os.replace(made, out / made.name)
    shutil.rmtree(tree)  # the data stream is what is kept: 15 MB, not the 400 MB tree


def _progress(line: str) -> str | None:
    """CMake's and make's progress lines (``[ 42%] ...``) as progress, the rest only in the log."""
    return f"hardening content: {line[:80]}" if line.startswith("[") else None


#: where a mirror (``mirror.create --hardening-product``) keeps the data streams, beside the release's files
MIRROR_FOLDER = "hardening-content"


def available_content(product: str, folder: Path | None, mirror: Mirror | None = None) -> Content | None:
    """The data stream a hardened build of ``product`` uses when it needs no build: the user's folder's; else a
    directory ``mirror``'s when it carries one (an air-gapped site's, made by ``mirror.create
    --hardening-product``); else the cache's, built from the source release before. None: it must be built."""
    if folder is not None:
        return find_content(folder, product)
    carried = Path(mirror.base) / MIRROR_FOLDER if mirror is not None and mirror.is_local else None
    if carried is not None and (carried / datastream_name(product)).is_file():
        found = find_content(carried, product)
        return Content(product, found.datastream, found.sha256, f"mirror {carried.parent}", found.version)
    cached = cached_output(*_cache_entry(product))
    return _built(product, cached / datastream_name(product)) if cached is not None else None


def content_for(product: str, folder: Path | None, *, mirror: Mirror | None = None, say: Say = silent) -> Content:
    """:func:`available_content`, else the source release's, built now and cached."""
    return available_content(product, folder, mirror) or built_content(product, say=say)


def copy_to_mirror(dest: Path, products: list[str], folder: Path | None, *, say: Say = silent) -> list[Content]:
    """``products``' data streams (from ``folder``, else built from the source release) copied into the mirror at
    ``dest``, where a build with ``--mirror`` finds them; a copy already there with the same bytes is kept."""
    out = []
    for product in products:
        content = find_content(folder, product) if folder is not None else built_content(product, say=say)
        target = dest / MIRROR_FOLDER / datastream_name(product)
        if not (target.is_file() and sha256_file(target) == content.sha256):
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_regular(content.datastream, "data stream") as src, atomic_write(target, "wb") as fh:
                shutil.copyfileobj(src, fh, 4 << 20)
        out.append(content)
    return out


_PROFILE_LINE = re.compile(r"^" + re.escape(PROFILE_PREFIX) + r"([a-z0-9_.-]+):(.*)$")


def profiles(content: Content) -> dict[str, str]:
    """The profiles ``content`` offers: short name -> title (``oscap info --profiles``)."""
    oscap = require_tools("oscap")["oscap"]
    proc = subprocess.run([oscap, "info", "--profiles", str(content.datastream)], capture_output=True, text=True,
                          check=False, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        raise InputError(f"OpenSCAP cannot read it: {proc.stderr.strip()[-300:]}", source=content.datastream,
                         expected="a SCAP 1.3 source data stream")  # fmt: skip
    found = {}
    for line in proc.stdout.splitlines():
        match = _PROFILE_LINE.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def check_profile(content: Content, profile: str) -> str:
    """``profile``'s title; exit 2 naming the profiles the content offers when it has no such profile."""
    offered = profiles(content)
    if profile not in offered:
        raise InputError(f"the {content.product} content has no profile {profile}" + did_you_mean(profile, offered),
                         field="--hardening", expected="one of " + ", ".join(sorted(offered)))  # fmt: skip
    return offered[profile]


_VERSION = re.compile(rb"<(?:[\w.-]+:)?version(?:\s[^>]*)?>([0-9][0-9A-Za-z.+~-]{0,40})</(?:[\w.-]+:)?version>")


def _benchmark_version(datastream: Path) -> str | None:
    """The benchmark's version (``0.1.82``), from the first ``version`` element of the data stream's head."""
    with open_regular(datastream, "data stream", field="--hardening-content") as fh:
        head = fh.read(1 << 20)
    match = _VERSION.search(head)
    return match.group(1).decode() if match else None
