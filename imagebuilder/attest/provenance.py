"""``<name>.intoto.json``: who built an image, from what, how, signed (SLSA provenance v1 in an in-toto statement,
in a DSSE envelope).

The statement's one subject is the image file with its SHA-256. The build definition names the OS, provider,
channel and engine (external parameters), the release manifest, source image and config files by digest (resolved
dependencies: a config file's digest, never its contents: it may hold secrets), and this tool's version and git
commit. The run details name the builder (the profile's ID for this host), the tool versions, the build's ID, start
and end, and the SBOM by digest (a byproduct), so one signature covers both.

:func:`verify` is what ``image.verify --provenance`` runs: the envelope's signature by the given public key first
(nothing in an unsigned payload is believed), then the statement's types, the subject's digest against the image
file, and the SBOM's digest against the file beside the provenance.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from imagebuilder import __version__
from imagebuilder.core import untrusted
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.paths import checkout_root
from imagebuilder.core.validation import ForeignModel, model_problems
from imagebuilder.release.profile import load_profile

if TYPE_CHECKING:
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import Key, Signer

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SUFFIX = ".intoto.json"
#: the largest provenance read (a build's is a few KiB: one subject, a dozen dependencies)
MAX_PROVENANCE_BYTES = 2 * 1024 * 1024
#: the extensions of the images a build writes; its SBOM and provenance are named after what is left
IMAGE_SUFFIXES = (".qcow2", ".ova", ".raw", ".img", ".gz")


def stem(name: str) -> str:
    """The name an image's companions share: ``ubuntu-...-amd64.gz`` -> ``ubuntu-...-amd64``."""
    return next((name.removesuffix(x) for x in IMAGE_SUFFIXES if name.endswith(x)), Path(name).stem)


def companion(image: Path, suffix: str) -> Path:
    """The file beside ``image`` named after it: ``companion(image, ".spdx.json")`` is its SBOM."""
    return image.with_name(stem(image.name) + suffix)


@dataclass(frozen=True)
class Dependency:
    """A resolved dependency: the release manifest, the source image, a config file (digest only)."""

    name: str
    digests: dict[str, str]
    uri: str | None = None
    #: where it was read from when that is not ``uri`` (a mirror)
    read_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        uri = {"uri": self.uri} if self.uri else {}
        notes = {"annotations": {"readFrom": self.read_from}} if self.read_from and self.read_from != self.uri else {}
        return {"name": self.name, **uri, "digest": dict(sorted(self.digests.items())), **notes}


def git_commit() -> str | None:
    """The commit this tool runs from, when it runs from a checkout (a wheel records none)."""
    root = checkout_root()
    if root is None or not (root / ".git").exists():
        return None
    proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    commit = proc.stdout.strip()
    return commit if proc.returncode == 0 and len(commit) == 40 else None


def _time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def statement(
    *,
    image: Path,
    sha256: str,
    parameters: dict[str, Any],
    dependencies: list[Dependency],
    tools: dict[str, str | None],
    invocation: str,
    started: dt.datetime,
    finished: dt.datetime,
    sbom: Path | None,
) -> dict[str, Any]:
    """The in-toto statement with its SLSA v1 predicate (as data; see the module docstring)."""
    profile = load_profile().attestations
    commit = git_commit()
    tool = {"version": __version__, **({"commit": commit} if commit else {})}
    byproducts = []
    if sbom is not None:
        byproducts.append({"name": sbom.name, "digest": {"sha256": sha256_file(sbom)},
                           "mediaType": "application/spdx+json"})  # fmt: skip
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image.name, "digest": {"sha256": sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": profile.build_type,
                "externalParameters": parameters,
                "internalParameters": {"image_builder": tool},
                "resolvedDependencies": [d.to_json() for d in dependencies],
            },
            "runDetails": {
                "builder": {
                    "id": profile.builder_id.format(hostname=socket.gethostname()),
                    "version": {k: v for k, v in tools.items() if v},
                },
                "metadata": {"invocationId": invocation, "startedOn": _time(started), "finishedOn": _time(finished)},
                "byproducts": byproducts,
            },
        },
    }


def _envelope(doc: dict[str, Any]) -> Envelope:
    from securesystemslib.dsse import Envelope

    return Envelope(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), PAYLOAD_TYPE, {})


def sign(doc: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """The statement in a DSSE envelope signed by ``signer`` (securesystemslib's DSSE: PAE over the payload)."""
    envelope = _envelope(doc)
    envelope.sign(signer)
    return envelope.to_dict()


def unsigned(doc: dict[str, Any]) -> dict[str, Any]:
    """The statement in an envelope without a signature (a build given no key): nothing verifies it, and
    ``image.verify --provenance`` and ``image.publish`` refuse it."""
    return _envelope(doc).to_dict()


def write(path: Path, envelope: dict[str, Any]) -> None:
    with atomic_write(path) as fh:
        fh.write(json.dumps(envelope, indent=2) + "\n")


def _bad(path: Path, detail: str) -> ExternalError:
    return ExternalError(f"the provenance {path} {detail}", hint="do not trust this image; rebuild or re-download it")


def _read_envelope(path: Path) -> Envelope:
    """The DSSE envelope of in-toto JSON in ``path`` (exit 2 when the file is none)."""
    from securesystemslib.dsse import Envelope

    text = untrusted.read_text(path, "provenance", limit=MAX_PROVENANCE_BYTES, field="--provenance")
    try:
        data = untrusted.parse_json(text, path, limit=MAX_PROVENANCE_BYTES)
    except InputError as exc:  # what it is not, and why the parser says so
        raise InputError(f"is not a DSSE envelope ({exc.detail})", source=path, field="--provenance",
                         expected="the <name>.intoto.json a build wrote") from None  # fmt: skip
    try:
        if not isinstance(data, dict) or not isinstance(data.get("payload"), str):
            raise TypeError
        envelope = Envelope.from_dict(data)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InputError("is not a DSSE envelope", source=path, field="--provenance",
                         expected="the <name>.intoto.json a build wrote") from None  # fmt: skip
    if envelope.payload_type != PAYLOAD_TYPE:
        raise _bad(path, f"has payload type {untrusted.shown(envelope.payload_type, 80)!r}, not {PAYLOAD_TYPE}")
    return envelope


def _check_signature(path: Path, envelope: Envelope, public_key: Key | None) -> None:
    """The envelope carries a valid signature by ``public_key`` (nothing is checked without one)."""
    from securesystemslib.exceptions import VerificationError

    if public_key is None:
        return
    try:
        envelope.verify([public_key], 1)
    except VerificationError:
        raise _bad(path, f"is not signed by the key {public_key.keyid[:16]}... (--public-key)") from None


class _Subject(ForeignModel):
    name: str = Field("", max_length=4096)
    digest: dict[str, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=16)


class _Byproduct(ForeignModel):
    name: str = Field("", max_length=4096)
    digest: dict[str, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=16)


class _RunDetails(ForeignModel):
    byproducts: list[_Byproduct] = Field(default_factory=list, max_length=64)


class _Predicate(ForeignModel):
    runDetails: _RunDetails = Field(default_factory=_RunDetails)
    buildDefinition: dict[str, Any] = Field(default_factory=dict)


class _Statement(ForeignModel):
    """The fields of an in-toto statement this tool reads, each to its type and bound: nothing of a statement is
    read before this model accepted it (a subject digest that is a string, byproducts that are strings, 100,000
    subjects or a 10,000-character ``_type`` are refused here, not met by the code that reads them)."""

    type_: str = Field(alias="_type", max_length=200)
    predicateType: str = Field(max_length=200)
    subject: list[_Subject] = Field(min_length=1, max_length=64)
    predicate: _Predicate


def _statement(path: Path, envelope: Envelope) -> dict[str, Any]:
    """The statement in ``envelope``, accepted by :class:`_Statement` before any of it is read."""
    try:
        doc = untrusted.parse_json(envelope.payload, path, limit=MAX_PROVENANCE_BYTES)
    except InputError as exc:
        raise _bad(path, f"holds no in-toto statement ({exc.detail})") from None
    model, problems = model_problems(_Statement, doc)
    if model is None:
        first = problems[0]
        raise _bad(path, f"holds no in-toto statement: {untrusted.shown(first.field, 60)}: "
                         f"{untrusted.shown(first.message, 120)}")  # fmt: skip
    if model.type_ != STATEMENT_TYPE or model.predicateType != PREDICATE_TYPE:
        raise _bad(path, f"is a {untrusted.shown(model.type_, 80)} of {untrusted.shown(model.predicateType, 80)}, "
                         "not SLSA provenance v1")  # fmt: skip
    return dict(doc)


def _check_subject(path: Path, doc: dict[str, Any], image: Path, sha256: str | None) -> None:
    """The statement is about ``image`` (its digest), and the SBOM it names is the file beside it."""
    subject = doc["subject"]
    digest = sha256 or sha256_file(image)
    if not any(s.get("digest", {}).get("sha256") == digest for s in subject):
        names = ", ".join(untrusted.shown(str(s.get("name", "")), 80) for s in subject[:4])
        raise _bad(path, f"is about {names}{' ...' if len(subject) > 4 else ''}, not {untrusted.shown(image.name)} "
                         f"(sha256 {digest})")  # fmt: skip
    for item in doc["predicate"].get("runDetails", {}).get("byproducts", []):
        sbom = path.parent / Path(str(item.get("name", ""))).name
        want = item.get("digest", {}).get("sha256")
        if not sbom.is_file():
            raise _bad(path, f"names the SBOM {untrusted.shown(sbom.name)}, which is not beside it")
        got = sha256_file(sbom)
        if got != want:
            raise _bad(path, f"names the SBOM {untrusted.shown(sbom.name)} with sha256 {untrusted.shown(want, 80)}; "
                             f"the file has {got}")  # fmt: skip


def verify(path: Path, public_key: Key | None, image: Path, sha256: str | None = None) -> dict[str, Any]:
    """Check ``path`` (a DSSE envelope) against ``public_key``, ``image`` and the SBOM it names; returns the
    statement. Bad input (a file that is no envelope) exits 2; a signature or digest that does not match exits 1.
    Without a key the envelope must still carry a signature (``image.publish`` without ``--public-key``). ``sha256``
    is the image's digest when the caller has just computed it (an image is gigabytes: read once)."""
    envelope = _read_envelope(path)
    if not envelope.signatures:
        raise _bad(path, "is not signed")
    _check_signature(path, envelope, public_key)
    doc = _statement(path, envelope)
    _check_subject(path, doc, image, sha256)
    return doc


def read_statement(path: Path, public_key: Key | None = None) -> dict[str, Any]:
    """The statement in ``path``, its signature checked against ``public_key`` when one is given (an unsigned
    statement is read too: ``image.rebuild`` checks the builder's claim, not who signed it)."""
    envelope = _read_envelope(path)
    _check_signature(path, envelope, public_key)
    return _statement(path, envelope)


def _subject_image(path: Path, doc: dict[str, Any]) -> Path:
    """The image the statement ``doc`` (read from ``path``) is about, where a build put it: beside the provenance,
    under the subject's name."""
    names = [Path(str(s.get("name", ""))).name for s in doc["subject"] if isinstance(s, dict)]
    if len(names) != 1 or not names[0] or names[0] in (".", ".."):
        raise _bad(path, f"names {len(names)} subjects, not the one image a build writes")
    return path.parent / names[0]


@dataclass(frozen=True)
class Signing:
    """What :func:`sign_statement` did: the key, and whether the file changed (a rerun with the same key does
    not)."""

    keyid: str
    written: bool
    subject: str


def sign_statement(path: Path, signer: Signer, image: Path | None = None, *, dry_run: bool = False) -> Signing:
    """Sign the statement in ``path`` with ``signer``, in place (``attest.sign``): a build job without a key wrote it
    unsigned, a later job with the KMS or token signs it.

    Nothing is signed that does not describe the files beside it: the statement's subject must be the image (by
    digest) and its SBOM the file it names, as :func:`verify` checks, else exit 1 and the file is left as it was.
    A signature this key already made is kept (a rerun changes nothing); other keys' signatures stay beside it."""
    envelope = _read_envelope(path)
    doc = _statement(path, envelope)
    target = image or _subject_image(path, doc)
    if not target.is_file():
        raise InputError(f"the image {target.name} it is about is not beside it", source=path, field="--image",
                         expected="the image the build wrote, or its path in --image")  # fmt: skip
    _check_subject(path, doc, target, None)
    from securesystemslib.exceptions import VerificationError

    keyid = signer.public_key.keyid
    if keyid in envelope.signatures:
        try:
            envelope.verify([signer.public_key], 1)
            return Signing(keyid, False, target.name)
        except VerificationError:  # a broken signature by this key: replaced
            del envelope.signatures[keyid]
    if not dry_run:
        envelope.sign(signer)
        write(path, envelope.to_dict())
    return Signing(keyid, not dry_run, target.name)


def payload_of(envelope: dict[str, Any]) -> dict[str, Any]:
    """The statement inside an envelope, unverified (for display and tests; :func:`verify` is the check)."""
    return dict(json.loads(base64.b64decode(envelope["payload"])))
