"""A Prism Central v3 API contract server (no Nutanix simulator exists): the calls ``nutanix.image-upload`` makes,
each request checked against the v3 API's documented shapes.

Over HTTPS with a self-signed certificate (as a fresh Prism Central has) on 127.0.0.1, it checks:
- HTTP Basic authentication on every call (401 with v3's error shape otherwise);
- ``POST /api/nutanix/v3/images/list``: a ``kind: image`` list request (``filter``, ``length``, ``offset``...);
- ``POST /api/nutanix/v3/images``: ``api_version``, ``metadata.kind == "image"``, ``spec.name``,
  ``spec.resources.image_type`` in DISK_IMAGE/ISO_IMAGE, an http(s) ``source_uri`` if any, a checksum of a known
  algorithm; unknown keys are refused (422), as the v3 intent schema does;
- ``PUT /api/nutanix/v3/images/{uuid}/file``: ``application/octet-stream``, a Content-Length matching the body, and
  when ``X-Nutanix-Checksum-Type``/``-Bytes`` are sent, the body's digest matching them;
- ``GET /api/nutanix/v3/tasks/{uuid}`` and ``DELETE /api/nutanix/v3/images/{uuid}``.
Answers take v3's shapes (``{"status": {"state", "execution_context": {"task_uuid"}}, "metadata": {"uuid"}}``,
tasks with ``status`` and ``percentage_complete``, errors with ``state: ERROR`` and ``message_list``).

Labelled as what it is: a contract test against a local stand-in, not a Prism Central.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.pki import self_signed

USER, PASSWORD = "admin", "Nx-Secret-Marker-4410"
API = "/api/nutanix/v3"
SPEC_KEYS = {"name", "description", "resources"}
RESOURCE_KEYS = {"image_type", "source_uri", "checksum", "architecture", "source_options", "version"}
LIST_KEYS = {"kind", "filter", "length", "offset", "sort_attribute", "sort_order"}


@dataclass
class Prism:
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)
    #: a source_uri containing this fails its task (the cluster could not pull it)
    unreachable: str = "unreachable"


class _Error(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _task(prism: Prism, ok: bool = True, detail: str = "") -> str:
    tid = str(uuid.uuid4())
    prism.tasks[tid] = {"uuid": tid, "polls": 0, "ok": ok, "detail": detail}
    return tid


def _create(prism: Prism, body: dict[str, Any]) -> dict[str, Any]:
    unknown = set(body) - {"api_version", "metadata", "spec"}
    if unknown or not isinstance(body.get("spec"), dict) or not isinstance(body.get("metadata"), dict):
        raise _Error(422, f"invalid intent: unknown or missing keys {sorted(unknown) or ['spec/metadata']}")
    if body["metadata"].get("kind") != "image" or not body.get("api_version"):
        raise _Error(422, "metadata.kind must be 'image' and api_version is required")
    spec = body["spec"]
    resources = spec.get("resources")
    if set(spec) - SPEC_KEYS or not isinstance(spec.get("name"), str) or not isinstance(resources, dict):
        raise _Error(422, f"spec: expected name and resources, got {sorted(spec)}")
    if set(resources) - RESOURCE_KEYS:
        raise _Error(422, f"spec.resources: unknown {sorted(set(resources) - RESOURCE_KEYS)}")
    if resources.get("image_type") not in ("DISK_IMAGE", "ISO_IMAGE"):
        raise _Error(422, "spec.resources.image_type must be DISK_IMAGE or ISO_IMAGE")
    source = resources.get("source_uri")
    if source is not None and not str(source).startswith(("http://", "https://")):
        raise _Error(422, "spec.resources.source_uri must be an http(s) URL")
    checksum = resources.get("checksum")
    if checksum is not None and (
        set(checksum) != {"checksum_algorithm", "checksum_value"}
        or checksum["checksum_algorithm"] not in ("SHA_1", "SHA_256")
    ):
        raise _Error(422, "spec.resources.checksum: checksum_algorithm (SHA_1|SHA_256) and checksum_value")
    image = str(uuid.uuid4())
    status = {"state": "PENDING", "name": spec["name"], "resources": dict(resources)}
    prism.images[image] = {"metadata": {"kind": "image", "uuid": image}, "spec": spec, "status": status}
    failed = bool(source) and prism.unreachable in str(source)
    task = _task(
        prism, ok=not failed, detail=f"Could not access the URL {source}, please check the URL" if failed else ""
    )
    return {"status": {"state": "PENDING", "execution_context": {"task_uuid": task}},
            "spec": spec, "metadata": {"kind": "image", "uuid": image}}  # fmt: skip


@contextlib.contextmanager
def prism_server(folder: Path, prism: Prism | None = None) -> Iterator[tuple[int, Prism]]:
    """The server on 127.0.0.1 (HTTPS, self-signed, an ephemeral port): its port and its state."""
    prism = prism or Prism()
    cert, key = self_signed(folder)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            try:
                expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    raise _Error(401, "Authentication required.")
                if not self.path.startswith(API + "/"):
                    raise _Error(404, f"no API at {self.path}")
                path = self.path.removeprefix(API)
                prism.calls.append((method, path))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                self._answer(200 if method != "POST" or path.endswith("/list") else 202, self._route(method, path, raw))
            except _Error as err:
                messages = [{"message": err.message, "reason": "INVALID_REQUEST"}]
                self._answer(
                    err.code, {"api_version": "3.1", "code": err.code, "state": "ERROR", "message_list": messages}
                )

        def _route(self, method: str, path: str, raw: bytes) -> dict[str, Any]:
            parts = path.strip("/").split("/")
            if method == "POST" and path == "/images/list":
                body = json.loads(raw or b"{}")
                if body.get("kind") != "image" or set(body) - LIST_KEYS:
                    raise _Error(422, "list: kind must be 'image'")
                wanted = str(body.get("filter", "")).removeprefix("name==")
                found = [i for i in prism.images.values() if not wanted or wanted in i["spec"]["name"]]
                return {"entities": found, "metadata": {"kind": "image", "total_matches": len(found)}}
            if method == "POST" and path == "/images":
                return _create(prism, json.loads(raw))
            if len(parts) == 3 and parts[0] == "images" and parts[2] == "file" and method == "PUT":
                image = prism.images.get(parts[1]) or _missing("image", parts[1])
                if self.headers.get("Content-Type") != "application/octet-stream":
                    raise _Error(415, "the file is sent as application/octet-stream")
                kind, digest = self.headers.get("X-Nutanix-Checksum-Type"), self.headers.get("X-Nutanix-Checksum-Bytes")
                if kind and (kind != "SHA_256" or hashlib.sha256(raw).hexdigest() != digest):
                    raise _Error(422, "checksum mismatch: the uploaded bytes do not match X-Nutanix-Checksum-Bytes")
                prism.uploads[parts[1]] = raw
                image["status"]["resources"]["size_bytes"] = len(raw)
                return {"status": {"state": "PENDING", "execution_context": {"task_uuid": _task(prism)}}}
            if len(parts) == 2 and parts[0] == "images" and method == "DELETE":
                prism.images.pop(parts[1], None) or _missing("image", parts[1])
                return {"status": {"state": "DELETE_PENDING", "execution_context": {"task_uuid": _task(prism)}}}
            if len(parts) == 2 and parts[0] == "tasks" and method == "GET":
                task = prism.tasks.get(parts[1]) or _missing("task", parts[1])
                task["polls"] += 1
                if task["polls"] < 2:
                    return {"uuid": task["uuid"], "status": "RUNNING", "percentage_complete": 50}
                if not task["ok"]:
                    return {"uuid": task["uuid"], "status": "FAILED", "percentage_complete": 100,
                            "error_detail": task["detail"]}  # fmt: skip
                for image in prism.images.values():
                    image["status"]["state"] = "COMPLETE"
                return {"uuid": task["uuid"], "status": "SUCCEEDED", "percentage_complete": 100}
            raise _Error(404, f"{method} {path} is not an endpoint of this contract")

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), prism
    finally:
        server.shutdown()
        server.server_close()


def _missing(what: str, ident: str) -> Any:
    raise _Error(404, f"{what} {ident} not found")
