"""Issue 64: a repository task killed at any moment (SIGKILL, as a reboot or the out-of-memory killer kills it, at a
failpoint of its own progress: ``IMAGE_BUILDER_FAIL_AT``) leaves the repository as clients see it, and its rerun
leaves exactly the files the newest metadata names: ``image.publish``, ``repo.refresh`` and ``repo.rotate``, in a
folder and in S3 (moto in server mode on 127.0.0.1). After each kill python-tuf's client (``download.image``) and
tuftool read the repository as it is; the rerun succeeds, removes what the killed writer left (its temporary files,
its open multipart upload, its lock object) and both clients read the new state."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.moto import moto_server
from tests.support.publishing import cli, make_image, public_bucket, serving_repo, tuftool_download

pytestmark = pytest.mark.timeout(1800)
BUCKET, PREFIX = "node-images", "releases"
#: the image published before each kill (both clients must read it at every moment) and the one being published
BEFORE, NEW = "ubuntu-before", "ubuntu-new"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from imagebuilder.attest.keys import generate

    work = tmp_path_factory.mktemp("kills")
    res = cli("repo.keygen", "--dest", str(work / "keys"))
    assert res.returncode == 0, res.stderr
    generate(work / "build.pem")
    generate(work / "targets-new.pem")
    make_image(work / "out", BEFORE, work / "build.pem")
    # over a 4 MiB copy block and over two 5 MiB S3 parts: a kill lands inside its copy or its upload
    make_image(work / "out", NEW, work / "build.pem", size=12 * 1024 * 1024 + 5)
    return work


def _publish(work: Path, repo: str, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli("image.publish", "--image", str(work / "out" / f"{name}.gz"), "--repo", repo, "--keys",
               str(work / "keys"), "--public-key", str(work / "build.pem.pub"), env=env)  # fmt: skip


def _refresh(work: Path, repo: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli("repo.refresh", "--repo", repo, "--keys", str(work / "keys"), "--targets", env=env)


def _rotate(work: Path, repo: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli("repo.rotate", "--repo", repo, "--keys", str(work / "keys"), "--role", "targets", "--new-key",
               str(work / "targets-new.pem"), env=env)  # fmt: skip


def _named(read: Any) -> set[str]:
    """Every file the newest metadata names: each version of root, targets and snapshot up to the newest (consistent
    snapshots keep them), the timestamp, and each target under its hash-prefixed name."""
    timestamp = json.loads(read("metadata/timestamp.json"))["signed"]
    snap_v = timestamp["meta"]["snapshot.json"]["version"]
    snapshot = json.loads(read(f"metadata/{snap_v}.snapshot.json"))["signed"]
    targets_v = snapshot["meta"]["targets.json"]["version"]
    targets = json.loads(read(f"metadata/{targets_v}.targets.json"))["signed"]["targets"]
    root_v = 1
    while read(f"metadata/{root_v + 1}.root.json") is not None:
        root_v += 1
    names = {"metadata/timestamp.json"}
    names |= {f"metadata/{v}.root.json" for v in range(1, root_v + 1)}
    names |= {f"metadata/{v}.snapshot.json" for v in range(1, snap_v + 1)}
    names |= {f"metadata/{v}.targets.json" for v in range(1, targets_v + 1)}
    names |= {f"targets/{info['hashes']['sha256']}.{name}" for name, info in targets.items()}
    return names


class Folder:
    """A folder repository, each case on a copy of the one made once."""

    def __init__(self, path: Path) -> None:
        self.path, self.repo, self.env = path, str(path), {}

    def read(self, name: str) -> bytes | None:
        return (self.path / name).read_bytes() if (self.path / name).is_file() else None

    def files(self) -> set[str]:
        return {str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file()}

    def left(self) -> set[str]:
        """What a killed writer left: its temporary files."""
        return {f for f in self.files() if Path(f).name.startswith(".")}

    def clients_read(self, work: Path, root: Path, name: str, where: Path) -> None:
        _both_clients(self.repo, self.path.joinpath("metadata").as_uri(), self.path.joinpath("targets").as_uri(),
                      work, root, name, where)  # fmt: skip


class Bucket:
    """A repository under a prefix of a moto bucket, each case under a prefix of its own."""

    def __init__(self, env: dict[str, str], client: Any, prefix: str) -> None:
        self.env, self.client, self.prefix = env, client, prefix
        self.repo = f"s3://{BUCKET}/{prefix}"

    def read(self, name: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=BUCKET, Key=f"{self.prefix}/{name}")["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def files(self) -> set[str]:
        found = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{self.prefix}/"):
            found |= {o["Key"].removeprefix(f"{self.prefix}/") for o in page.get("Contents", [])}
        return found

    def uploads(self) -> list[str]:
        listed = self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{self.prefix}/").get("Uploads", [])
        return [u["Key"] for u in listed]

    def left(self) -> set[str]:
        """What a killed writer left: its open uploads and its lock object."""
        return {f"upload {k}" for k in self.uploads()} | {f for f in self.files() if Path(f).name.startswith(".")}

    def clients_read(self, work: Path, root: Path, name: str, where: Path) -> None:
        url = f"{self.env['AWS_ENDPOINT_URL']}/{BUCKET}/{self.prefix}"
        _both_clients(url, f"{url}/metadata", f"{url}/targets", work, root, name, where)


def _both_clients(repo: str, metadata: str, targets: str, work: Path, root: Path, name: str, where: Path) -> None:
    """python-tuf's client and tuftool, each from the first root alone, download ``name`` and get its bytes."""
    want = (work / "out" / name).read_bytes()
    # its trusted metadata, per repository, kept in the workspace
    got = cli("download.image", "--repo", repo, "--root", str(root), "--target", name, "--dest", str(where / "py"),
              env={"IMAGE_BUILDER_WORKSPACE": str(work / "ws")})  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    assert (where / "py" / name).read_bytes() == want
    tt = tuftool_download(root, metadata, targets, name, where / "tt")
    assert tt.returncode == 0, tt.stderr
    assert (where / "tt" / name).read_bytes() == want


#: where each task is killed: a step of its own progress (its failpoints), in the order it reaches them
PUBLISH_FOLDER = ("copying targets/", "copied targets/", "writing metadata/3.targets.json",
                  "wrote metadata/3.targets.json", "wrote metadata/3.snapshot.json", "writing metadata/timestamp.json",
                  "wrote metadata/timestamp.json")  # fmt: skip
PUBLISH_S3 = ("uploaded part 1 of", "uploaded part 2 of", "wrote metadata/3.targets.json",
              "wrote metadata/3.snapshot.json", "wrote metadata/timestamp.json")  # fmt: skip
REFRESH = ("wrote metadata/3.targets.json", "wrote metadata/3.snapshot.json", "wrote metadata/timestamp.json")
#: a rotation of the targets key: its targets, snapshot and timestamp (signed by the old key and the new), then root
ROTATE = ("wrote metadata/3.targets.json", "wrote metadata/3.snapshot.json", "wrote metadata/timestamp.json",
          "wrote metadata/2.root.json")  # fmt: skip
TASKS = {"image.publish": _publish, "repo.refresh": _refresh, "repo.rotate": _rotate}


def _run(task: str, work: Path, store: Folder | Bucket, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if task == "image.publish":
        return _publish(work, store.repo, NEW, env)
    return TASKS[task](work, store.repo, env)  # type: ignore[operator]


def _kill_and_rerun(task: str, moment: str, work: Path, store: Folder | Bucket, where: Path) -> set[str]:
    """Kill ``task`` at ``moment``; check both clients on what it left and on the rerun's result, and that the rerun
    leaves only what the newest metadata names. Returns what the killed run had left."""
    root = work / "first-root.json"
    killed = _run(task, work, store, {**store.env, "IMAGE_BUILDER_FAIL_AT": moment})
    assert killed.returncode == -9, f"{task} at {moment!r} was not killed: {killed.stdout}{killed.stderr}"
    left = store.left()
    store.clients_read(work, root, f"{BEFORE}.gz", where / "killed")
    rerun = _run(task, work, store, store.env)
    assert rerun.returncode == 0, f"{task} after a kill at {moment!r}: {rerun.stdout}{rerun.stderr}"
    assert not store.left(), f"{task} at {moment!r}: the rerun left {store.left()}"
    assert store.files() == _named(store.read), (
        f"{task} at {moment!r}: not named by the metadata: {store.files() - _named(store.read)}"
    )
    store.clients_read(work, root, f"{NEW if task == 'image.publish' else BEFORE}.gz", where / "rerun")
    return left


def _base(work: Path, repo: str, env: dict[str, str]) -> None:
    """A repository with one image published (the one both clients read at every moment after)."""
    made = cli("repo.init", "--repo", repo, "--keys", str(work / "keys"), env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    res = _publish(work, repo, BEFORE, env)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("task", "moments"), [("image.publish", PUBLISH_FOLDER), ("repo.refresh", REFRESH),
                                                ("repo.rotate", ROTATE)])  # fmt: skip
def test_a_folder_repository_killed_at_each_moment_converges_and_serves_no_temporary_file(
    work: Path, tmp_path: Path, task: str, moments: tuple[str, ...]
) -> None:
    base = tmp_path / "base"
    _base(work, str(base), {})
    shutil.copyfile(base / "metadata" / "1.root.json", work / "first-root.json")
    left_by_kills: dict[str, set[str]] = {}
    for n, moment in enumerate(moments):
        copy = tmp_path / f"repo-{n}"
        shutil.copytree(base, copy)
        store = Folder(copy)
        if task == "image.publish" and moment.startswith("cop"):
            # killed in the middle of the copy: serve never gives the half-written image to anyone
            killed = _run(task, work, store, {"IMAGE_BUILDER_FAIL_AT": moment})
            assert killed.returncode == -9, killed.stdout + killed.stderr
            (temp,) = store.left()
            with serving_repo(copy) as served:
                url = served["targets URL"].rstrip("/") + "/" + Path(temp).name
                import urllib.error
                import urllib.request

                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(url, timeout=30)
                assert refused.value.code == 404
            shutil.rmtree(copy)
            shutil.copytree(base, copy)
        left_by_kills[moment] = _kill_and_rerun(task, moment, work, store, tmp_path / f"dl-{n}")
    if task == "image.publish":
        # the kills inside the copy and before a metadata file's rename each left a temporary file: swept
        for moment in ("copying targets/", "copied targets/", "writing metadata/3.targets.json",
                       "writing metadata/timestamp.json"):  # fmt: skip
            assert len(left_by_kills[moment]) == 1, left_by_kills


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[dict[str, str], Any]]:
    with moto_server() as env:
        client = public_bucket(env, BUCKET)
        yield {**env, "IMAGE_BUILDER_S3_PART_MB": "5"}, client


@pytest.mark.parametrize(("task", "moments"), [("image.publish", PUBLISH_S3), ("repo.refresh", REFRESH),
                                                ("repo.rotate", ROTATE)])  # fmt: skip
def test_an_s3_repository_killed_at_each_moment_converges(
    work: Path, tmp_path: Path, s3: tuple[dict[str, str], Any], task: str, moments: tuple[str, ...]
) -> None:
    env, client = s3
    for n, moment in enumerate(moments):
        store = Bucket(env, client, f"{PREFIX}-{task}-{n}")
        _base(work, store.repo, env)
        (work / "first-root.json").write_bytes(store.read("metadata/1.root.json") or b"")
        left = _kill_and_rerun(task, moment, work, store, tmp_path / f"dl-{n}")
        assert ".image-builder.lock" in left, f"the killed run's lock object: {left}"
        if moment.startswith("uploaded part"):
            assert any(item.startswith("upload ") for item in left), left


def test_every_s3_task_aborts_the_upload_a_killed_publish_left_and_another_host_s_lock_is_refused(
    work: Path, tmp_path: Path, s3: tuple[dict[str, str], Any]
) -> None:
    """A publish killed mid-upload and never rerun: the next write of the repository (a refresh) aborts its upload,
    whose object never became visible. A lock held by a run of another host is never taken: exit 1 naming it, nothing
    written."""
    env, client = s3
    store = Bucket(env, client, f"{PREFIX}-abandoned")
    _base(work, store.repo, env)
    killed = _publish(work, store.repo, NEW, {**env, "IMAGE_BUILDER_FAIL_AT": "uploaded part 2 of"})
    assert killed.returncode == -9 and len(store.uploads()) == 1, killed.stdout + killed.stderr
    assert not any(NEW in f for f in store.files()), "a half-sent object is never visible"
    refreshed = _refresh(work, store.repo, env)
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    assert "an open upload, aborted" in refreshed.stdout and "removed" in refreshed.stdout, refreshed.stdout
    assert not store.uploads() and store.files() == _named(store.read)
    holder = {"host": "build-host-elsewhere", "boot": "x", "run": "4242-s99", "since": "2026-12-07T00:00:00+00:00"}
    client.put_object(Bucket=BUCKET, Key=f"{store.prefix}/.image-builder.lock", Body=json.dumps(holder).encode())
    before = {name: store.read(name) for name in store.files()}
    held = _refresh(work, store.repo, env)
    assert held.returncode == 1 and "is being written by build-host-elsewhere" in held.stderr, held.stderr
    assert "delete s3://node-images/" in held.stderr and "Traceback" not in held.stderr
    assert {name: store.read(name) for name in store.files()} == before, "nothing written under another's lock"
    # a lock object of any content (not JSON, a hostile host name) is another's lock: refused, shown as text only
    for body in (b"\xff\xfe not json", json.dumps({"host": "h\x1b[31m" + "x" * 10000, "run": "1-s1"}).encode()):
        client.put_object(Bucket=BUCKET, Key=f"{store.prefix}/.image-builder.lock", Body=body)
        odd = _refresh(work, store.repo, env)
        assert odd.returncode == 1 and "is being written by" in odd.stderr, odd.stderr
        assert "\x1b" not in odd.stderr and len(odd.stderr) < 1200, odd.stderr


@pytest.mark.parametrize("moment", ["wrote metadata/1.root.json", "writing metadata/1.snapshot.json",
                                    "writing metadata/timestamp.json"])  # fmt: skip
def test_an_init_killed_before_its_timestamp_is_completed_by_the_rerun(work: Path, tmp_path: Path, moment: str) -> None:
    """repo.init killed after its root (the file a user pins) and before its timestamp: the rerun keeps that root,
    byte for byte, writes the rest and sweeps the killed run's temporary file; a client then reads the repository."""
    repo = tmp_path / "repo"
    argv = ("repo.init", "--repo", str(repo), "--keys", str(work / "keys"))
    killed = cli(*argv, env={"IMAGE_BUILDER_FAIL_AT": moment})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    root = (repo / "metadata" / "1.root.json").read_bytes()
    rerun = cli(*argv)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert (repo / "metadata" / "1.root.json").read_bytes() == root, "the root a user may have pinned is kept"
    store = Folder(repo)
    assert not store.left() and store.files() == _named(store.read)
    shutil.copyfile(repo / "metadata" / "1.root.json", tmp_path / "root.json")
    published = _publish(work, str(repo), BEFORE, {})
    assert published.returncode == 0, published.stdout + published.stderr
    store.clients_read(work, tmp_path / "root.json", f"{BEFORE}.gz", tmp_path / "dl")
