"""Where a TUF repository lives: a folder, or a bucket of S3-compatible object storage (``s3://bucket/prefix``).

Both keep the same layout (``metadata/<version>.<role>.json``, ``metadata/timestamp.json``,
``targets/<sha256>.<name>``) and give the publisher the same three operations: read a document, write a document
atomically, and upload a target file. What a reader must never see is a timestamp that names files that are not
there yet, so the publisher writes targets first and ``timestamp.json`` last; each write here is atomic on its own
(a rename in a folder, a single PUT in S3).

S3 uploads are multipart with a SHA-256 checksum per part, which the service verifies, and resumable: a run killed
mid-upload leaves its multipart upload open, and the next run lists the parts already there, keeps those whose
checksum (or, where a store lists none, ETag) matches the file, and sends the rest.

A write of the repository (:meth:`Store.writing`) holds the repository's lock (``flock`` on the folder; in S3 a lock
object made only where none is, with the writer's host, boot and run in it) and sweeps what a killed writer left: in a
folder its temporary files in ``targets/`` and ``metadata/`` (``.<name>.<pid>-<random>.tmp``) once their writer is
gone; in S3 the multipart uploads it left open, aborted (an upload this write resumes is kept until it is complete).
A killed writer's S3 lock is taken over by the next writer on the same host once that run is gone; another host's is
never taken: the task exits 1 naming it. The endpoint and credentials
come from the environment as boto3 reads them (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``... or a profile): never
from the repository URL, which is refused when it carries credentials.
"""

from __future__ import annotations

import base64
import datetime as dt
import fcntl
import hashlib
import json
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from imagebuilder.core import faults, grammar, untrusted
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.progress import Advance
from imagebuilder.core.runs import boot_id, gone, run_tag, tag_owner
from imagebuilder.core.safepath import check_relative, safe_join

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: the part size of a multipart upload (S3's minimum is 5 MiB for every part but the last)
PART_BYTES = int(os.environ.get("IMAGE_BUILDER_S3_PART_MB", "8")) * 1024 * 1024
#: what :meth:`Store.upload` did
SENT, ALREADY = "sent", "already there"
#: the S3 lock object, under the repository's prefix (a dot file: ``serve`` never serves one)
LOCK = ".image-builder.lock"


class Store(Protocol):
    """A repository's storage, as the publisher uses it."""

    #: where it is, for messages (never with credentials)
    location: str

    def read(self, name: str) -> bytes | None:
        """The document ``name`` (``metadata/timestamp.json``), or None when it does not exist."""

    def write(self, name: str, data: bytes) -> None:
        """Write a document atomically."""

    def upload(self, name: str, path: Path, sha256: str, progress: Advance | None = None) -> str:
        """Put ``path`` at ``name`` unless it is there already with this digest; returns what happened: ``sent``,
        ``already there``, or ``resumed (<k> of <n> parts were there)``."""

    def writing(self) -> AbstractContextManager[list[str]]:
        """The repository's lock for one write, with what killed writers left swept: a folder's temporary files on
        entry and on a clean exit; S3's open uploads on a clean exit only (this write resumes the one of a file it
        sends again). Yields the list of what was swept, filled in as it is."""


def _key(name: str) -> str:
    return str(check_relative(name, what="a repository path"))


class FolderStore:
    """A repository in a folder (served as it is by ``image-builder serve --repo``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def read(self, name: str) -> bytes | None:
        path = safe_join(self.root, _key(name))
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        with atomic_write(safe_join(self.root, _key(name)), "wb") as fh:
            fh.write(data)
            faults.step(f"writing {name}")
        faults.step(f"wrote {name}")

    def upload(self, name: str, path: Path, sha256: str, progress: Advance | None = None) -> str:
        dest = safe_join(self.root, _key(name))
        if dest.is_file() and dest.stat().st_size == path.stat().st_size and sha256_file(dest) == sha256:
            return ALREADY
        with atomic_write(dest, "wb", uncache=True) as out, path.open("rb") as src:
            while block := src.read(4 * 1024 * 1024):
                out.write(block)
                faults.step(f"copying {name}")
                if progress:
                    progress(len(block))
            faults.step(f"copied {name}")
        return SENT

    @contextmanager
    def writing(self) -> Iterator[list[str]]:
        if not self.root.is_dir():  # repo.init into a new folder: no other writer, nothing left to sweep
            yield []
            return
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel drops it with a killed holder
            swept = self._sweep()
            yield swept
            swept += self._sweep()
        finally:
            os.close(fd)

    def _sweep(self) -> list[str]:
        """Remove the temporary files of writers that are gone (named by the pid of their writer)."""
        from imagebuilder.core.disk import stale_partials

        swept = []
        for folder in ("targets", "metadata"):
            for leftover in stale_partials(self.root / folder):
                with suppress(FileNotFoundError):
                    os.unlink(leftover.name)
                swept.append(f"{folder}/{Path(leftover.name).name}")
        return swept


def _b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


class S3Store:
    """A repository under ``prefix`` in an S3 bucket."""

    def __init__(self, bucket: str, prefix: str, client: S3Client | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = client

    @property
    def client(self) -> S3Client:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")  # endpoint, region and credentials as the user's environment sets them
        return self._client

    def _k(self, name: str) -> str:
        return f"{self.prefix}/{_key(name)}" if self.prefix else _key(name)

    def _fail(self, what: str, exc: Exception) -> ExternalError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
        reason = untrusted.masked(str(exc))
        return ExternalError(
            f"{what} in {self.location} failed: {reason}",
            hint="check the bucket, AWS_ENDPOINT_URL and the credentials in the environment (or AWS_PROFILE)"
            + (f"; the service answered {code}" if code else ""),
        )

    def read(self, name: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._k(name))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._fail(f"reading {name}", exc) from None
        except BotoCoreError as exc:
            raise self._fail(f"reading {name}", exc) from None

    def write(self, name: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._k(name), Body=data, ChecksumSHA256=_b64_sha256(data),
                                   ContentType="application/json", CacheControl="no-cache")  # fmt: skip
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(f"writing {name}", exc) from None
        faults.step(f"wrote {name}")

    @contextmanager
    def writing(self) -> Iterator[list[str]]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            mine = self._lock()
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("taking the repository's lock", exc) from None
        try:
            swept: list[str] = []
            yield swept
            try:
                swept += self._abort_uploads()
            except (BotoCoreError, ClientError) as exc:
                raise self._fail("aborting the uploads killed writers left", exc) from None
        finally:
            with suppress(BotoCoreError, ClientError):
                if mine and self.client.get_object(Bucket=self.bucket, Key=self._k(LOCK))["Body"].read(4096) == mine:
                    self.client.delete_object(Bucket=self.bucket, Key=self._k(LOCK))

    def _lock(self) -> bytes:
        """Make the lock object where none is (a conditional PUT); take over one a gone run of this host left.
        Returns its bytes, or nothing on a store that has no conditional writes (then no lock is held)."""
        from botocore.exceptions import ClientError

        mine = json.dumps({"host": socket.gethostname(), "boot": boot_id(), "run": run_tag(),
                           "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}).encode()  # fmt: skip
        for _ in range(2):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._k(LOCK), Body=mine, IfNoneMatch="*")
                return mine
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code in ("NotImplemented", "501"):  # a store without conditional writes: no lock to take
                    return b""
                if code not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    raise
            try:
                held = self.client.get_object(Bucket=self.bucket, Key=self._k(LOCK))["Body"].read(4096)
            except ClientError:
                continue  # released meanwhile
            try:
                holder = untrusted.parse_json(held, f"{self.location}/{LOCK}")
            except InputError:
                holder = None
            holder = holder if isinstance(holder, dict) else {}
            owner = tag_owner(str(holder.get("run", "")))
            here = holder.get("host") == socket.gethostname()
            if here and owner is not None and (holder.get("boot") != boot_id() or gone(*owner)):
                self.client.delete_object(Bucket=self.bucket, Key=self._k(LOCK))  # its writer is gone
                continue
            who = untrusted.shown(f"{holder.get('host')} (run {holder.get('run')}, since {holder.get('since')})")
            raise ExternalError(f"{self.location} is being written by {who}",
                                hint=f"wait for that run to end; if it is gone (its host rebooted or was lost),"
                                f" delete {self.location}/{LOCK} and run again")  # fmt: skip
        raise ExternalError(f"could not take the lock of {self.location}", hint="run again")

    def _abort_uploads(self) -> list[str]:
        """Abort every multipart upload open under the prefix (under the lock, after this write's own are complete,
        no live writer has one): a killed writer's parts are stored, and billed, until they are."""
        swept = []
        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base):
            for upload in page.get("Uploads", []):
                key = str(upload.get("Key", ""))
                if not key.startswith(base):
                    continue
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"])
                swept.append(f"{key.removeprefix(base)} (an open upload, aborted)")
        return swept

    def _existing(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return dict(self.client.head_object(Bucket=self.bucket, Key=key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def upload(self, name: str, path: Path, sha256: str, progress: Advance | None = None) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._k(name)
        size = path.stat().st_size
        try:
            head = self._existing(key)
            if head and head.get("ContentLength") == size and head.get("Metadata", {}).get("sha256") == sha256:
                return ALREADY
            if size <= PART_BYTES:  # one part's worth goes in one PUT
                data = path.read_bytes()
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ChecksumSHA256=_b64_sha256(data),
                                       Metadata={"sha256": sha256})  # fmt: skip
                if progress:
                    progress(size)
                return SENT
            return self._multipart(key, path, sha256, progress)
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(f"uploading {name}", exc) from None

    def _open_upload(self, key: str, sha256: str) -> tuple[str, dict[int, dict[str, Any]]]:
        """An upload of ``key`` a killed run left (its parts by number), else a new one."""
        found = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=key).get("Uploads", [])
        mine = sorted((u for u in found if u.get("Key") == key), key=lambda u: str(u.get("Initiated", "")))
        for stale in mine[:-1]:  # only the newest is resumed; older ones would hold storage forever
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=stale["UploadId"])
        if mine:
            upload_id = mine[-1]["UploadId"]
            parts: dict[int, dict[str, Any]] = {}
            paginator = self.client.get_paginator("list_parts")
            for page in paginator.paginate(Bucket=self.bucket, Key=key, UploadId=upload_id):
                for part in page.get("Parts", []):
                    parts[int(part["PartNumber"])] = dict(part)
            return upload_id, parts
        created = self.client.create_multipart_upload(Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256",
                                                      Metadata={"sha256": sha256})  # fmt: skip
        return created["UploadId"], {}

    def _multipart(self, key: str, path: Path, sha256: str, progress: Advance | None) -> str:
        upload_id, there = self._open_upload(key, sha256)
        done = []
        kept = 0
        with path.open("rb") as fh:
            number = 0
            while block := fh.read(PART_BYTES):
                number += 1
                checksum = _b64_sha256(block)
                if _same_part(there.get(number), block, checksum):
                    etag = there[number]["ETag"]  # sent by a run that was killed: its bytes are the file's
                    kept += 1
                else:
                    etag = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                                   Body=block, ChecksumSHA256=checksum)["ETag"]  # fmt: skip
                    faults.step(f"uploaded part {number} of {key}")
                done.append({"PartNumber": number, "ETag": etag, "ChecksumSHA256": checksum})
                if progress:
                    progress(len(block))
        self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                              MultipartUpload={"Parts": done})  # type: ignore[typeddict-item]  # fmt: skip
        return f"resumed ({kept} of {len(done)} parts were there)" if there else SENT


def _same_part(old: dict[str, Any] | None, block: bytes, checksum: str) -> bool:
    """Whether a part a killed run sent holds ``block``: by its SHA-256 where the service lists it (S3 does), else
    by its ETag, the MD5 of a part's bytes (stores that list no checksum: MinIO, moto)."""
    if not old or old.get("Size") != len(block):
        return False
    if old.get("ChecksumSHA256"):
        return bool(old["ChecksumSHA256"] == checksum)
    return bool(str(old.get("ETag", "")).strip('"') == hashlib.md5(block, usedforsecurity=False).hexdigest())


def open_store(repo: str, flag: str = "--repo") -> Store:
    """The store ``repo`` names: ``s3://bucket[/prefix]`` or a folder (made when missing)."""
    if "://" in repo:
        expected = "s3://bucket/prefix (credentials in the environment or AWS_PROFILE), or a folder"
        if "@" in repo.split("://", 1)[1].split("/", 1)[0]:
            raise InputError(f"'{untrusted.redact_url(repo)}' carries credentials", field=flag, expected=expected)
        try:
            parts = grammar.url(repo, ("s3",))
            bucket = grammar.s3_bucket(parts.hostname or "")
            prefix = grammar.s3_prefix(parts.path.strip("/")) if parts.path.strip("/") else ""
        except ValueError as exc:
            raise InputError(str(exc), field=flag, expected=expected) from None
        if parts.query or parts.fragment or parts.port:
            raise InputError(
                f"'{untrusted.redact_url(repo)}' is not a bucket and prefix", field=flag, expected=expected
            )
        return S3Store(bucket, prefix)
    root = Path(repo)
    info = untrusted.path_stat(root, "repository", flag)
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise InputError("is not a folder", source=root, field=flag, expected="a folder, or s3://bucket/prefix")
    untrusted.refuse_pseudo_filesystem(root, flag, "a folder, or s3://bucket/prefix")
    return FolderStore(root.resolve())
