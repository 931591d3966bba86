"""The digests that name what a build is made of: the build's inputs (recorded in its build manifest, so that
``build.matrix`` can skip an output already built from them) and an OS layer's inputs (its cache key).

Both are SHA-256 over canonical JSON, and both include the bundle files that act on the image, so a changed role
or template is a changed input.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from imagebuilder import __version__
from imagebuilder.core.paths import BUNDLE
from imagebuilder.customization.model import Customization
from imagebuilder.image.reproducible import hash_seed
from imagebuilder.plan.config import SourceImageFields
from imagebuilder.plan.model import BuildPlan

#: the roles (and playbook) whose files make the OS layer; a change to any of them makes a new layer
LAYER_ROLES = ("setup", "node", "redhat_subscription")
#: how an OS layer's filesystem is laid out (2: afresh from its tree, the base its images' changes are applied to);
#: a layer of another layout is never a base
LAYER_LAYOUT = 2


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _files_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(p for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file()):
            if "__pycache__" in f.parts:
                continue
            h.update(str(f.relative_to(BUNDLE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def layer_inputs(plan: BuildPlan) -> dict[str, Any]:
    """Everything the OS layer of ``plan`` is made of (its cache key is their digest)."""
    config = plan.config
    assert isinstance(config, SourceImageFields) and config.source_image_checksum
    roles = BUNDLE / "ansible" / "roles"
    return {
        "image-builder": __version__,
        "source_image_checksum": config.source_image_checksum,
        "os": plan.os,
        "os_version": plan.os_version.version,
        "firmware": plan.firmware,
        "arch": plan.arch,
        "disk_gb": plan.disk_gb,
        "layout": LAYER_LAYOUT,
        "roles": _files_digest(
            [*(BUNDLE / "ansible" / f"node{p}.yml" for p in ("", "-provision")), *(roles / r for r in LAYER_ROLES)]
        ),
    }


#: the plan's keys that say where things are, not what they are: a rebuild elsewhere has other values of these
_LOCATIONS = frozenset({"workspace", "steps", "engine_reason", "warnings", "fetch_from", "mirror", "path", "source",
                        "source_image_url", "config_file"})  # fmt: skip


def _without_locations(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_locations(v) for k, v in data.items() if k not in _LOCATIONS}
    if isinstance(data, list):
        return [_without_locations(v) for v in data]
    return data


def _build_digest(plan_data: dict[str, Any], bundle: str, customization: Customization | None) -> str:
    return digest({
        "plan": plan_data,
        "bundle": bundle,
        "customization": customization.summary() if customization else None,
        "image-builder": __version__,
    })  # fmt: skip


def _bundle_digest() -> str:
    return _files_digest([BUNDLE / "ansible", BUNDLE / "packer", BUNDLE / "cloud-init", BUNDLE / "templates"])


def build_digests(plan: BuildPlan, customization: Customization | None) -> tuple[str, str]:
    """(:func:`inputs_digest`, :func:`content_digest`) of one build, the bundle's files read once for both."""
    data = plan.to_json()
    bundle = _bundle_digest()
    inputs = {k: v for k, v in data.items() if k not in ("workspace", "steps", "engine_reason")}
    return _build_digest(inputs, bundle, customization), _build_digest(_without_locations(data), bundle, customization)


def content_digest(plan: BuildPlan, customization: Customization | None) -> str:
    """What the image is made of, by content only: :func:`inputs_digest` without any path, folder or mirror (the
    source image and the release are named by their checksums). Two builds of the same inputs in different folders
    or from another copy of the mirror have the same one: a reproducible image's hash seed is made from it."""
    return build_digests(plan, customization)[1]


def inputs_digest(plan: BuildPlan, customization: Customization | None) -> str:
    """What decides a build's output, as one digest the build manifest records: the plan (without where it runs),
    the bundle's templates and roles, the customization (without its secrets: a changed password alone is not
    seen, rebuild with ``--force``), and this tool's version."""
    return build_digests(plan, customization)[0]


def layer_seed(plan: BuildPlan, content_sha256: str) -> str:
    """The hash seed of a reproducible image's filesystem: its OS layer's, made from the layer's inputs (the
    image's filesystem is the layer's, changed); an image whose source has no checksum has no shareable layer and
    takes its own inputs'."""
    config = plan.config
    if isinstance(config, SourceImageFields) and config.source_image_checksum:
        return hash_seed(digest(layer_inputs(plan)))
    return hash_seed(content_sha256)
