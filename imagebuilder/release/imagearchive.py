"""Container images as docker-archive tarballs, the form ``ctr images import`` and ``docker load`` take and the
distro ships its image tars in (``bin/linux/amd64/kube-apiserver.tar``).

Made here, without a container engine: each layer is a tar of files, the config names the layers' digests, the
archive's ``manifest.json`` names the config, the layers and the image's one reference. Every timestamp, owner and
order is fixed, so the same inputs give the same bytes (and the same checksums in a release manifest).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.core import untrusted

#: PATH inside the images, as distroless images set it
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Entry:
    """One file, folder or symbolic link of a layer: ``data`` None makes a folder, ``link`` a link to it."""

    data: bytes | None
    mode: int = 0o644
    link: str | None = None


def tree_entries(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, Entry]:
    """A folder's files, folders and links as layer entries (paths relative to it), leaving out ``skip`` prefixes."""
    out: dict[str, Entry] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            out[rel] = Entry(None, 0o777, os.readlink(path))
        elif path.is_dir():
            out[rel] = Entry(None, mode)
        elif path.is_file():
            out[rel] = Entry(path.read_bytes(), mode)
    return out


@dataclass(frozen=True)
class ImageSpec:
    ref: str
    layers: tuple[Mapping[str, Entry], ...]
    entrypoint: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    user: str = ""
    #: the platform's architecture (containerd imports an image of the node's own only)
    arch: str = "amd64"


def layer_tar(files: Mapping[str, Entry]) -> bytes:
    """A layer: the files under their paths (parents added as folders), owned by root, mtime 0, sorted."""
    entries: dict[str, Entry] = {}
    for path, entry in files.items():
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            entries.setdefault("/".join(parts[:i]), Entry(None, 0o755))
        entries["/".join(parts)] = entry
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            entry = entries[name]
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid = entry.mode, 0, 0, 0
            if entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


def docker_archive(spec: ImageSpec) -> bytes:
    """The image as one docker-archive tarball (layers uncompressed, as ``docker save`` writes them)."""
    layers = [layer_tar(files) for files in spec.layers]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    container: dict[str, object] = {"Env": [f"PATH={IMAGE_PATH}"], "Labels": dict(spec.labels)}
    if spec.entrypoint:
        container["Entrypoint"] = list(spec.entrypoint)
    if spec.user:
        container["User"] = spec.user
    config = json.dumps(
        {
            "architecture": spec.arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": container,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_names = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [spec.ref], "Layers": layer_names}]).encode()
    files = {"manifest.json": Entry(manifest), config_name: Entry(config)}
    files.update({name: Entry(layer) for name, layer in zip(layer_names, layers, strict=True)})
    return layer_tar(files)


def _archive_manifest(tar: tarfile.TarFile) -> list[dict[str, Any]]:
    """A docker-archive's ``manifest.json``: one entry per image (Config, RepoTags, Layers); empty without one."""
    member = tar.extractfile("manifest.json")
    found = untrusted.parse_json(member.read(), "the image archive's manifest.json") if member is not None else []
    return [image for image in found if isinstance(image, dict)] if isinstance(found, list) else []


def archive_refs(data: bytes) -> list[str]:
    """The references a docker-archive tarball names (its ``manifest.json``'s RepoTags)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [ref for image in _archive_manifest(tar) for ref in image.get("RepoTags") or []]


def image_config(data: bytes) -> dict[str, object]:
    """The image configuration a docker-archive tarball carries (its first image's ``Config``: ``architecture``,
    ``os``, ``config``...); empty when it has none."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        images = _archive_manifest(tar)
        config = tar.extractfile(images[0]["Config"]) if images else None
        found = untrusted.parse_json(config.read(), "the image archive's config") if config is not None else {}
    return found if isinstance(found, dict) else {}
