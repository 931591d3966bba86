"""Issue 31: TUF repositories images are published to, and read from, with python-tuf's own client (through
download.image, the OS-1 path) and tuftool; S3 is moto in server mode on 127.0.0.1, reached through boto3 by
AWS_ENDPOINT_URL as a user's environment would. The build side (real images, their SBOM and provenance, published
and served) is in tests/integration/test_chroot_engine.py's matrix test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from imagebuilder.attest.keys import generate, load_signer
from imagebuilder.publish import repository as r
from imagebuilder.publish.storage import FolderStore
from tests.support.moto import moto_server
from tests.support.publishing import cli, make_image, public_bucket, serving_repo, tuftool_download

pytestmark = pytest.mark.timeout(900)
SECRET = "s3cr3t-Never-Shown-4411"


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace of its own (the client's trusted metadata lives there), keys for the repository (3 root keys,
    threshold 2) and a build key."""
    monkeypatch.setenv("IMAGE_BUILDER_WORKSPACE", str(tmp_path / "ws"))
    res = cli("repo.keygen", "--dest", str(tmp_path / "keys"), "--roles", "root=3")
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "keys").glob("root-*.pem"))) == 3
    generate(tmp_path / "build.pem")
    return tmp_path


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _init(work: Path, repo: str, env: dict[str, str] | None = None) -> bytes:
    res = cli("repo.init", "--repo", repo, "--keys", str(work / "keys"), "--threshold", "root=2", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    sha = res.stdout.split("root SHA-512: ")[1].split()[0]
    return bytes.fromhex(sha)


def _publish(work: Path, image: Path, repo: str, *extra: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return cli("image.publish", "--image", str(image), "--repo", repo, "--keys", str(work / "keys"),
               "--public-key", str(work / "build.pem.pub"), *extra, env=env)  # fmt: skip


def _download(repo: str, root: Path, target: str, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("download.image", "--repo", repo, "--root", str(root), "--target", target, "--dest", str(dest), *extra)


def test_a_folder_repository_from_init_to_download_by_both_clients(work: Path) -> None:
    repo = work / "repo"
    sha512 = _init(work, str(repo))
    root = repo / "metadata" / "1.root.json"
    assert hashlib.sha512(root.read_bytes()).digest() == sha512
    assert json.loads(root.read_text())["signed"]["roles"]["root"]["threshold"] == 2
    assert len(json.loads(root.read_text())["signatures"]) == 3
    before = _files(repo)
    again = cli("repo.init", "--repo", str(repo), "--keys", str(work / "keys"))
    assert again.returncode == 0 and "unchanged" in again.stdout and _files(repo) == before, "a rerun is a no-op"
    # the same command is a rerun; another threshold is not, and says how it is changed (nothing written)
    same = cli("repo.init", "--repo", str(repo), "--keys", str(work / "keys"), "--threshold", "root=2")
    assert same.returncode == 0 and "unchanged" in same.stdout, same.stdout + same.stderr
    for other in ("root=1", "targets=1,root=3"):
        other_res = cli("repo.init", "--repo", str(repo), "--keys", str(work / "keys"), "--threshold", other)
        assert other_res.returncode == 2 and "--threshold" in other_res.stderr, other_res.stdout + other_res.stderr
        assert "root threshold is 2" in other_res.stderr and "repo.rotate --role root" in other_res.stderr
        assert _files(repo) == before
    a = make_image(work / "out", "ubuntu-a", work / "build.pem")
    res = _publish(work, a, str(repo))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "published: ubuntu-a.gz, ubuntu-a.spdx.json, ubuntu-a.intoto.json" in res.stdout, res.stdout
    stored = next((repo / "targets").glob("*.ubuntu-a.gz"))
    assert stored.name == f"{hashlib.sha256(a.read_bytes()).hexdigest()}.ubuntu-a.gz", "hash-prefixed, as Bottlerocket"
    published = _files(repo)
    res = _publish(work, a, str(repo))
    assert res.returncode == 0 and "already published" in res.stdout and _files(repo) == published, res.stdout
    # a new image bumps targets, snapshot and timestamp
    b = make_image(work / "out", "ubuntu-b", work / "build.pem")
    res = _publish(work, b, str(repo), "--target-name", "ubuntu-1-29-b.gz")
    assert res.returncode == 0 and "versions: snapshot 3, targets 3, timestamp 3" in res.stdout, res.stdout
    assert "published: ubuntu-1-29-b.gz, ubuntu-1-29-b.spdx.json, ubuntu-1-29-b.intoto.json" in res.stdout
    for image, name in ((a, a.name), (b, "ubuntu-1-29-b.gz")):
        got = _download(str(repo), root, name, work / "dl", "--root-sha512", sha512.hex())
        assert got.returncode == 0, got.stdout + got.stderr
        assert (work / "dl" / name).read_bytes() == image.read_bytes()
        tt = tuftool_download(root, repo.joinpath("metadata").as_uri(), repo.joinpath("targets").as_uri(), name,
                              work / f"tt-{name}")  # fmt: skip
        assert tt.returncode == 0, tt.stderr
        assert (work / f"tt-{name}" / name).read_bytes() == image.read_bytes()
    wrong = _download(str(repo), root, "ubuntu-a.gz", work / "dl2", "--root-sha512", "0" * 128)
    assert wrong.returncode == 1 and "not the pinned" in wrong.stderr and not (work / "dl2" / "ubuntu-a.gz").exists()


@pytest.fixture
def s3(work: Path) -> Iterator[dict[str, str]]:
    """moto with a bucket whose objects everyone may read (a bucket policy, as a site publishing to many servers
    sets it); the CLI reaches it through AWS_ENDPOINT_URL and the keys in its environment."""
    with moto_server() as env:
        public_bucket(env, "node-images")
        yield env


def s3_client(env: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def test_s3_publish_resumes_a_killed_upload_and_both_clients_read_it(work: Path, s3: dict[str, str]) -> None:
    env = {**s3, "IMAGE_BUILDER_S3_PART_MB": "5"}
    client = s3_client(s3)
    repo = "s3://node-images/releases"
    _init(work, repo, env)
    image = make_image(work / "out", "ubuntu-big", work / "build.pem", size=12 * 1024 * 1024 + 7)  # 3 parts
    # killed (as an operator's reboot kills it) after its second part: the upload stays open, nothing is signed
    killed = _publish(work, image, repo, env={**env, "IMAGE_BUILDER_FAIL_AT": "uploaded part 2 of"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    uploads = client.list_multipart_uploads(Bucket="node-images").get("Uploads", [])
    assert len(uploads) == 1 and uploads[0]["Key"].endswith(".ubuntu-big.gz")
    timestamp = json.loads(
        client.get_object(Bucket="node-images", Key="releases/metadata/timestamp.json")["Body"].read()
    )
    assert timestamp["signed"]["version"] == 1, "a reader still sees the repository as it was"
    res = _publish(work, image, repo, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resumed (2 of 3 parts were there)" in res.stdout, res.stdout
    assert not client.list_multipart_uploads(Bucket="node-images").get("Uploads")
    key = next(
        o["Key"] for o in client.list_objects_v2(Bucket="node-images")["Contents"] if o["Key"].endswith("big.gz")
    )
    head = client.head_object(Bucket="node-images", Key=key, ChecksumMode="ENABLED")
    assert head["ContentLength"] == image.stat().st_size and head["Metadata"]["sha256"] in key
    # readers use the bucket's HTTP endpoint, as many servers would
    url = f"{s3['AWS_ENDPOINT_URL']}/node-images/releases"
    root = work / "root.json"
    root.write_bytes(client.get_object(Bucket="node-images", Key="releases/metadata/1.root.json")["Body"].read())
    got = _download(url, root, image.name, work / "dl")
    assert got.returncode == 0, got.stdout + got.stderr
    assert (work / "dl" / image.name).read_bytes() == image.read_bytes()
    tt = tuftool_download(root, f"{url}/metadata", f"{url}/targets", image.name, work / "tt")
    assert tt.returncode == 0, tt.stderr
    assert (work / "tt" / image.name).read_bytes() == image.read_bytes()
    # the SBOM and provenance went with it, and the provenance still checks against the downloaded image
    for companion in ("ubuntu-big.spdx.json", "ubuntu-big.intoto.json"):
        assert _download(url, root, companion, work / "dl").returncode == 0
    check = cli("image.verify", "--image", str(work / "dl" / image.name), "--provenance",
                str(work / "dl" / "ubuntu-big.intoto.json"), "--public-key", str(work / "build.pem.pub"))  # fmt: skip
    assert check.returncode == 0 and "[ok  ] signature" in check.stdout, check.stdout + check.stderr


def _sign_write(repo: Path, md: object, name: str, signer: object) -> None:
    from tuf.api.metadata import Metadata
    from tuf.api.serialization.json import JSONSerializer

    assert isinstance(md, Metadata)
    md.signatures.clear()
    md.sign(signer)  # type: ignore[arg-type]
    (repo / "metadata" / name).write_bytes(md.to_bytes(JSONSerializer(compact=False)))


def test_attacks_are_refused_by_our_client_and_by_tuftool(work: Path) -> None:
    import datetime as dt

    repo = work / "repo"
    _init(work, str(repo))
    root = repo / "metadata" / "1.root.json"
    image = make_image(work / "out", "ubuntu-a", work / "build.pem")
    assert _publish(work, image, str(repo)).returncode == 0

    def refused(copy: Path, target: str = image.name) -> tuple[str, str]:
        ours = _download(str(copy), root, target, work / "dl-refused")
        assert ours.returncode == 1 and not (work / "dl-refused" / target).exists(), ours.stdout + ours.stderr
        out = work / f"tt-{len(list(work.glob('tt-*')))}"
        tt = tuftool_download(root, copy.joinpath("metadata").as_uri(), copy.joinpath("targets").as_uri(), target, out)
        assert tt.returncode != 0 and not (out / target).exists(), tt.stdout
        return ours.stderr, tt.stderr

    # a tampered target: the hash-prefixed file's bytes changed
    copy = work / "tampered"
    shutil.copytree(repo, copy)
    stored = next((copy / "targets").glob("*.ubuntu-a.gz"))
    stored.write_bytes(b"evil" + stored.read_bytes()[4:])
    ours, _ = refused(copy)
    assert "failed verification" in ours

    # an expired timestamp (a freeze attack, or a publisher who forgot repo.refresh): the role and the fix are named
    copy = work / "expired"
    shutil.copytree(repo, copy)
    state = r.load(FolderStore(copy))
    state.timestamp.signed.expires = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
    state.timestamp.signed.version += 1
    _sign_write(copy, state.timestamp, "timestamp.json", load_signer(work / "keys" / "timestamp.pem"))
    ours, theirs = refused(copy)
    assert "timestamp metadata has expired" in ours and "repo.refresh" in ours, ours
    assert "xpired" in theirs, theirs
    fixed = cli("repo.refresh", "--repo", str(copy), "--keys", str(work / "keys"))
    assert fixed.returncode == 0, fixed.stderr
    assert _download(str(copy), root, image.name, work / "dl-fixed").returncode == 0

    # a target signed by a revoked key: the targets key is rotated; whoever still holds the old one signs a new
    # targets list (snapshot and timestamp signed by their real keys, as a compromised online host would)
    copy = work / "revoked"
    shutil.copytree(repo, copy)
    generate(work / "targets-new.pem")
    rotated = cli("repo.rotate", "--repo", str(copy), "--keys", str(work / "keys"), "--role", "targets",
                  "--new-key", str(work / "targets-new.pem"))  # fmt: skip
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert _download(str(copy), root, image.name, work / "dl-rotated").returncode == 0, "rotation followed"
    state = r.load(FolderStore(copy))
    evil = work / "evil.gz"
    evil.write_bytes(b"evil image")
    from tuf.api.metadata import MetaFile, TargetFile

    info = TargetFile.from_file("evil.gz", str(evil), ["sha256"])
    state.targets.signed.targets["evil.gz"] = info
    state.targets.signed.version += 1
    (copy / "targets" / info.get_prefixed_paths()[0]).write_bytes(evil.read_bytes())
    _sign_write(copy, state.targets, f"{state.targets.signed.version}.targets.json",
                load_signer(work / "keys" / "targets.pem"))  # fmt: skip
    state.snapshot.signed.meta["targets.json"] = MetaFile(version=state.targets.signed.version)
    state.snapshot.signed.version += 1
    _sign_write(copy, state.snapshot, f"{state.snapshot.signed.version}.snapshot.json",
                load_signer(work / "keys" / "snapshot.pem"))  # fmt: skip
    state.timestamp.signed.snapshot_meta = MetaFile(version=state.snapshot.signed.version)
    state.timestamp.signed.version += 1
    _sign_write(copy, state.timestamp, "timestamp.json", load_signer(work / "keys" / "timestamp.pem"))
    ours, _ = refused(copy, "evil.gz")
    assert "not properly signed" in ours, ours

    # a rollback: this host saw timestamp 3 and snapshot 3; the repository then serves version 2 of both again.
    # (tuftool keeps no metadata between runs, so only a client with a memory can see this; ours keeps it per
    # repository in the workspace)
    b = make_image(work / "out", "ubuntu-b", work / "build.pem")
    old_ts = (repo / "metadata" / "timestamp.json").read_bytes()
    assert _publish(work, b, str(repo)).returncode == 0
    assert _download(str(repo), root, b.name, work / "dl-b").returncode == 0
    (repo / "metadata" / "timestamp.json").write_bytes(old_ts)
    rolled = _download(str(repo), root, image.name, work / "dl-rolled")
    assert rolled.returncode == 1 and "rollback refused" in rolled.stderr, rolled.stderr


def test_a_client_holding_the_first_root_follows_a_root_rotation(work: Path) -> None:
    repo = work / "repo"
    _init(work, str(repo))
    first = repo / "metadata" / "1.root.json"
    generate(work / "root-new.pem")
    rotated = cli("repo.rotate", "--repo", str(repo), "--keys", str(work / "keys"), "--role", "root",
                  "--new-key", str(work / "root-new.pem"))  # fmt: skip
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    two = json.loads((repo / "metadata" / "2.root.json").read_text())
    assert two["signed"]["roles"]["root"]["threshold"] == 1 and len(two["signatures"]) == 4, "3 old + 1 new"
    # the keys folder now holds the new root key in place of the old ones
    for old in (work / "keys").glob("root-*.pem"):
        old.unlink()
    shutil.copy(work / "root-new.pem", work / "keys" / "root.pem")
    image = make_image(work / "out", "ubuntu-a", work / "build.pem")
    assert _publish(work, image, str(repo)).returncode == 0
    got = _download(str(repo), first, image.name, work / "dl")
    assert got.returncode == 0, got.stderr
    tt = tuftool_download(first, repo.joinpath("metadata").as_uri(), repo.joinpath("targets").as_uri(), image.name,
                          work / "tt")  # fmt: skip
    assert tt.returncode == 0 and (work / "tt" / image.name).read_bytes() == image.read_bytes(), tt.stderr


def test_bad_input_exits_2_with_nothing_published(work: Path) -> None:
    repo = work / "repo"
    _init(work, str(repo))
    before = _files(repo)
    image = make_image(work / "out", "ubuntu-a", work / "build.pem")

    def bad(*args: str, keys: Path | None = None, img: Path = image) -> str:
        res = cli("image.publish", "--image", str(img), "--repo", args[0] if args else str(repo),
                  "--keys", str(keys or work / "keys"), *args[1:])  # fmt: skip
        assert res.returncode == 2, res.stdout + res.stderr
        assert _files(repo) == before, "nothing published"
        assert "Traceback" not in res.stderr
        return res.stderr

    # a missing key
    partial = work / "partial-keys"
    partial.mkdir()
    shutil.copy(work / "keys" / "targets.pem", partial)
    assert "no snapshot key" in bad(keys=partial)
    # a key file others may read
    exposed = work / "exposed-keys"
    shutil.copytree(work / "keys", exposed)
    (exposed / "timestamp.pem").chmod(0o644)
    assert "readable by others" in bad(keys=exposed) and "chmod 600" in bad(keys=exposed)
    # an image whose .sha256 does not match
    other = make_image(work / "other", "ubuntu-a", work / "build.pem")
    other.write_bytes(other.read_bytes() + b"x")
    assert ".sha256 says" in bad(img=other)
    # a repository URL with credentials in it: refused, and the secret in no message
    err = bad(f"s3://AKIAEXAMPLE:{SECRET}@node-images/x")
    assert "carries credentials" in err and SECRET not in err
    # a target name that would escape the repository
    for name in ("../../etc/passwd", "ubuntu/x.gz", ".hidden.gz", "..", "a b.gz"):
        assert "is not a target name" in bad(str(repo), "--target-name", name), name
    # a provenance of another image, and one signed by another key
    prov = image.with_name("ubuntu-a.intoto.json")
    saved = prov.read_bytes()
    prov.write_bytes(other.with_name("ubuntu-a.intoto.json").read_bytes())
    assert "is about" in bad()
    prov.write_bytes(saved)
    generate(work / "other.pem")
    assert "is not signed by the key" in bad(str(repo), "--public-key", str(work / "other.pem.pub"))
    # an unsigned provenance (a build given no --signing-key)
    envelope = json.loads(saved)
    envelope["signatures"] = []
    prov.write_text(json.dumps(envelope))
    assert "is not signed" in bad()
    prov.write_bytes(saved)
    # --dry-run checks everything and writes nothing
    dry = cli("image.publish", "--image", str(image), "--repo", str(repo), "--keys", str(work / "keys"), "--dry-run")
    assert dry.returncode == 0 and "not published: --dry-run" in dry.stdout and _files(repo) == before


def test_image_verify_checks_the_provenance_and_the_sbom_it_names(work: Path) -> None:
    image = make_image(work / "out", "ubuntu-a", work / "build.pem")
    prov, pub = image.with_name("ubuntu-a.intoto.json"), work / "build.pem.pub"
    ok = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key", str(pub))
    assert ok.returncode == 0 and "[ok  ] sbom" in ok.stdout, ok.stdout + ok.stderr
    generate(work / "other.pem")
    wrong = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key",
                str(work / "other.pem.pub"))  # fmt: skip
    assert wrong.returncode == 1 and "is not signed by the key" in wrong.stderr
    sbom = image.with_name("ubuntu-a.spdx.json")
    sbom.write_text(sbom.read_text().replace("containerd", "containerd-evil"))
    changed = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key", str(pub))
    assert changed.returncode == 1 and "names the SBOM ubuntu-a.spdx.json" in changed.stderr
    prov.write_text("{not json")
    garbage = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key", str(pub))
    assert garbage.returncode == 2 and "is not a DSSE envelope" in garbage.stderr
    private = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key",
                  str(work / "build.pem"))  # fmt: skip
    assert private.returncode == 2 and "is a private key" in private.stderr


def test_serve_repo_serves_what_both_clients_and_machines_read(work: Path) -> None:

    repo = work / "repo"
    _init(work, str(repo))
    image = make_image(work / "out", "ubuntu-a", work / "build.pem")
    assert _publish(work, image, str(repo)).returncode == 0
    with serving_repo(repo) as values:
        base = values["metadata URL"].removesuffix("/metadata/")
        assert base.startswith("http://127.0.0.1:") and values["targets URL"] == f"{base}/targets/"
        import urllib.request

        with urllib.request.urlopen(values["osImageURL (ubuntu-a.gz)"], timeout=10) as res:
            assert res.read() == image.read_bytes(), "a machine that knows nothing of TUF boots from it"
        got = _download(base, repo / "metadata" / "1.root.json", "ubuntu-a.gz", work / "dl")
        assert got.returncode == 0 and (work / "dl" / image.name).read_bytes() == image.read_bytes(), got.stderr
        tt = tuftool_download(repo / "metadata" / "1.root.json", f"{base}/metadata", f"{base}/targets",
                              "ubuntu-a.gz", work / "tt")  # fmt: skip
        assert tt.returncode == 0, tt.stderr
    # an unsigned edit of the snapshot (its targets entry removed, its signatures kept) is reported as unsigned,
    # before the field it removed is looked for (outside review: an internal error), by publishing and serving alike
    named = json.loads((repo / "metadata" / "timestamp.json").read_text())["signed"]["meta"]["snapshot.json"]
    snapshot = repo / "metadata" / f"{named['version']}.snapshot.json"  # the one the timestamp names
    signed = snapshot.read_bytes()
    edited = json.loads(signed)
    del edited["signed"]["meta"]["targets.json"]
    snapshot.write_text(json.dumps(edited))
    published = _publish(work, image, str(repo))
    assert published.returncode == 1 and "is not signed by the snapshot keys" in published.stderr, published.stderr
    assert "do not publish on top of it" in published.stderr and "Traceback" not in published.stderr
    refused = cli("serve", "--repo", str(repo), "--bind", "127.0.0.1", "--port", "18099")
    assert refused.returncode == 1 and "is not signed by the snapshot keys" in refused.stderr, refused.stderr
    assert "do not serve it" in refused.stderr and "publish" not in refused.stderr.split("try:")[-1]
    snapshot.write_bytes(signed)
    # a damaged repository is not served: refused before anything listens
    (repo / "metadata" / "timestamp.json").write_text("{}")
    damaged = cli("serve", "--repo", str(repo), "--bind", "127.0.0.1", "--port", "18099")
    assert damaged.returncode == 1 and "is not TUF metadata" in damaged.stderr, damaged.stderr
    assert "do not serve it" in damaged.stderr


def test_the_signing_key_is_checked_before_a_build_starts(work: Path) -> None:
    key = work / "build.pem"
    key.chmod(0o640)
    res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run",
              "--offline", "--signing-key", str(key))  # fmt: skip
    assert res.returncode == 2 and "readable by its group" in res.stderr, res.stderr
    env = {"IMAGE_BUILDER_SIGNING_KEY": str(work / "missing.pem")}
    res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--dry-run",
              "--offline", env=env)  # fmt: skip
    assert res.returncode == 2 and "IMAGE_BUILDER_SIGNING_KEY" in res.stderr, res.stderr
    os.environ.pop("IMAGE_BUILDER_SIGNING_KEY", None)


def test_one_key_given_twice_counts_once_toward_a_threshold(work: Path) -> None:
    """Issue 43: two copies of one key are one key to a client. Counted twice, a threshold of 2 would be met on
    the repository's side and never on a client's: the repository would be unusable."""
    repo = work / "repo"
    _init(work, str(repo))
    before = _files(repo)
    generate(work / "targets-new.pem")
    twice = cli("repo.rotate", "--repo", str(repo), "--keys", str(work / "keys"), "--role", "targets",
                "--new-key", str(work / "targets-new.pem"), "--new-key", str(work / "targets-new.pem"),
                "--threshold", "2")  # fmt: skip
    assert twice.returncode == 2 and "--threshold" in twice.stderr and "1 distinct new key" in twice.stderr, twice
    assert "Traceback" not in twice.stderr and _files(repo) == before
    # repo.init: a second file holding a root key already given is that key again
    keys = work / "keys-dup"
    shutil.copytree(work / "keys", keys)
    for extra in ("root-2.pem", "root-3.pem"):
        (keys / extra).unlink()
    shutil.copy(keys / "root-1.pem", keys / "root-9.pem")
    made = cli("repo.init", "--repo", str(work / "repo-dup"), "--keys", str(keys), "--threshold", "root=2")
    assert made.returncode == 2 and "the root threshold is 2, with 1 key(s) given" in made.stderr, made
    assert not (work / "repo-dup").exists()


def test_a_rotation_reports_only_the_keys_it_revoked(work: Path) -> None:
    repo = work / "repo"
    _init(work, str(repo))
    targets_key = work / "keys" / "targets.pem"
    before = _files(repo)
    # to the key the role has: what was asked is done (a rerun), so nothing is written and it succeeds
    same = cli("repo.rotate", "--repo", str(repo), "--keys", str(work / "keys"), "--role", "targets",
               "--new-key", str(targets_key))  # fmt: skip
    assert same.returncode == 0 and "has these keys and this threshold already" in same.stdout, same
    assert _files(repo) == before
    # keeping the key and adding one: the old key is not revoked
    generate(work / "targets-new.pem")
    added = cli("repo.rotate", "--repo", str(repo), "--keys", str(work / "keys"), "--role", "targets",
                "--new-key", str(targets_key), "--new-key", str(work / "targets-new.pem"))  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    assert "revoked targets key(s): none" in added.stdout, added.stdout
    two = json.loads((repo / "metadata" / "2.root.json").read_text())
    kept = load_signer(targets_key, "--new-key").public_key.keyid
    assert kept in two["signed"]["roles"]["targets"]["keyids"] and len(two["signed"]["roles"]["targets"]["keyids"]) == 2
    # to the new key alone: the kept one is revoked, and said so by its ID
    gone = cli("repo.rotate", "--repo", str(repo), "--keys", str(work / "keys"), "--role", "targets",
               "--new-key", str(work / "targets-new.pem"))  # fmt: skip
    assert gone.returncode == 0 and f"revoked targets key(s): {kept[:12]}" in gone.stdout, gone.stdout + gone.stderr
