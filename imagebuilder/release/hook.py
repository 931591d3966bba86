"""``download.hook``: the bare-metal boot kernel and ramdisk (spec 1.8, 4.5) of the product bundle.

The bundle manifest (``Bundles``, number from the profile) names them: ``tinkerbell.tinkerbellStack.hook.vmlinuz``
and ``.initramfs``, x86_64 (``amd``) entries with a ``uri``. Each is downloaded verified, with the ``sha256``/
``sha512`` its entry gives, or else the checksum file published beside it (``<uri>.sha256``/``.sha512``); a file
nothing vouches for is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.core import fetch, grammar, progress
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Expected
from imagebuilder.core.files import parse_yaml_documents
from imagebuilder.core.progress import Transfers
from imagebuilder.core.safepath import safe_join
from imagebuilder.release.profile import load_profile

HOOK_KEYS = ("vmlinuz", "initramfs")


@dataclass(frozen=True)
class Asset:
    name: str
    uri: str
    hashes: dict[str, str]


def manifest_url() -> str:
    p = load_profile()
    return f"https://{p.hosts.assets}/releases/bundles/{p.versions.bundle}/manifest.yaml"


def hook_assets(text: str, source: str) -> list[Asset]:
    """The x86_64 kernel and ramdisk of the newest versions bundle that has them."""
    docs = parse_yaml_documents(text, source)
    bundles = _dig(docs[0], "spec", "versionsBundles") if docs else None
    if not isinstance(bundles, list):
        raise InputError("not a bundle manifest (no spec.versionsBundles)", source=source)
    found: list[Asset] = []
    for vb in reversed(bundles):
        hook = _dig(vb, "tinkerbell", "tinkerbellStack", "hook")
        if not isinstance(hook, dict):
            continue
        for key in HOOK_KEYS:
            entry = _dig(hook, key, "amd")
            field = f"...hook.{key}.amd"
            if not isinstance(entry, dict) or not isinstance(entry.get("uri"), str):
                raise InputError(f"no x86_64 {key} entry", source=source, field=f"{field}.uri")
            try:
                uri = grammar.url(entry["uri"], ("http", "https")).geturl()
            except ValueError as exc:
                raise InputError(str(exc), source=source, field=f"{field}.uri") from None
            hashes: dict[str, str] = {}
            for alg, length in (("sha256", 64), ("sha512", 128)):
                value = entry.get(alg)
                if value in (None, ""):
                    continue
                if not isinstance(value, str) or not re.fullmatch(rf"[0-9a-fA-F]{{{length}}}", value):
                    raise InputError(
                        "not a hex digest", source=source, field=f"{field}.{alg}", expected=f"{length} hex"
                    )
                hashes[alg] = value.lower()
            name = entry.get("name") or uri.rsplit("/", 1)[-1]
            if not isinstance(name, str):
                raise InputError(f"got {name!r}", source=source, field=f"{field}.name", expected="a file name")
            found.append(Asset(name, uri, hashes))
        return found
    raise InputError("no versions bundle carries the tinkerbell hook", source=source, field="spec.versionsBundles")


def _dig(data: Any, *keys: str) -> Any:
    for k in keys:
        data = data.get(k) if isinstance(data, dict) else None
    return data


def _sidecar(uri: str) -> dict[str, str]:
    """The digest a checksum file published beside ``uri`` gives for it (``.sha512`` first), read as every published
    checksum file is (:func:`grammar.digest_in_sums`): one that vouches for nothing is not taken."""
    name = uri.rsplit("/", 1)[-1]
    for alg in ("sha512", "sha256"):
        data = fetch.read_optional(f"{uri}.{alg}")
        digest = grammar.digest_in_sums(data.decode(errors="replace"), name, alg) if data is not None else None
        if digest:
            return {alg: digest}
    return {}


def load_hook_assets(source: str | None) -> list[Asset]:
    """The hook assets of the manifest at ``source`` (a file or URL; default: the profile's bundle)."""
    where = source or manifest_url()
    return hook_assets(fetch.read(where, timeout=30, what="bundle manifest").decode(errors="replace"), where)


def destinations(dest: Path, assets: list[Asset]) -> list[Path]:
    """Where each asset goes: inside ``dest`` whatever the manifest names it (the dry run checks the same)."""
    return [safe_join(dest, asset.name, what="hook file name") for asset in assets]


def download_hook(dest: Path, assets: list[Asset], transfers: Transfers | None = None) -> list[Path]:
    paths = []
    for asset, target in zip(assets, destinations(dest, assets), strict=True):
        hashes = asset.hashes or _sidecar(asset.uri)
        if not hashes:
            raise ExternalError(
                f"nothing vouches for {asset.uri}: the manifest gives no checksum and none is published beside it",
                hint="use a bundle manifest that lists sha256/sha512 for the hook files",
            )
        paths.append(
            fetch.download(
                asset.uri,
                target,
                Expected(None, hashes),
                progress=progress.start(transfers, asset.name),
            )
        )
    return paths
