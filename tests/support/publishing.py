"""Helpers of the publishing tests: an image's companions written by the library exactly as a build writes them
(the build path itself is checked in tests/integration/test_chroot_engine.py, where the matrix's real images are
published), the repository CLI, and tuftool, the TUF client Bottlerocket's own tooling uses."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imagebuilder.attest import provenance, sbom
from imagebuilder.attest.keys import load_signer
from imagebuilder.attest.packages import Inventory, parse_dpkg_status
from imagebuilder.core.files import sha256_file
from tests.support.common import BIN, ROOT, stop

#: installed by ./scripts/setup.sh --test (cargo, cached under ~/.cache); a test that needs it fails when it is missing
TUFTOOL = Path(os.environ.get("TUFTOOL", str(ROOT / ".tools" / "bin" / "tuftool")))

STATUS = """Package: containerd
Status: install ok installed
Architecture: amd64
Version: 1.6.20~ds1-1+b1

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def companions(image: Path, key: Path | None) -> None:
    """``image``'s .sha256, SBOM and provenance (signed by ``key``, else unsigned), as
    :func:`imagebuilder.builder.attestations.write_attestations` writes them after a build."""
    sha = sha256_file(image)
    image.with_name(image.name + ".sha256").write_text(f"{sha}  {image.name}\n")
    stem = image.name.removesuffix(".gz")
    inventory = Inventory("deb", "ubuntu", "22.04", tuple(parse_dpkg_status(STATUS)))
    doc_path = image.with_name(f"{stem}.spdx.json")
    doc_path.write_text(json.dumps(sbom.document(name=image.name, sha256=sha, inventory=inventory)))
    now = dt.datetime.now(dt.UTC)
    statement = provenance.statement(
        image=image, sha256=sha, parameters={"os": "ubuntu", "provider": "baremetal"}, dependencies=[],
        tools={"image-builder": "test"}, invocation=f"{stem}-test", started=now, finished=now, sbom=doc_path,
    )  # fmt: skip
    envelope = provenance.sign(statement, load_signer(key)) if key else provenance.unsigned(statement)
    provenance.write(image.with_name(stem + provenance.SUFFIX), envelope)


def make_image(folder: Path, name: str, key: Path | None, size: int = 200 * 1024) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    image = folder / f"{name}.gz"
    image.write_bytes(os.urandom(size))
    companions(image, key)
    return image


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "image-builder"), *args], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})}, timeout=600)  # fmt: skip


def tuftool_download(root: Path, metadata: str, targets: str, name: str, out: Path) -> subprocess.CompletedProcess[str]:
    assert TUFTOOL.is_file(), f"tuftool is missing at {TUFTOOL}: run ./scripts/setup.sh --test"
    return subprocess.run([str(TUFTOOL), "download", "-r", str(root), "-m", metadata, "-t", targets, "-n", name,
                           str(out)], capture_output=True, text=True, check=False, timeout=300)  # fmt: skip


def public_bucket(env: dict[str, str], bucket: str) -> Any:
    """A bucket of the moto server ``env`` points at whose objects everyone may read (a bucket policy, as a site
    publishing to many servers sets it); returns a boto3 client of it."""
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    client.create_bucket(Bucket=bucket)
    statement = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [statement]}))
    return client


@contextlib.contextmanager
def serving_repo(folder: Path) -> Iterator[dict[str, str]]:
    """``image-builder serve --repo FOLDER`` on 127.0.0.1; yields what it printed (metadata URL, targets URL, each
    osImageURL), and stops it after."""
    from tests.support.vcsim import free_port

    args = [
        str(BIN / "image-builder"),
        "serve",
        "--repo",
        str(folder),
        "--bind",
        "127.0.0.1",
        "--port",
        str(free_port()),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("serving "), first
        values = {}
        while line := proc.stdout.readline().strip():
            key, _, value = line.partition(": ")
            values[key] = value
            if key.startswith("osImageURL") or len(values) >= 3:
                break
        yield values
    finally:
        stop(proc)
