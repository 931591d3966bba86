"""``nutanix.image-upload`` (spec 4.3): the source cloud image a Nutanix build starts from, created in Prism Central.

A Nutanix build clones the image its config names (``source_image_name``), which must be "uploaded to the hci image
service first". This task does that through Prism Central's v3 REST API, the one the Packer plugin itself uses:

- from a URL: ``POST /images`` with ``source_uri``; the cluster pulls the image itself;
- from a file: ``POST /images`` without a source, then ``PUT /images/{uuid}/file`` streaming the file (with its
  SHA-256 in ``X-Nutanix-Checksum-*``), with progress;
- each request's task is followed (``GET /tasks/{uuid}``) to SUCCEEDED, or the task's error is reported (exit 1).

Idempotent by name: an image of that name with the same checksum (a file's SHA-256, or ``--sha256`` given with a
URL; with a URL and no checksum, the same source URI) is left alone; a different one is an error unless
``--force``, which replaces it. An image this run created and could not complete is deleted again.

Where Prism is and who logs in come from the build's own nutanix config (spec 2.3: endpoint, port, insecure flag,
user and password); the password can also come from ``NUTANIX_PASSWORD``. Basic authentication over TLS, verified
unless the config says ``nutanix_insecure``.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from imagebuilder.core import faults, untrusted
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import sha256_file
from imagebuilder.core.progress import Say, Transfers, poll, silent, start
from imagebuilder.providers.nutanix.provider import NutanixConfig

API = "/api/nutanix/v3"
PASSWORD_ENV = "NUTANIX_PASSWORD"  # noqa: S105 - the variable's name, not a password
CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Prism:
    """Where Prism Central is and who logs in (from the nutanix config)."""

    host: str
    port: int
    username: str
    password: str
    insecure: bool = False

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}{API}"


class PrismClient:
    """The few v3 calls this task makes: one typed method each, failures as :class:`ExternalError`."""

    def __init__(self, prism: Prism, *, timeout: float = 60, ca_certs: str | None = None) -> None:
        self.prism = prism
        token = base64.b64encode(f"{prism.username}:{prism.password}".encode()).decode()
        self._auth = {"Authorization": f"Basic {token}"}
        if prism.insecure:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._http = urllib3.PoolManager(
            cert_reqs="CERT_NONE" if prism.insecure else "CERT_REQUIRED",
            ca_certs=ca_certs,
            retries=urllib3.Retry(total=3, connect=3, read=0, status=0, backoff_factor=0.5),
            timeout=urllib3.Timeout(connect=10, read=timeout),
        )

    def _call(self, what: str, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        headers = {**self._auth, "Accept": "application/json", **kw.pop("headers", {})}
        if body is not None and not isinstance(body, (bytes, Iterator)):
            body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        try:
            try:
                res = self._http.request(method, self.prism.base + path, body=body, headers=headers, **kw)
            except urllib3.exceptions.MaxRetryError as exc:
                raise (exc.reason or exc) from None  # what went wrong, not that retrying gave up
        except urllib3.exceptions.SSLError:
            raise ExternalError(
                f"{what}: Prism Central's TLS certificate is not trusted ({self.prism.host}:{self.prism.port})",
                hint='trust its CA on this host, or set "nutanix_insecure": "true" in the config (not advised)',
            ) from None
        except urllib3.exceptions.HTTPError as exc:
            raise ExternalError(
                f"{what}: cannot reach Prism Central at {self.prism.host}:{self.prism.port} ({type(exc).__name__})",
                hint="check nutanix_endpoint and nutanix_port in the config",
            ) from None
        text = res.data.decode(errors="replace")
        try:  # another machine's reply: bounded before it is parsed, and its fields read by type below
            data = untrusted.parse_json(text, f"Prism Central's reply ({what})") if text.strip() else {}
        except InputError:
            data = {"message_list": [{"message": untrusted.shown(text, 200)}]}
        data = data if isinstance(data, dict) else {}
        if res.status >= 400:
            messages = "; ".join(
                str(m.get("message") or m.get("reason")) for m in data.get("message_list", []) if isinstance(m, dict)
            )
            hint = "check nutanix_username and the password" if res.status == 401 else ""
            raise ExternalError(f"{what}: Prism answered {res.status}: {messages or res.reason}", hint=hint)
        return data if isinstance(data, dict) else {}

    def images_named(self, name: str) -> list[dict[str, Any]]:
        found = self._call(
            f"looking for image {name!r}",
            "POST",
            "/images/list",
            {"kind": "image", "filter": f"name=={name}", "length": 500},
        ).get("entities", [])
        return [e for e in found if e.get("spec", {}).get("name") == name]  # the filter matches loosely

    def create_image(self, name: str, source_uri: str | None, sha256: str | None) -> tuple[str, str | None]:
        resources: dict[str, Any] = {"image_type": "DISK_IMAGE"}
        if source_uri:
            resources["source_uri"] = source_uri
        if sha256:
            resources["checksum"] = {"checksum_algorithm": "SHA_256", "checksum_value": sha256}
        body = {
            "api_version": "3.1.0",
            "metadata": {"kind": "image"},
            "spec": {"name": name, "description": "image-builder: source image (spec 4.3)", "resources": resources},
        }
        data = self._call(f"creating image {name!r}", "POST", "/images", body)
        uuid = data.get("metadata", {}).get("uuid")
        if not isinstance(uuid, str):
            raise ExternalError(f"creating image {name!r}: Prism answered without the image's uuid")
        return uuid, _task_of(data)

    def upload(self, uuid: str, path: Path, sha256: str, transfers: Transfers | None) -> str | None:
        size = path.stat().st_size
        advance = start(transfers, f"upload {path.name}", size)

        def chunks() -> Iterator[bytes]:
            with path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    if advance:
                        advance(len(chunk))
                    yield chunk

        data = self._call(
            f"uploading {path.name}",
            "PUT",
            f"/images/{uuid}/file",
            chunks(),
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
                "X-Nutanix-Checksum-Type": "SHA_256",
                "X-Nutanix-Checksum-Bytes": sha256,
            },
            chunked=False,
            preload_content=True,
        )
        return _task_of(data)

    def task(self, uuid: str) -> dict[str, Any]:
        return self._call(f"reading task {uuid}", "GET", f"/tasks/{uuid}")

    def delete_image(self, uuid: str) -> None:
        self._call(f"deleting image {uuid}", "DELETE", f"/images/{uuid}")


def _task_of(data: dict[str, Any]) -> str | None:
    task = data.get("status", {}).get("execution_context", {}).get("task_uuid")
    if isinstance(task, list):  # some Prism versions answer a list
        task = task[0] if task else None
    return task if isinstance(task, str) else None


@dataclass(frozen=True)
class UploadRequest:
    name: str
    url: str | None = None
    file: Path | None = None
    sha256: str | None = None  # a URL's expected checksum (a file's is computed)
    force: bool = False


@dataclass(frozen=True)
class UploadResult:
    uuid: str | None
    action: str  # created, unchanged, replaced, would create, would replace


def _checksum_of(entity: dict[str, Any]) -> str | None:
    for part in ("status", "spec"):
        value = entity.get(part, {}).get("resources", {}).get("checksum", {}).get("checksum_value")
        if isinstance(value, str):
            return value.lower()
    return None


def _complete(entity: dict[str, Any], request: UploadRequest) -> bool:
    """Whether the image holds its data: its task finished (COMPLETE) and, for a file, every byte of it uploaded. A
    run stopped between creating the image and uploading into it (killed: no clean-up ran) leaves one that is not."""
    status = entity.get("status", {})
    if status.get("state") != "COMPLETE":
        return False
    return request.file is None or status.get("resources", {}).get("size_bytes") == request.file.stat().st_size


def _same(entity: dict[str, Any], request: UploadRequest, sha256: str | None) -> bool:
    there = _checksum_of(entity)
    if sha256:
        return there == sha256
    source = entity.get("spec", {}).get("resources", {}).get("source_uri")
    return bool(request.url) and source == request.url


def wait_task(client: PrismClient, task: str, *, interval: float, timeout: float, say: Say) -> None:
    last = -1

    def check() -> tuple[bool, None]:
        nonlocal last
        info = client.task(task)
        status = str(info.get("status", "UNKNOWN"))
        if status == "SUCCEEDED":
            return True, None
        if status in ("FAILED", "ABORTED", "CANCELLED"):
            detail = info.get("error_detail") or info.get("error_code") or "no detail"
            raise ExternalError(f"Prism task {task} {status}: {detail}", hint="see the task in Prism Central")
        percent = int(info.get("percentage_complete") or 0)
        if percent != last:
            say(f"task {task}: {status.lower()}, {percent}%")
            last = percent
        return False, None

    poll(check, f"Prism task {task}", timeout, interval=interval, hint="see the task in Prism Central")


def upload_image(
    request: UploadRequest,
    prism: Prism,
    *,
    dry_run: bool = False,
    client: Callable[[Prism], PrismClient] = PrismClient,
    interval: float = 2,
    timeout: float = 3 * 3600,
    say: Say = silent,
    transfers: Transfers | None = None,
) -> UploadResult:
    """Create (or leave, or with ``force`` replace) the image; see the module's docstring."""
    api = client(prism)
    sha256 = sha256_file(request.file) if request.file else (request.sha256.lower() if request.sha256 else None)
    existing = api.images_named(request.name)
    same = False
    if existing:
        entity = existing[0]
        uuid = str(entity.get("metadata", {}).get("uuid"))
        same = _same(entity, request, sha256)
        if same and _complete(entity, request):
            say(f"image {request.name!r} ({uuid}) is already there with the same content")
            return UploadResult(uuid, "unchanged")
        if not same and not request.force:
            raise ExternalError(
                f"an image named {request.name!r} ({uuid}) is already in Prism with other content",
                hint="give another --name, or --force to replace it",
            )
        if dry_run:
            return UploadResult(uuid, "would replace")
        # the same content, incomplete: what a stopped run of this upload left (no --force needed to finish it)
        say(f"{'completing' if same else 'replacing'} image {request.name!r} ({uuid})"
            + (": a stopped run left it without its data" if same else ""))  # fmt: skip
        api.delete_image(uuid)
    elif dry_run:
        return UploadResult(None, "would create")
    uuid, task = api.create_image(request.name, request.url, sha256)
    faults.step(f"created image {request.name}")
    try:
        if task:
            wait_task(api, task, interval=interval, timeout=timeout, say=say)
        if request.file:
            assert sha256 is not None
            upload_task = api.upload(uuid, request.file, sha256, transfers)
            faults.step(f"uploaded {request.file.name}")
            if upload_task:
                wait_task(api, upload_task, interval=interval, timeout=timeout, say=say)
    except BaseException:
        # ours and incomplete: removed so that a rerun starts clean (a Ctrl-C included)
        api.delete_image(uuid)
        raise
    return UploadResult(uuid, ("completed" if same else "replaced") if existing else "created")


def prism_from_config(config: NutanixConfig) -> Prism:
    """The build's nutanix config as a :class:`Prism`; ``NUTANIX_PASSWORD`` wins over the file's password."""
    password = os.environ.get(PASSWORD_ENV) or config.hci_password.get_secret_value()
    return Prism(config.hci_endpoint, int(config.hci_port), config.hci_username, password, bool(config.hci_insecure))


__all__ = ["Prism", "PrismClient", "UploadRequest", "UploadResult", "prism_from_config", "upload_image"]
