"""A TUF repository this tool signs: created by ``repo.init``, extended by ``image.publish``, kept fresh by
``repo.refresh``, its keys changed by ``repo.rotate``. python-tuf's Metadata API does the signing; this module
decides what changes, in which order it is written, and refuses to sign on top of metadata it cannot verify.

Layout (as Bottlerocket publishes, and as python-tuf's client and tuftool read it): consistent snapshots, so every
version of ``root``, ``targets`` and ``snapshot`` is a file of its own (``metadata/<version>.<role>.json``) and
targets are stored under their SHA-256 (``targets/<sha256>.<name>``); only ``metadata/timestamp.json`` is replaced.
A reader fetches the timestamp first; it is written last, after everything it names, so a reader sees either the
old repository or the new one, never a timestamp naming missing files.

Keys come from a folder of private key files named for their role (``root.pem`` or ``root-<n>.pem``, and so on);
each role's threshold is the number of its signatures a client requires (``repo.init --threshold``).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from imagebuilder.attest.keys import load_signer
from imagebuilder.core import grammar
from imagebuilder.core import progress as _progress
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import read_text
from imagebuilder.core.progress import Transfers
from imagebuilder.publish.storage import SENT, Store

if TYPE_CHECKING:
    from securesystemslib.signer import Signer
    from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

ROLES = ("root", "targets", "snapshot", "timestamp")
P = ParamSpec("P")
R = TypeVar("R")
#: how long each role's metadata stays valid, in days, unless ``--expires`` says otherwise
EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 7, "timestamp": 1}
_TARGET_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}")


def target_name(name: str, flag: str = "--target-name") -> str:
    """A target name: one segment of letters, digits and ``._+-``, not starting with a dot, as Bottlerocket names its
    targets. No folders: python-tuf stores ``a/b`` at ``a/<hash>.b``, tuftool fetches ``<hash>.a/b``, so a folder in
    a name would split the clients; and a name never leaves ``targets/``."""
    if not _TARGET_SEGMENT.fullmatch(name) or name in (".", ".."):
        raise InputError(
            f"'{name[:80]}' is not a target name",
            field=flag,
            expected="one file name of letters, digits and ._+- (no folders), not starting with a dot",
        )
    return name


def expiry(text: str | None, flag: str = "--expires") -> dict[str, int]:
    """``role=days,...`` over the defaults (:data:`EXPIRY_DAYS`)."""
    items = [item.strip() for item in (text or "").split(",") if item.strip()]
    return role_numbers(items, flag, EXPIRY_DAYS, 1, 3650, unit="days",
                        expected=f"e.g. timestamp=1,snapshot=7 (roles: {', '.join(ROLES)}; 1-3650 days)")  # fmt: skip


def role_numbers(items: Iterable[str], flag: str, defaults: dict[str, int], lo: int, hi: int, *, unit: str,
                 expected: str) -> dict[str, int]:  # fmt: skip
    """``role=<number>`` items (expiries, key counts, thresholds) over ``defaults``: a known role, and a number of
    the one grammar (ASCII digits, ``lo`` to ``hi``: ``int()`` would take "٣" and "1_0")."""
    out = dict(defaults)
    for item in items:
        role, sep, value = item.partition("=")
        try:
            if not sep or role not in ROLES:
                raise ValueError(role)
            out[role] = grammar.integer(value, lo, hi)
        except ValueError:
            raise InputError(f"'{item[:80]}' is not role={unit}", field=flag, expected=expected) from None
    return out


@dataclass
class Keys:
    """The signers of each role, from a folder: private key files (``<role>.pem`` / ``<role>-<n>.pem``, mode 0600)
    and references to keys in a KMS or on a token (``<role>.uri`` / ``<role>-<n>.uri``, one line each)."""

    folder: Path
    signers: dict[str, list[Signer]] = field(default_factory=dict)

    def of(self, role: str) -> list[Signer]:
        return self.signers.get(role, [])


def distinct(signers: Iterable[Signer]) -> list[Signer]:
    """``signers`` with each key ID once, in their order: two files of one key are one key to a client, so they
    count once toward a threshold (counted twice, they would make a repository that no client accepts)."""
    return list({s.public_key.keyid: s for s in signers}.values())


def key_reference(path: Path, flag: str = "--keys") -> str:
    """The KMS or token reference a ``.uri`` file of the keys folder holds (one line; no secret: a PIN is never
    in it)."""
    from imagebuilder.attest.signers import is_reference

    lines = read_text(path, "key reference").splitlines()
    ref = lines[0].strip() if len(lines) == 1 else ""
    if not is_reference(ref):
        raise InputError("is not one key reference on one line", source=path, field=flag,
                         expected="awskms:<key>, hsm:<id>[?label=<token>] or pkcs11:token=<label>;id=<id>")  # fmt: skip
    return ref


def make_keys(folder: Path, counts: dict[str, int], kind: str, *,
              dry_run: bool = False) -> list[tuple[Path, str, str]]:  # fmt: skip
    """The repository's key files in ``folder`` (0700), ``counts[role]`` per role (``<role>.pem``, or
    ``<role>-<n>.pem`` for more than one): ``(path, what was done, key ID)``, what was done being ``made``, ``kept``
    (a key that exists is never overwritten: a lost key is a lost repository, and a rerun converges) or, in a dry run,
    which makes nothing, ``would make`` (no key ID)."""
    from imagebuilder.attest.keys import generate

    planned = [folder / (f"{role}.pem" if counts[role] == 1 else f"{role}-{n}.pem")
               for role in ROLES for n in range(1, counts.get(role, 0) + 1)]  # fmt: skip
    if dry_run:
        return [(path, "kept" if path.exists() else "would make", "") for path in planned]
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return [(path, "kept", "") if path.exists() else (path, "made", generate(path, kind)) for path in planned]


def load_keys(folder: Path, roles: Iterable[str], flag: str = "--keys") -> Keys:
    """The keys of ``roles`` from ``folder``; a role without a key exits 2 naming the files looked for."""
    keys = Keys(folder)
    for role in roles:
        files = sorted({*folder.glob(f"{role}.pem"), *folder.glob(f"{role}-*.pem")})
        refs = sorted({*folder.glob(f"{role}.uri"), *folder.glob(f"{role}-*.uri")})
        if not files and not refs:
            raise InputError(
                f"no {role} key",
                source=folder,
                field=flag,
                expected=f"{role}.pem or {role}-<n>.pem (make keys with 'image-builder repo.keygen'), or {role}.uri"
                " holding a KMS or token key reference",
            )
        keys.signers[role] = distinct([*(load_signer(f, flag) for f in files),
                                       *(load_signer(key_reference(f, flag), flag) for f in refs)])  # fmt: skip
    return keys


def _expires(days: int) -> dt.datetime:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(days=days)).replace(microsecond=0)


def _bytes(md: Metadata[Any]) -> bytes:
    from tuf.api.serialization.json import JSONSerializer

    return md.to_bytes(JSONSerializer(compact=False))


@dataclass
class State:
    """The repository's newest metadata, each verified against the newest root."""

    root: Metadata[Root]
    targets: Metadata[Targets]
    snapshot: Metadata[Snapshot]
    timestamp: Metadata[Timestamp]


#: what to do about a damaged repository, by what was about to be done with it
_DAMAGED_HINT = {
    "publish": "do not publish on top of it; restore the repository from a copy",
    "serve": "do not serve it (clients refuse it); restore the repository from a copy and serve that",
}


def _parse(data: bytes, name: str, store: Store, purpose: str = "publish") -> Metadata[Any]:
    from tuf.api.metadata import Metadata

    try:
        return Metadata.from_bytes(data)
    except Exception as exc:  # python-tuf raises DeserializationError and friends
        raise ExternalError(f"{store.location}/{name} is not TUF metadata: {exc}",
                            hint=_DAMAGED_HINT[purpose]) from None  # fmt: skip


def _need(store: Store, name: str) -> bytes:
    data = store.read(name)
    if data is None:
        raise ExternalError(f"{store.location} has no {name}: it is not a complete repository",
                            hint="create one with 'image-builder repo.init'")  # fmt: skip
    return data


def load(store: Store, *, purpose: str = "publish") -> State:
    """The newest metadata of ``store``, verified: each root by the one before it, the rest by the newest root.
    Each file's signatures are checked before any field of it is read (the snapshot a timestamp names, the targets
    version a snapshot names): an unsigned edit is reported as such, never followed. ``purpose`` (publish or serve)
    says what the hint of a damaged repository tells the user to do."""
    from tuf.api.exceptions import UnsignedMetadataError

    hint = _DAMAGED_HINT[purpose]

    def verified(role: str, name: str, by: Metadata[Any]) -> Metadata[Any]:
        md = _parse(_need(store, name), name, store, purpose)
        try:
            by.verify_delegate(role, md)
            if role == "root":
                md.verify_delegate("root", md)
        except UnsignedMetadataError as exc:
            raise ExternalError(f"{store.location}: {name} is not signed by the {role} keys: {exc}",
                                hint=hint) from None  # fmt: skip
        if md.signed.type != role:
            raise ExternalError(f"{store.location}: {name} holds {md.signed.type} metadata, not {role}", hint=hint)
        return md

    root = _parse(_need(store, "metadata/1.root.json"), "metadata/1.root.json", store, purpose)
    while store.read(f"metadata/{root.signed.version + 1}.root.json") is not None:
        root = verified("root", f"metadata/{root.signed.version + 1}.root.json", root)
    timestamp = verified("timestamp", "metadata/timestamp.json", root)
    snapshot = verified("snapshot", f"metadata/{timestamp.signed.snapshot_meta.version}.snapshot.json", root)
    listed = snapshot.signed.meta.get("targets.json")
    if listed is None:
        raise ExternalError(f"{store.location}: its snapshot lists no targets metadata", hint=hint)
    targets = verified("targets", f"metadata/{listed.version}.targets.json", root)
    return State(root, targets, snapshot, timestamp)


def _sign(md: Metadata[Any], signers: list[Signer]) -> None:
    md.signatures.clear()
    for signer in signers:
        md.sign(signer, append=True)


def _check_signers(root: Root, role: str, signers: list[Signer]) -> None:
    """Enough of ``role``'s trusted keys among the given ones to meet its threshold: else exit 2, before signing."""
    trusted = set(root.roles[role].keyids)
    usable = [s for s in signers if s.public_key.keyid in trusted]
    if len(usable) < root.roles[role].threshold:
        raise InputError(
            f"{len(usable)} of the {role} keys given are trusted by the root; it requires "
            f"{root.roles[role].threshold}",
            field="--keys", expected=f"the {role} key files the repository was made (or last rotated) with",
        )  # fmt: skip


@dataclass
class Change:
    """What a signing operation wrote, for the task's output."""

    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    #: the key IDs a rotation took from the role (a key kept is not revoked)
    revoked: list[str] = field(default_factory=list)
    #: what killed writers had left, removed by this write (:meth:`Store.writing`)
    swept: list[str] = field(default_factory=list)


def _writes(op: Callable[P, R]) -> Callable[P, R]:
    """A repository write (its first argument the store): run under the store's lock, with what killed writers left
    swept (:meth:`Store.writing`) and named in its :class:`Change`; a dry run writes nothing, so takes neither."""

    @functools.wraps(op)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        store = cast("Store", args[0])
        if kwargs.get("dry_run"):
            return op(*args, **kwargs)
        with store.writing() as swept:
            result = op(*args, **kwargs)
        change = result if isinstance(result, Change) else result[1]  # type: ignore[index]  # init: (root, change)
        change.swept = swept
        return result

    return run


def _write_snapshot_and_timestamp(store: Store, state: State, keys: Keys, days: dict[str, int], change: Change,
                                  *, dry_run: bool) -> None:  # fmt: skip
    from tuf.api.metadata import MetaFile

    for role in ("snapshot", "timestamp"):
        _check_signers(state.root.signed, role, keys.of(role))
    snap = state.snapshot
    snap.signed.meta["targets.json"] = MetaFile(version=state.targets.signed.version)
    snap.signed.version += 1
    snap.signed.expires = _expires(days["snapshot"])
    _sign(snap, keys.of("snapshot"))
    data = _bytes(snap)
    ts = state.timestamp
    ts.signed.snapshot_meta = MetaFile(version=snap.signed.version, length=len(data),
                                       hashes={"sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
    ts.signed.version += 1
    ts.signed.expires = _expires(days["timestamp"])
    _sign(ts, keys.of("timestamp"))
    if not dry_run:
        store.write(f"metadata/{snap.signed.version}.snapshot.json", data)
        store.write("metadata/timestamp.json", _bytes(ts))  # last: it names everything written before it
    change.written += [f"metadata/{snap.signed.version}.snapshot.json", "metadata/timestamp.json"]
    change.versions.update(snapshot=snap.signed.version, timestamp=ts.signed.version)


def _write_targets(store: Store, state: State, keys: Keys, days: dict[str, int], change: Change,
                   *, dry_run: bool) -> None:  # fmt: skip
    _check_signers(state.root.signed, "targets", keys.of("targets"))
    t = state.targets
    t.signed.version += 1
    t.signed.expires = _expires(days["targets"])
    _sign(t, keys.of("targets"))
    if not dry_run:
        store.write(f"metadata/{t.signed.version}.targets.json", _bytes(t))
    change.written.append(f"metadata/{t.signed.version}.targets.json")
    change.versions["targets"] = t.signed.version


#: the signature schemes every client of the repository verifies: python-tuf verifies more, but tuftool (tough,
#: Bottlerocket's) reads ECDSA keys of P-256 only (a P-384 key in root.json fails its parse of the whole root)
CLIENT_SCHEMES = ("ed25519", "ecdsa-sha2-nistp256", "rsassa-pss-sha256")


def check_schemes(signers: Iterable[Signer], flag: str) -> None:
    """Refuse a key that a client of the repository could not verify, before it goes into a root."""
    for signer in signers:
        scheme = signer.public_key.scheme
        if scheme not in CLIENT_SCHEMES:
            raise InputError(f"key {signer.public_key.keyid[:16]}... signs {scheme}, which tuftool cannot verify",
                             field=flag, expected=f"a key of {', '.join(CLIENT_SCHEMES)}")  # fmt: skip


@_writes
def init(store: Store, keys: Keys, thresholds: dict[str, int], days: dict[str, int], *, dry_run: bool = False,
         asked: Collection[str] = ROLES) -> tuple[bytes, Change]:  # fmt: skip
    """A new repository (root, empty targets, snapshot, timestamp, all version 1). Returns root.json's bytes. A
    folder or prefix that holds a repository already is left alone: the same keys make this a no-op (a rerun), other
    keys exit 2, and so does another threshold for a role in ``asked`` (the roles whose threshold the user gave). An
    init killed before its timestamp is completed by the rerun, its root kept."""
    from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, Targets, Timestamp

    for role in ROLES:
        check_schemes(keys.of(role), "--keys")
        if thresholds.get(role, 1) > len(keys.of(role)):
            raise InputError(f"the {role} threshold is {thresholds[role]}, with {len(keys.of(role))} key(s) given",
                             field="--threshold", expected=f"at most the number of {role} key files")  # fmt: skip
    existing = store.read("metadata/1.root.json")
    if existing is not None:
        root_md = _parse(existing, "metadata/1.root.json", store)
        ours = {s.public_key.keyid for role in ROLES for s in keys.of(role)}
        theirs = set(root_md.signed.keys)
        if ours != theirs:
            raise InputError(
                "holds a repository made with other keys",
                source=store.location,
                field="--repo",
                expected="an empty folder or prefix (or the keys it was made with: a rerun changes nothing)",
            )
        # the same keys with other thresholds is not a rerun of the same command: say so rather than keep the old
        # ones silently (repo.rotate changes a role's threshold)
        for role in asked:
            had, wanted = root_md.signed.roles[role].threshold, thresholds.get(role, 1)
            if had != wanted:
                raise InputError(f"holds a repository whose {role} threshold is {had}, not {wanted}",
                                 source=store.location, field="--threshold",
                                 expected=f"{role}={had} as it was made (a rerun changes nothing); "
                                 f"repo.rotate --role {role} --threshold {wanted} changes it")  # fmt: skip
        if store.read("metadata/timestamp.json") is not None:
            return existing, Change(unchanged=["metadata/1.root.json"], versions={"root": root_md.signed.version})
        # an init killed before its timestamp: the same root (its bytes are what the user pinned), the rest made now
    else:
        root_md = None
    root = Root(expires=_expires(days["root"]), consistent_snapshot=True)
    for role in ROLES:
        for signer in keys.of(role):
            root.add_key(signer.public_key, role)
        root.roles[role].threshold = thresholds.get(role, 1)
    if root_md is None:
        root_md = Metadata(root)
        _sign(root_md, keys.of("root"))
    targets = Metadata(Targets(expires=_expires(days["targets"])))
    _sign(targets, keys.of("targets"))
    snapshot = Metadata(Snapshot(expires=_expires(days["snapshot"])))
    timestamp = Metadata(Timestamp(expires=_expires(days["timestamp"])))
    root_bytes = existing if existing is not None else _bytes(root_md)
    change = Change(versions={"root": 1, "targets": 1})
    if not dry_run:
        if existing is None:
            store.write("metadata/1.root.json", root_bytes)
        store.write("metadata/1.targets.json", _bytes(targets))
    change.written += ["metadata/1.root.json", "metadata/1.targets.json"]
    # snapshot and timestamp version 1 (the helper bumps from 0)
    snapshot.signed.version, timestamp.signed.version = 0, 0
    snapshot.signed.meta["targets.json"] = MetaFile(version=1)
    _write_snapshot_and_timestamp(store, State(root_md, targets, snapshot, timestamp), keys, days, change,
                                  dry_run=dry_run)  # fmt: skip
    return root_bytes, change


@dataclass(frozen=True)
class NewTarget:
    name: str  #: the target path (:func:`target_name`)
    path: Path  #: the local file
    sha256: str | None = None  #: its digest, when the caller has it already (an image is read once, not thrice)


@_writes
def publish(store: Store, keys: Keys, files: list[NewTarget], days: dict[str, int], *, dry_run: bool = False,
            transfers: Transfers | None = None, say: Callable[[str], None] | None = None) -> Change:  # fmt: skip
    """Add ``files`` as targets: their bytes first (hash-prefixed), then targets, snapshot and timestamp. A file
    the repository lists already with the same length and hashes changes nothing; when all do, nothing is signed."""
    from tuf.api.metadata import TargetFile

    state = load(store)
    _check_signers(state.root.signed, "targets", keys.of("targets"))
    change = Change()
    new: list[TargetFile] = []
    for item in files:
        info = (TargetFile(item.path.stat().st_size, {"sha256": item.sha256}, item.name) if item.sha256
                else TargetFile.from_file(item.name, str(item.path), ["sha256"]))  # fmt: skip
        old = state.targets.signed.targets.get(item.name)
        if old is not None and old.length == info.length and old.hashes == info.hashes:
            change.unchanged.append(item.name)
            continue
        new.append(info)
        stored = info.get_prefixed_paths()[0]
        if not dry_run:
            if say:
                say(f"uploading {item.name}")
            advance = _progress.start(transfers, item.name, info.length)
            how = store.upload(f"targets/{stored}", item.path, info.hashes["sha256"], advance)
            change.written.append(f"targets/{stored}" + ("" if how == SENT else f" ({how})"))
        else:
            change.written.append(f"targets/{stored}")
    if not new:
        change.versions = {"targets": state.targets.signed.version, "snapshot": state.snapshot.signed.version,
                           "timestamp": state.timestamp.signed.version}  # fmt: skip
        return change
    for info in new:
        state.targets.signed.targets[info.path] = info
    _write_targets(store, state, keys, days, change, dry_run=dry_run)
    _write_snapshot_and_timestamp(store, state, keys, days, change, dry_run=dry_run)
    return change


@_writes
def refresh(store: Store, keys: Keys, days: dict[str, int], *, targets: bool = False, dry_run: bool = False) -> Change:
    """New versions of snapshot and timestamp (and targets, with ``targets``) with new expiry dates, re-signed."""
    state = load(store)
    change = Change()
    if targets:
        _write_targets(store, state, keys, days, change, dry_run=dry_run)
    _write_snapshot_and_timestamp(store, state, keys, days, change, dry_run=dry_run)
    return change


@_writes
def rotate(store: Store, keys: Keys, role: str, new: list[Signer], threshold: int, days: dict[str, int],
           *, dry_run: bool = False) -> Change:  # fmt: skip
    """Replace every key of ``role`` with ``new`` in a new root version, signed by the current root keys (and the
    new ones, for a root rotation: a client holding the old root follows it to the new); the rotated role's metadata
    is signed again, by its new keys and by the old ones ``keys`` holds, with snapshot and timestamp, before the new
    root is written. A role that has these keys and this threshold already changes nothing (a rerun)."""
    if role not in ROLES:
        raise InputError(f"'{role}' is not a role", field="--role", expected=", ".join(ROLES))
    new = distinct(new)  # one key given twice is one key
    check_schemes(new, "--new-key")
    if not 1 <= threshold <= len(new):
        raise InputError(f"the threshold is {threshold} with {len(new)} distinct new key(s)", field="--threshold",
                         expected=f"1 to {len(new)}")  # fmt: skip
    state = load(store)
    root = state.root
    _check_signers(root.signed, "root", keys.of("root"))
    old_ids = list(root.signed.roles[role].keyids)
    new_ids = [s.public_key.keyid for s in new]
    if sorted(old_ids) == sorted(new_ids) and root.signed.roles[role].threshold == threshold:
        # what was asked is done (a rerun, of a rotation killed or not): nothing is written, and that is success
        return Change(unchanged=[f"metadata/{root.signed.version}.root.json"],
                      versions={"root": root.signed.version})  # fmt: skip
    old_signers = [s for s in keys.of(role) if s.public_key.keyid in old_ids]
    for keyid in old_ids:
        if keyid not in new_ids:
            root.signed.revoke_key(keyid, role)
    for signer in new:
        if signer.public_key.keyid not in old_ids:
            root.signed.add_key(signer.public_key, role)
    root.signed.roles[role].threshold = threshold
    root.signed.version += 1
    root.signed.expires = _expires(days["root"])
    root.signatures.clear()
    for signer in keys.of("root"):  # the old root's threshold: what a client holding it checks
        root.sign(signer, append=True)
    if role == "root":
        for signer in new:  # and the new root's: the new root must be signed by its own keys
            root.sign(signer, append=True)
    change = Change()
    name = f"metadata/{root.signed.version}.root.json"
    change.revoked = [k for k in old_ids if k not in new_ids]
    if role == "root":
        # first: a client follows the chain of roots (the new one is signed by the old keys and by its own)
        if not dry_run:
            store.write(name, _bytes(root))
        change.written.append(name)
    # the rotated role's metadata is signed by its old keys and its new ones, and written before the new root:
    # a client holding the old root accepts it (the old keys meet the old threshold), one that has read the new root
    # accepts it too, so a run killed between these writes leaves every client working and its rerun completes it
    both = Keys(keys.folder, {**keys.signers, role: distinct([*old_signers, *new])})
    if role == "targets":
        _write_targets(store, state, both, days, change, dry_run=dry_run)
    _write_snapshot_and_timestamp(store, state, both, days, change, dry_run=dry_run)
    if role != "root":
        if not dry_run:
            store.write(name, _bytes(root))  # last: until it is there, clients trust the old keys, which signed too
        change.written.append(name)
    change.versions["root"] = root.signed.version
    return change


def root_sha512(root: bytes) -> str:
    return hashlib.sha512(root).hexdigest()
