"""``nutanix.image-upload`` (spec 4.3, issue 17): the v3 REST client against a Prism Central v3 **contract server**
(tests/support/nutanix.py: no Nutanix simulator exists; the server checks authentication and every request's
shape against the v3 API's documented intents). A contract test, labelled as such in docs/providers.md."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import killed_at, run
from tests.support.nutanix import PASSWORD, USER, Prism, prism_server

CLOUD_IMAGE = "https://cloud-images.ubuntu.com/releases/22.04/release/ubuntu-22.04-server-cloudimg-amd64.img"


@pytest.fixture
def prism(tmp_path: Path) -> Iterator[tuple[Path, Prism]]:
    with prism_server(tmp_path) as (port, state):
        config = tmp_path / "nutanix.json"
        config.write_text(json.dumps({
            "nutanix_cluster_name": "PE-Cluster-1", "source_image_name": "ubuntu-2204-cloudimg",
            "nutanix_subnet_name": "vlan-100", "nutanix_endpoint": "127.0.0.1", "nutanix_port": str(port),
            "nutanix_insecure": "true", "nutanix_username": USER, "nutanix_password": PASSWORD,
        }))  # fmt: skip
        yield config, state


def upload(config: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return run("nutanix.image-upload", "--config", str(config), *args, env=env)


def creates(state: Prism) -> int:
    return sum(1 for call in state.calls if call == ("POST", "/images"))


def test_from_a_url_prism_pulls_it_and_a_rerun_changes_nothing(prism: tuple[Path, Prism]) -> None:
    config, state = prism
    res = upload(config, "--url", CLOUD_IMAGE)
    assert res.code == 0 and "image:    ubuntu-2204-cloudimg (" in res.out and "): created" in res.out, res.err
    [image] = state.images.values()
    assert image["spec"]["resources"] == {"image_type": "DISK_IMAGE", "source_uri": CLOUD_IMAGE}
    assert image["status"]["state"] == "COMPLETE", "the task was followed to its end"
    again = upload(config, "--url", CLOUD_IMAGE)
    assert again.code == 0 and "unchanged" in again.out and creates(state) == 1
    assert PASSWORD not in res.out + res.err + again.out + again.err


def test_a_file_is_uploaded_with_its_checksum_and_replaced_only_with_force(
    prism: tuple[Path, Prism], tmp_path: Path
) -> None:
    config, state = prism
    disk = tmp_path / "ubuntu.qcow2"
    disk.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    digest = hashlib.sha256(disk.read_bytes()).hexdigest()
    res = upload(config, "--file", str(disk), "--name", "ubuntu-local")
    assert res.code == 0 and "created" in res.out, res.err
    [(uuid, image)] = state.images.items()
    assert state.uploads[uuid] == disk.read_bytes()
    assert image["spec"]["resources"]["checksum"] == {"checksum_algorithm": "SHA_256", "checksum_value": digest}
    assert upload(config, "--file", str(disk), "--name", "ubuntu-local").out.strip().endswith("unchanged")
    disk.write_bytes(b"another image")
    other = upload(config, "--file", str(disk), "--name", "ubuntu-local")
    assert other.code == 1 and "already in Prism with other content" in other.err and "--force" in other.err
    forced = upload(config, "--file", str(disk), "--name", "ubuntu-local", "--force")
    assert forced.code == 0 and "replaced" in forced.out, forced.err
    assert ("DELETE", f"/images/{uuid}") in state.calls and len(state.images) == 1
    [(new_uuid, _)] = state.images.items()
    assert state.uploads[new_uuid] == b"another image"


def test_a_failed_pull_is_reported_and_the_image_removed(prism: tuple[Path, Prism]) -> None:
    config, state = prism
    res = upload(config, "--url", "https://unreachable.example.com/x.img")
    assert res.code == 1 and "FAILED: Could not access the URL https://unreachable.example.com/x.img" in res.err
    assert not state.images, "what this run created is deleted"


def test_dry_run_creates_nothing(prism: tuple[Path, Prism]) -> None:
    config, state = prism
    res = upload(config, "--url", CLOUD_IMAGE, "--dry-run")
    assert res.code == 0 and "would create" in res.out and not state.images and creates(state) == 0


def test_credentials_and_tls_failures_are_named_without_the_secret(prism: tuple[Path, Prism]) -> None:
    config, _ = prism
    wrong = upload(config, "--url", CLOUD_IMAGE, env={"NUTANIX_PASSWORD": "Wrong-Marker-8812"})
    assert wrong.code == 1 and "Prism answered 401" in wrong.err and "nutanix_username" in wrong.err
    assert "Wrong-Marker-8812" not in wrong.out + wrong.err and PASSWORD not in wrong.err
    strict = json.loads(config.read_text()) | {"nutanix_insecure": "false"}
    config.write_text(json.dumps(strict))
    untrusted = upload(config, "--url", CLOUD_IMAGE)
    assert untrusted.code == 1 and "TLS certificate is not trusted" in untrusted.err, untrusted.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--url", CLOUD_IMAGE, "--file", "x"], "exactly one source"),
        ([], "exactly one source"),
        (["--url", "ftp://images.example.com/x.img"], "--url"),
        (["--url", "https://u:pw-Marker-3@images.example.com/x.img"], "carries credentials"),
        (["--url", CLOUD_IMAGE, "--sha256", "xyz"], "--sha256"),
        (["--file", "/nonexistent/disk.qcow2"], "--file"),
    ],
)
def test_bad_input_exits_2_and_creates_nothing(prism: tuple[Path, Prism], args: list[str], needle: str) -> None:
    config, state = prism
    res = upload(config, *args)
    assert res.code == 2 and needle in res.err and "pw-Marker-3" not in res.err, res.err
    assert not state.calls


def test_a_bad_config_is_named(prism: tuple[Path, Prism], tmp_path: Path) -> None:
    config, state = prism
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(json.loads(config.read_text()) | {"nutanix_prot": "9440"}))
    res = upload(broken, "--url", CLOUD_IMAGE)
    assert res.code == 2 and "nutanix_prot" in res.err and "broken.json" in res.err, res.err
    assert not state.calls


@pytest.mark.parametrize("point", ["created image", "uploaded "])
def test_an_upload_killed_after_a_step_is_completed_by_the_rerun(
    prism: tuple[Path, Prism], tmp_path: Path, point: str
) -> None:
    """Killed (its process group, SIGKILL: no clean-up of its own runs) once Prism has the image but not its data,
    or the data but not the end of its task: the rerun, without --force, completes it. One image, holding the file
    (issue 29)."""
    config, state = prism
    disk = tmp_path / "ubuntu.qcow2"
    disk.write_bytes(os.urandom(1024 * 1024 + 3))
    args = ("nutanix.image-upload", "--config", str(config), "--file", str(disk), "--name", "ubuntu-local")
    killed_at(point, *args)
    [(first, image)] = state.images.items()
    assert (first in state.uploads) == (point == "uploaded "), "killed where the failpoint says"
    res = upload(config, "--file", str(disk), "--name", "ubuntu-local")
    assert res.code == 0, res.out + res.err
    [(uuid, image)] = state.images.items()
    assert state.uploads[uuid] == disk.read_bytes() and image["status"]["state"] == "COMPLETE"
    if point == "created image":
        assert "a stopped run left it without its data" in res.err and res.out.strip().endswith("completed")
    again = upload(config, "--file", str(disk), "--name", "ubuntu-local")
    assert again.code == 0 and again.out.strip().endswith("unchanged") and len(state.images) == 1
