"""Verified downloads from a TUF repository: the OS-1 images (spec 4.5) and any target of a repository
``image.publish`` made (issue 31) take this one path.

1. The trust anchor (a ``root.json``) is given by the caller, checked against a pinned SHA-512 when there is one.
2. python-tuf's ``Updater`` refreshes the metadata, walking root rotations forward, checking signatures, versions
   (no rollback) and expiry; the trusted metadata is kept per repository in the workspace, so a later run notices a
   rollback too.
3. The target's signed length and hashes go to :func:`imagebuilder.core.fetch.download`, which streams it once
   (through a transform, e.g. lz4 -> gzip) and renames only a verified result into place.

A repository is reached over HTTP(S) or, for a folder, as ``file://`` URLs (:class:`TufFetcher` reads both).
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from imagebuilder.core import fetch, grammar, untrusted
from imagebuilder.core import progress as _progress
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Expected
from imagebuilder.core.paths import workspace_root
from imagebuilder.core.progress import Transfers
from imagebuilder.core.stream import Transform


@dataclass(frozen=True)
class TufRepository:
    """Where a repository's metadata and targets are, and what to tell a user whose copy has expired."""

    metadata_url: str
    targets_url: str
    #: the hint of an expired-metadata error, with ``{role}`` for the role that expired
    expired_hint: str

    @property
    def metadata_dir(self) -> Path:
        """Trusted metadata kept between runs (rollback protection), per repository."""
        key = hashlib.sha256(self.metadata_url.encode()).hexdigest()[:16]
        path = workspace_root() / "tuf" / key
        path.mkdir(parents=True, exist_ok=True)
        return path


def slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def root_metadata(data: bytes, source: str, flag: str = "--root") -> bytes:
    """``data`` if it is TUF root metadata (signed by its own keys is the updater's check): the trust anchor a user
    gave is checked as the user's input, so a file that is not one is blamed on the flag, not on the repository."""
    from tuf.api.metadata import Metadata, Root

    try:
        md = Metadata[Root].from_bytes(data)
    except Exception as exc:  # python-tuf raises DeserializationError, ValueError, TypeError for what is not root
        reason = untrusted.printable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 200)
        raise InputError(f"{source} is not TUF root metadata: {reason}", field=flag,
                         expected="the root.json of the repository (repo.init wrote it)") from None  # fmt: skip
    if md.signed.type != "root":
        raise InputError(f"{source} is {md.signed.type} metadata, not root", field=flag,
                         expected="the root.json of the repository (repo.init wrote it)")  # fmt: skip
    return data


def pinned(data: bytes, want: str, source: str, flag: str = "--root-sha512") -> bytes:
    """``data`` (a root.json) if its SHA-512 is ``want``: the trust anchor is checked before anything is believed."""
    want = want.strip().lower()
    if not grammar.is_hex_digest(want, "sha512"):
        raise InputError(f"'{want}' is not a SHA-512", field=flag, expected="128 hex digits")
    got = hashlib.sha512(data).hexdigest()
    if got != want:
        raise ExternalError(
            f"root.json from {source} has SHA-512 {got}, not the pinned {want}: it is not trusted",
            hint=f"check the root file and the SHA-512 its publisher gave ({flag} sets the pin)",
        )
    return data


def _role_of(message: str) -> str:
    for role in ("timestamp", "snapshot", "targets", "root"):
        if role in message.lower():
            return role
    return "a role's"


def target_info(repo: TufRepository, name: str, root: bytes) -> tuple[Expected, str]:
    """Refresh the signed metadata and return the target's signed length/hashes and its download URL."""
    from tuf.api import exceptions
    from tuf.ngclient.updater import Updater

    from imagebuilder.release.tuffetch import TufFetcher

    try:
        updater = Updater(
            metadata_dir=str(repo.metadata_dir),
            metadata_base_url=repo.metadata_url,
            target_base_url=repo.targets_url,
            bootstrap=root,
            fetcher=TufFetcher(),
        )
        updater.refresh()
        info = updater.get_targetinfo(name)
    except exceptions.ExpiredMetadataError as exc:
        role = _role_of(str(exc))
        raise ExternalError(
            f"the repository's {role} metadata has expired: {exc}", hint=repo.expired_hint.format(role=role)
        ) from None
    except exceptions.BadVersionNumberError as exc:
        raise ExternalError(
            f"rollback refused: {exc}", hint="the repository serves older metadata than this host has already seen"
        ) from None
    except exceptions.UnsignedMetadataError as exc:
        raise ExternalError(
            f"the repository's metadata is not properly signed: {exc}",
            hint="the mirror or a proxy altered it, or it was signed by a key the root does not trust; do not use it",
        ) from None
    except exceptions.RepositoryError as exc:
        raise ExternalError(f"the repository's metadata failed verification: {type(exc).__name__}: {exc}") from None
    except exceptions.DownloadError as exc:
        # python-tuf's DownloadError often has an empty message; its cause says what happened
        reason = str(exc) or str(exc.__cause__ or exc.__context__ or "") or type(exc).__name__
        raise ExternalError(
            f"fetching metadata from {untrusted.redact_url(repo.metadata_url)} failed: {reason}",
            hint="check the repository's URL and the network",
        ) from None
    except ValueError as exc:  # a root that is not TUF metadata
        raise ExternalError(f"root.json is not valid TUF root metadata: {exc}") from None
    if info is None:
        raise ExternalError(f"the repository has no target {name}", hint="check the target's name")
    # with consistent snapshots the repository stores targets under "<hash>.<name>" (python-tuf's own rule)
    path = info.get_prefixed_paths()[0] if _consistent_snapshot(repo) else info.path
    return Expected(info.length, dict(info.hashes)), repo.targets_url + quote(path)


def _consistent_snapshot(repo: TufRepository) -> bool:
    """From the root the Updater trusts now (after any rotation), which it keeps as ``root.json``."""
    from tuf.api.metadata import Metadata, Root

    root = Metadata[Root].from_file(str(repo.metadata_dir / "root.json"))
    return bool(root.signed.consistent_snapshot)


def download(
    repo: TufRepository,
    name: str,
    dest: Path,
    root: bytes,
    transform: Transform | None = None,
    transfers: Transfers | None = None,
) -> Path:
    """Download target ``name`` to ``dest`` (a file name under a folder the caller chose), verified."""
    expected, url = target_info(repo, name, root)
    advance = _progress.start(transfers, name, expected.length or 0)
    return fetch.download(url, dest, expected, transform, progress=advance)


#: what a user reading a repository ``image.publish`` made is told when a role has expired
PUBLISHED_EXPIRED = (
    "the {role} metadata must be signed again by the repository's keys: "
    "'image-builder repo.refresh --repo REPO --keys KEYS' (with --targets when the targets role expired)"
)


def published(repo: str, flag: str = "--repo") -> TufRepository:
    """The repository ``image.publish`` wrote at ``repo``: an http(s) URL (a bucket's web endpoint, a server) or a
    folder; its metadata under ``metadata/``, its targets under ``targets/``."""
    if "://" in repo:
        try:
            parts = grammar.url(repo, ("http", "https"))
        except ValueError as exc:
            raise InputError(
                str(exc),
                field=flag,
                expected="the repository's http(s) URL (for s3://, its bucket's HTTPS URL) or a folder",
            ) from None
        if parts.query or parts.fragment:  # the metadata's path goes after it: a query would swallow it
            raise InputError(f"{untrusted.shown(repo)!r} has a query or fragment, which the metadata paths appended "
                             "to it would not keep", field=flag, expected="the repository's base URL")  # fmt: skip
        base = slash(repo)
    else:
        folder = Path(repo)
        info = untrusted.path_stat(folder, "repository", flag)
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise InputError("is not a folder", source=folder, field=flag, expected="a repository's folder or URL")
        base = slash(folder.resolve().as_uri())
    return TufRepository(base + "metadata/", base + "targets/", PUBLISHED_EXPIRED)
