"""Names from outside never write outside the destination: bundle manifest entries, artifact URIs, archive members.

Real servers on 127.0.0.1 serve the hostile manifests; the tasks run as root here, so a name that escaped would
really be written where it points. Each case checks the places it would have landed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from tests.support.common import make_manifest
from tests.support.hostile_names import HOSTILE_NAMES, bundle
from tests.support.inproc import cli


@pytest.mark.parametrize("name", [n for n in HOSTILE_NAMES if n])  # an empty name falls back to the URI's
def test_hook_entry_names_stay_inside_dest(tmp_path: Path, served: tuple[Path, str], name: str) -> None:
    root, base = served
    data = b"kernel bytes\n"
    (root / "hook.bin").write_bytes(data)
    manifest = tmp_path / "bundle.yaml"
    manifest.write_text(bundle(base, name, data))
    dest = tmp_path / "a" / "b" / "hook"
    for dry in (["--dry-run"], []):
        res = cli("download.hook", "--manifest", str(manifest), "--dest", str(dest), *dry)
        assert res.code == 2, (name, res.text)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents and p.read_bytes() == data]
    assert not written, written
    assert not Path("/abs/x").exists()


@pytest.mark.parametrize("uri_path", ["../../escaped.tar.gz", "a/../../../escaped.tar.gz", "%2e%2e/%2e%2e/e.tar.gz"])
def test_mirror_artifact_uris_stay_inside_dest(tmp_path: Path, served: tuple[Path, str], uri_path: str) -> None:
    _root, _base = served
    text = make_manifest("1-24", 36, "v1.24.17")
    doc = yaml.safe_load(text)
    assets = [a for c in doc["status"]["components"] for a in c["assets"]]
    asset = next(a for a in assets if a.get("archive") and a.get("os") == "linux" and "amd64" in a.get("arch", []))
    data = b"tarball\n"
    asset["archive"]["uri"] = f"https://distro.eks.amazonaws.com/{uri_path}"
    asset["archive"]["sha256"] = hashlib.sha256(data).hexdigest()
    src = tmp_path / "source"  # a directory mirror holding the hostile manifest at the channel's upstream path
    manifest = src / "kubernetes-1-24" / "kubernetes-1-24-eks-36.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(yaml.safe_dump(doc))
    (src / "escaped.tar.gz").write_bytes(data)
    (tmp_path / "escaped.tar.gz").write_bytes(b"before")
    dest = tmp_path / "deep" / "er" / "mirror"
    res = cli("mirror.create", "--release-channel", "1-24", "--dest", str(dest), "--source", str(src))
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and src not in p.parents and dest not in p.parents]
    assert [p.name for p in outside] == ["escaped.tar.gz"] and outside[0].read_bytes() == b"before"
    if ".." in uri_path and "%2e" not in uri_path:
        assert res.code == 2, res.text
        assert "climbs out" in res.err
