"""A TUF repository built for the tests with ``tuf.api.metadata``, shaped like the OS-1 one (spec 4.5):
consistent snapshots (``<version>.<role>.json``), hash-prefixed target files under ``targets/``, metadata under
``2020-07-07/<variant>-k8s-<K>/x86_64/``. The tests publish into it and then break it in the ways an attacker or
a bad mirror would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

ROLES = ("root", "timestamp", "snapshot", "targets")


def _expiry(days: int) -> datetime:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)


@dataclass
class TufRepo:
    base: Path  # what the HTTP server serves
    metadata_path: str  # e.g. 2020-07-07/metal-k8s-1.24/x86_64
    signers: dict[str, CryptoSigner] = field(default_factory=dict)
    root: Metadata[Root] | None = None
    targets: Metadata[Targets] | None = None
    snapshot: Metadata[Snapshot] | None = None
    timestamp: Metadata[Timestamp] | None = None

    @property
    def metadata_dir(self) -> Path:
        return self.base / self.metadata_path

    @property
    def targets_dir(self) -> Path:
        return self.base / "targets"

    def create(self) -> TufRepo:
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.signers = {role: CryptoSigner.generate_ed25519() for role in ROLES}
        root = Root(expires=_expiry(365), consistent_snapshot=True)
        for role, signer in self.signers.items():
            root.add_key(signer.public_key, role)
        self.root = Metadata(root)
        self.targets = Metadata(Targets(expires=_expiry(30)))
        self.snapshot = Metadata(Snapshot(expires=_expiry(7)))
        self.timestamp = Metadata(Timestamp(expires=_expiry(1)))
        self._write_root()
        self.publish(bump=False)
        return self

    def root_bytes(self, version: int = 1) -> bytes:
        return (self.metadata_dir / f"{version}.root.json").read_bytes()

    def add_target(self, name: str, data: bytes) -> TargetFile:
        assert self.targets is not None
        info = TargetFile.from_data(name, data, ["sha256"])
        self.targets.signed.targets[name] = info
        (self.targets_dir / f"{info.hashes['sha256']}.{name}").write_bytes(data)
        return info

    def target_file(self, name: str) -> Path:
        assert self.targets is not None
        info = self.targets.signed.targets[name]
        return self.targets_dir / f"{info.hashes['sha256']}.{name}"

    def _sign_write(self, md: Metadata, filename: str) -> None:
        md.signatures.clear()
        md.sign(self.signers[md.signed.type])
        md.to_file(str(self.metadata_dir / filename), JSONSerializer(compact=False))

    def _write_root(self) -> None:
        assert self.root is not None
        self._sign_write(self.root, f"{self.root.signed.version}.root.json")

    def publish(self, bump: bool = True, timestamp_expires: datetime | None = None) -> None:
        """Sign and write targets, snapshot and timestamp (new versions when ``bump``)."""
        assert self.targets and self.snapshot and self.timestamp
        if bump:
            self.targets.signed.version += 1
            self.snapshot.signed.version += 1
            self.timestamp.signed.version += 1
        self._sign_write(self.targets, f"{self.targets.signed.version}.targets.json")
        self.snapshot.signed.meta["targets.json"] = MetaFile(version=self.targets.signed.version)
        self._sign_write(self.snapshot, f"{self.snapshot.signed.version}.snapshot.json")
        self.timestamp.signed.snapshot_meta = MetaFile(version=self.snapshot.signed.version)
        if timestamp_expires is not None:
            self.timestamp.signed.expires = timestamp_expires
        self._sign_write(self.timestamp, "timestamp.json")

    def rotate_root(self) -> None:
        """Root version 2 with a new root key, signed by the old and the new key (a client walks forward)."""
        assert self.root is not None
        old = self.signers["root"]
        new = CryptoSigner.generate_ed25519()
        root = self.root.signed
        root.revoke_key(old.public_key.keyid, "root")
        root.add_key(new.public_key, "root")
        root.version += 1
        self.root.signatures.clear()
        self.root.sign(old, append=True)
        self.root.sign(new, append=True)
        self.signers["root"] = new
        self.root.to_file(str(self.metadata_dir / f"{root.version}.root.json"), JSONSerializer(compact=False))


def sha512(data: bytes) -> str:
    return hashlib.sha512(data).hexdigest()
