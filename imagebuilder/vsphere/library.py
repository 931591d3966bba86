"""Content library (spec 3, 4.6 ``library.import`` / ``library.deploy``) over REST.

An OVA goes into a datastore-backed local library as one item: a local file is pushed through an update session
(with a progress bar and its SHA256, so the server rejects a corrupted upload), a URL is pulled by the server
itself. vCenter unpacks the OVA. An item that exists but has no files -- an upload that was interrupted -- is
filled on the next run instead of being duplicated.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from imagebuilder.core import faults, progress
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import sha256_file
from imagebuilder.core.progress import Advance, Transfers, poll
from imagebuilder.vsphere.rest import Call, RestClient

FIND_LIBRARY = Call("POST", "/content/library", "/com/vmware/content/library", "spec")
CREATE_LIBRARY = Call("POST", "/content/local-library", "/com/vmware/content/local-library", "create_spec")
FIND_ITEM = Call("POST", "/content/library/item", "/com/vmware/content/library/item", "spec")
ITEM = Call("GET", "/content/library/item/{id}", "/com/vmware/content/library/item/{id}")
CREATE_ITEM = Call("POST", "/content/library/item", "/com/vmware/content/library/item", "create_spec")
ITEM_FILES = Call("GET", "/content/library/item/{id}/file", "/com/vmware/content/library/item/file")
CREATE_SESSION = Call(
    "POST", "/content/library/item/update-session", "/com/vmware/content/library/item/update-session", "create_spec"
)
SESSION = Call(
    "GET", "/content/library/item/update-session/{id}", "/com/vmware/content/library/item/update-session/{id}"
)
SESSIONS = Call("GET", "/content/library/item/update-session", "/com/vmware/content/library/item/update-session")
SESSION_ACTION = Call(
    "POST", "/content/library/item/update-session/{id}", "/com/vmware/content/library/item/update-session/{id}"
)
ADD_FILE = Call(
    "POST",
    "/content/library/item/updatesession/{id}/file",
    "/com/vmware/content/library/item/updatesession/file/{id}",
    "file_spec",
)
DEPLOY = Call("POST", "/vcenter/ovf/library-item/{id}", "/com/vmware/vcenter/ovf/library-item/{id}")


class Library:
    def __init__(self, rest: RestClient) -> None:
        self.rest = rest
        self._ids: dict[str, str] = {}
        #: libraries this session created: they hold only the items this session put there
        self.new: set[str] = set()

    def find(self, name: str) -> str | None:
        if name not in self._ids:
            ids = self.rest(FIND_LIBRARY, {"name": name}, action="find") or []
            if not ids:
                return None
            self._ids[name] = str(ids[0])
        return self._ids[name]

    def ensure(self, name: str, datastore_moid: str, created: list[str]) -> str:
        """The id of local library ``name``, created on ``datastore_moid`` when missing."""
        found = self.find(name)
        if found:
            return found
        spec = {
            "name": name,
            "type": "LOCAL",
            "storage_backings": [{"type": "DATASTORE", "datastore_id": datastore_moid}],
        }
        created.append(f"content library {name}")
        self._ids[name] = str(self.rest(CREATE_LIBRARY, spec))
        self.new.add(self._ids[name])
        return self._ids[name]

    def find_item(self, library_id: str, name: str) -> str | None:
        ids = self.rest(FIND_ITEM, {"library_id": library_id, "name": name}, action="find") or []
        return str(ids[0]) if ids else None

    def item_files(self, item_id: str) -> list[dict[str, Any]]:
        if self.rest.dialect == "api":
            return list(self.rest(ITEM_FILES, ident=item_id) or [])
        return list(self.rest(ITEM_FILES, params={"library_item_id": item_id}) or [])

    def open_sessions(self, item_id: str) -> list[str]:
        """The update sessions still open on the item: an upload whose client was killed (nothing marked them failed)
        holds the item's files half-replaced until the session expires."""
        found = []
        for session in self.rest(SESSIONS) or []:
            info = self.rest(SESSION, ident=str(session)) or {}
            if info.get("library_item_id") == item_id and info.get("state") == "ACTIVE":
                found.append(str(session))
        return found

    def cancel(self, session: str) -> None:
        """Cancel an update session: the server drops the files it had received."""
        self.rest(SESSION_ACTION, ident=session, action="cancel")

    def create_item(self, library_id: str, name: str, description: str) -> str:
        spec = {"library_id": library_id, "name": name, "type": "ovf", "description": description}
        return str(self.rest(CREATE_ITEM, spec))

    def upload(self, item_id: str, source: str, transfers: Transfers | None = None) -> None:
        """Put ``source`` (a local OVA or OVF path, or an http(s) URL) into the item; wait until the server has it.

        A local OVA is unpacked on the way: its descriptor, manifest and disks become the item's files (the content
        library's own layout of an OVF item, as govc and the vSphere Client upload it), each checked by the server
        against the SHA256 the OVA's manifest gives. A URL is pulled by vCenter itself.
        """
        session = str(self.rest(CREATE_SESSION, {"library_item_id": item_id}))
        try:
            if "://" in source:
                name = Path(source.split("?", 1)[0]).name
                spec: dict[str, Any] = {"name": name, "source_type": "PULL", "source_endpoint": {"uri": source}}
                self.rest(ADD_FILE, spec, ident=session, action="add")
            else:
                self._push_files(session, Path(source), transfers)
            self.rest(SESSION_ACTION, ident=session, action="complete")
            self._wait(session)
        except BaseException as exc:
            # a failed or interrupted session is marked failed so the server drops its partial files
            with contextlib.suppress(Exception):
                self.rest(SESSION_ACTION, ident=session, action="fail")
            if isinstance(exc, InputError):  # a corrupt OVA: no item is left to look complete on a rerun
                with contextlib.suppress(Exception):
                    self.rest(ITEM, ident=item_id, action=None, method="DELETE")
            raise

    @staticmethod
    def files_of(source: str) -> set[str]:
        """The files an upload of ``source`` puts into an item and a complete item therefore holds: the descriptor
        and the disks of a local OVA (an OVF or a URL: the descriptor, all that is known before it is read)."""
        path = Path(source)
        if "://" in source or not tarfile.is_tarfile(path):
            return {Path(source.split("?", 1)[0]).name}
        with tarfile.open(path) as tar:
            return {m.name for m in tar.getmembers() if m.isfile() and m.name.endswith((".ovf", ".vmdk"))}

    def _push_files(self, session: str, path: Path, transfers: Transfers | None) -> None:
        if not tarfile.is_tarfile(path):  # a plain file (an .ovf): as it is
            size = path.stat().st_size
            advance = progress.start(transfers, path.name, size)
            with path.open("rb") as fh:
                self._push(session, path.name, fh, size, sha256_file(path), advance)
            return
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            if not any(m.name.endswith(".ovf") for m in members):
                raise InputError(f"{path} is not an OVA: it holds no .ovf descriptor", field="--ova")
            sums: dict[str, str] = {}
            manifest = next((m for m in members if m.name.endswith(".mf")), None)
            if manifest is not None:
                text = (tar.extractfile(manifest) or io.BytesIO()).read().decode(errors="replace")
                for line in text.splitlines():
                    m = re.match(r"SHA256\((.+)\)\s*=\s*([0-9a-fA-F]{64})", line.strip())
                    if m:
                        sums[m.group(1)] = m.group(2).lower()
            advance = progress.start(transfers, path.name, sum(m.size for m in members))
            for member in members:
                stream = tar.extractfile(member)
                assert stream is not None
                name = Path(member.name).name
                self._push(session, name, stream, member.size, sums.get(name), advance)

    def _push(
        self, session: str, name: str, fh: IO[bytes], size: int, sha256: str | None, advance: Advance | None
    ) -> None:
        spec: dict[str, Any] = {"name": name, "source_type": "PUSH", "size": size}
        if sha256:
            spec["checksum_info"] = {"algorithm": "SHA256", "checksum": sha256}
        info = self.rest(ADD_FILE, spec, ident=session, action="add")
        self.rest.calls.count_rest()
        reader = _Reader(fh, size, advance)
        res = self.rest.http.request(
            "PUT",
            info["upload_endpoint"]["uri"],
            body=reader,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            timeout=3600,
        )
        if not res.ok:
            raise ExternalError(f"uploading {name} to the content library failed: HTTP {res.status}")
        faults.step(f"pushed {name}")  # the item's update session is open until every file is in
        # checked here as well as by vCenter: a corrupt OVA is the user's to fix, and not every server checks
        if sha256 and reader.sha256.hexdigest() != sha256:
            raise InputError(
                f"{name} does not match the OVA's manifest (SHA256 {reader.sha256.hexdigest()}, manifest {sha256})",
                field="--ova",
                expected="an intact OVA (download it again)",
            )

    def _wait(self, session: str) -> None:
        def done() -> tuple[bool, None]:
            info = self.rest(SESSION, ident=session)
            state = info.get("state")
            if state in ("ERROR", "CANCELED"):
                msg = (info.get("error_message") or {}).get("default_message", state)
                raise ExternalError(
                    f"content library import failed: {msg}", hint="check the OVA (or its URL) and rerun"
                )
            return state == "DONE", None

        poll(done, "the content library import")

    def deploy(self, item_id: str, name: str, pool_moid: str, folder_moid: str, datastore_moid: str) -> str:
        """Deploy the OVF item as VM ``name``, thin provisioned, into the folder and pool; returns the VM's moid.

        The VM is not powered on: powering on an imported OVA directly can corrupt the template (spec 7.4).
        """
        spec = {
            "target": {"resource_pool_id": pool_moid, "folder_id": folder_moid},
            "deployment_spec": {
                "name": name,
                "accept_all_EULA": True,
                "storage_provisioning": "thin",
                "default_datastore_id": datastore_moid,
            },
        }
        result = self.rest(DEPLOY, spec, ident=item_id, action="deploy")
        if not result or not result.get("succeeded"):
            errors = ((result or {}).get("error") or {}).get("errors") or []
            text = "; ".join(
                m.get("default_message", "") for e in errors for m in (e.get("error") or {}).get("messages", [])
            )
            raise ExternalError(f"deploying {name} from the content library failed: {text or result}")
        return str(result["resource_id"]["id"])


class _Reader:
    """A stream read in 1 MiB chunks for an HTTP body, reporting progress; has a length (no chunked encoding)."""

    def __init__(self, fh: IO[bytes], size: int, advance: Advance | None) -> None:
        self.fh = fh
        self.size = size
        self.advance = advance
        self.sha256 = hashlib.sha256()

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        left = self.size
        while left > 0 and (chunk := self.fh.read(min(1024 * 1024, left))):
            left -= len(chunk)
            self.sha256.update(chunk)
            if self.advance:
                self.advance(len(chunk))
            yield chunk
