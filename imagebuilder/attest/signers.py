"""Signing keys that never leave a KMS or an HSM: ``awskms:`` keys in AWS KMS, ``hsm:`` and ``pkcs11:`` keys on a
PKCS#11 token (an HSM, a YubiKey, SoftHSM).

Why through securesystemslib: its ``AWSSigner`` and ``HSMSigner`` are what tuftool's and python-tuf's users sign
with, so the signatures (DSSE envelopes, TUF metadata) are the ones those verifiers already accept, and this tool
holds no signing code of its own. Only the public key and the signature ever cross the wire; the private key stays
in the KMS or on the token.

What this module adds is the checking: a reference is parsed to its grammar before anything is asked of the KMS or
token, and then one signature is made and verified at once, so a wrong key usage or algorithm, a wrong PIN, a
missing permission or an unreachable endpoint fails in seconds, naming the key, before a build starts. The PIN
comes only from ``IMAGE_BUILDER_HSM_PIN`` (never argv, a URI or a message); AWS credentials from boto3's own
sources (environment, profile, instance role).

References:

- ``awskms:<key id | alias/name | key or alias ARN>`` (region from the ARN, else boto3's configuration; the endpoint
  from ``AWS_ENDPOINT_URL`` where a private endpoint is used)
- ``hsm:[<key id>][?label=<token label>]`` (securesystemslib's form; the module from ``PYKCS11LIB``)
- ``pkcs11:token=<label>;id=<%-encoded id>[?module-path=<library>]`` (RFC 7512; ``pin-value`` is refused: the PIN
  is a secret and a URI travels in argv and logs)
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote_to_bytes

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.untrusted import path_stat
from imagebuilder.core.untrusted import shown as _shown

if TYPE_CHECKING:
    from securesystemslib.signer import Signer, SSlibKey

#: the environment variable a token's user PIN comes from
PIN_ENV = "IMAGE_BUILDER_HSM_PIN"
#: securesystemslib's: the PKCS#11 library of the token
MODULE_ENV = "PYKCS11LIB"
SCHEMES = ("awskms", "hsm", "pkcs11")
#: what a KMS key must be to sign here (securesystemslib's AWSSigner: ECDSA P-256/P-384, RSA)
KMS_SPECS = ("ECC_NIST_P256", "ECC_NIST_P384", "RSA_2048", "RSA_3072", "RSA_4096")
#: signed and verified when a key is loaded: proves the key signs, with the PIN and permissions given
_PROBE = b"image-builder: signing key check"

_KEY = r"(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})"
_ALIAS = r"alias/[A-Za-z0-9/_-]{1,250}"
_KMS_ID = re.compile(
    rf"{_KEY}|{_ALIAS}|arn:aws[a-z-]{{0,20}}:kms:(?P<region>[a-z]{{2}}(?:-[a-z]+){{1,2}}-\d{{1,2}}):\d{{12}}:"
    rf"(?:key/{_KEY}|{_ALIAS})"
)
_LABEL = re.compile(r"[\x20-\x7e]{1,32}")  # a PKCS#11 token label: 32 printable characters at most
_MODULE = re.compile(r"/[A-Za-z0-9._/+-]{1,4095}\.so(?:\.\d+)*")


def is_reference(value: str | Path) -> bool:
    """True when ``value`` names a key in a KMS or on a token rather than a file."""
    return isinstance(value, str) and value.partition(":")[0] in SCHEMES and ":" in value


@dataclass(frozen=True)
class TokenKey:
    """A key on a PKCS#11 token: its id (a number, as securesystemslib's HSMSigner takes it), the token's label,
    and the module (library) that reaches the token."""

    key_id: int
    label: str | None
    module: str | None


def _bad(ref: str, flag: str, detail: str, expected: str) -> InputError:
    return InputError(f"'{_shown(ref)}' {detail}", field=flag, expected=expected)


def kms_key_id(ref: str, flag: str) -> tuple[str, str | None]:
    """The key of an ``awskms:`` reference and the region its ARN names (None for ids and aliases)."""
    key = ref.removeprefix("awskms:")
    match = _KMS_ID.fullmatch(key)
    if match is None:
        raise _bad(ref, flag, "is not an AWS KMS key reference",
                   "awskms:<key id>, awskms:alias/<name> or awskms:arn:aws:kms:<region>:<account>:key/<id>",
                   )  # fmt: skip
    return key, match.group("region")


def _query(ref: str, flag: str, query: str, expected: str) -> dict[str, str]:
    """A reference's query fields: a handful at most (a long query is no key reference)."""
    try:
        return dict(parse_qsl(query, keep_blank_values=True, max_num_fields=8))
    except ValueError:
        raise _bad(ref, flag, "has more query fields than a key reference has", expected) from None


def token_key(ref: str, flag: str) -> TokenKey:
    """The key an ``hsm:`` or ``pkcs11:`` reference names (bad input exits 2 before any token is opened)."""
    scheme, _, rest = ref.partition(":")
    if scheme == "hsm":
        path, _, query = rest.partition("?")
        params = _query(ref, flag, query, "hsm:[<key id>][?label=<token label>]")
        unknown = sorted(set(params) - {"label"})
        if unknown or not re.fullmatch(r"[0-9]{0,10}", path) or int(path or "0") >= 2**32:
            raise _bad(ref, flag, "is not an HSM key reference", "hsm:[<key id>][?label=<token label>]")
        key_id, label, module = int(path or "2"), params.get("label"), None
    else:
        path, _, query = rest.partition("?")
        attrs: dict[str, str] = {}
        for part in filter(None, path.split(";")):
            name, sep, value = part.partition("=")
            attrs[name] = value if sep else ""
        attrs_q = _query(ref, flag, query, "pkcs11:token=<label>;id=<%-encoded key id>[?module-path=<library .so>]")
        pins = {"pin-value", "pin-source", "pin"}
        if pins & {a.lower() for a in attrs} or pins & {a.lower() for a in attrs_q}:
            raise _bad("pkcs11:...", flag, "carries the PIN", f"the PIN in {PIN_ENV}, never in the URI")
        unknown = sorted((set(attrs) - {"token", "id", "object", "type"}) | (set(attrs_q) - {"module-path"}))
        if unknown or "id" not in attrs:
            raise _bad(ref, flag, f"is not a PKCS#11 key URI{f' (unknown {unknown})' if unknown else ''}",
                       "pkcs11:token=<label>;id=<%-encoded key id>[?module-path=<library .so>]")  # fmt: skip
        if attrs.get("type", "private") != "private":
            raise _bad(ref, flag, "names a public object", "type=private (or no type)")
        raw_id = unquote_to_bytes(attrs["id"])
        if not 1 <= len(raw_id) <= 4:
            raise _bad(ref, flag, "has a key id of more than 4 bytes", "id=%01 ... id=%ff%ff%ff%ff")
        key_id = int.from_bytes(raw_id, "big")
        label = unquote_to_bytes(attrs["token"]).decode("utf-8", "replace") if "token" in attrs else None
        module = attrs_q.get("module-path")
        if module is not None and not _MODULE.fullmatch(module):
            raise _bad(ref, flag, "has a module-path that is not a library's absolute path", "/path/to/lib.so")
    if label is not None and not _LABEL.fullmatch(label):
        raise _bad(ref, flag, "has a token label that is no PKCS#11 label", "1 to 32 printable ASCII characters")
    return TokenKey(key_id, label, module)


def _pin(ref: str, flag: str) -> str:
    pin = os.environ.get(PIN_ENV, "")
    if not pin:
        raise InputError(f"the token's PIN is not set (for {_shown(ref)})", field=PIN_ENV,
                         expected="the user PIN in the environment (never a flag)")  # fmt: skip
    return pin


def _kms_signer(ref: str, flag: str, *, public_only: bool) -> tuple[Signer | None, SSlibKey]:
    key, region = kms_key_id(ref, flag)  # the grammar first: a bad reference is answered before boto3 loads
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError
    from securesystemslib.signer import AWSSigner

    if region and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        os.environ["AWS_DEFAULT_REGION"] = region  # the ARN's; boto3's client in AWSSigner reads it
    shown = _shown(ref)
    try:
        described = boto3.client("kms").get_public_key(KeyId=key)
        usage, spec = described.get("KeyUsage"), described.get("KeySpec") or described.get("CustomerMasterKeySpec")
        if usage != "SIGN_VERIFY":
            raise InputError(f"the KMS key {shown} is for {usage}, not signing", field=flag,
                             expected="a KMS key with key usage SIGN_VERIFY")  # fmt: skip
        if spec not in KMS_SPECS:
            raise InputError(f"the KMS key {shown} is a {spec} key", field=flag,
                             expected=f"one of {', '.join(KMS_SPECS)}")  # fmt: skip
        uri, public = AWSSigner.import_(key)
        signer = None if public_only else AWSSigner(uri.removeprefix("awskms:"), public)
        if signer is not None:
            public.verify_signature(signer.sign(_PROBE), _PROBE)
        return signer, public
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NotFoundException", "InvalidArnException", "ValidationException"):
            raise InputError(f"no KMS key {shown} ({code})", field=flag,
                             expected="an existing KMS key (aws kms list-aliases)") from None  # fmt: skip
        if code == "UnsupportedOperationException":  # a symmetric key has no public key
            raise InputError(f"the KMS key {shown} is not an asymmetric signing key", field=flag,
                             expected=f"a SIGN_VERIFY key of {', '.join(KMS_SPECS)}") from None  # fmt: skip
        raise ExternalError(f"AWS KMS refused {shown}: {code or exc}",
                            hint="check the key's state and that these credentials may kms:GetPublicKey and kms:Sign"
                            ) from None  # fmt: skip
    except NoRegionError:
        raise InputError(f"no AWS region for {shown}", field="AWS_REGION",
                         expected="AWS_REGION set, or the key's ARN") from None  # fmt: skip
    except NoCredentialsError:
        raise ExternalError(f"no AWS credentials to reach the KMS key {shown}",
                            hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None  # fmt: skip
    except BotoCoreError as exc:
        raise ExternalError(f"AWS KMS could not be reached for {shown}: {type(exc).__name__}",
                            hint="check the network and AWS_ENDPOINT_URL") from None  # fmt: skip
    except InputError:
        raise
    except Exception as exc:  # the probe signature did not verify: the KMS is not what it says
        raise ExternalError(f"the KMS key {shown} made a signature that does not verify ({type(exc).__name__})",
                            hint="check AWS_ENDPOINT_URL points at AWS KMS") from None  # fmt: skip


def _hsm_signer(ref: str, flag: str, *, public_only: bool) -> tuple[Signer | None, SSlibKey]:
    want = token_key(ref, flag)  # the grammar first: a bad reference is answered before the PKCS#11 stack loads
    from securesystemslib.signer import HSMSigner

    try:
        import pkcs11
        from pkcs11 import exceptions as p11
    except ImportError:
        raise ExternalError("python-pkcs11 is not installed", hint="run ./scripts/setup.sh") from None
    # the module's source is named when it is wrong: the URI's module-path, else the variable
    source = f"{flag} (module-path)" if want.module else MODULE_ENV
    module = want.module or os.environ.get(MODULE_ENV, "")
    if not module:
        raise InputError(f"no PKCS#11 module for {_shown(ref)}", field=MODULE_ENV,
                         expected="the token's library, e.g. /usr/lib/softhsm/libsofthsm2.so")  # fmt: skip
    found = path_stat(module, "PKCS#11 module", source)
    if found is None or not stat.S_ISREG(found.st_mode):
        raise InputError(f"'{_shown(module, 200)}' does not exist", field=source,
                         expected="the token's PKCS#11 library (.so)")  # fmt: skip
    os.environ[MODULE_ENV] = module
    # a public key is read without the PIN where the token shows it; signing always needs it
    pin = os.environ.get(PIN_ENV) if public_only else _pin(ref, flag)
    shown = _shown(ref.partition("?")[0])
    try:
        _, public = HSMSigner.import_(want.key_id, want.label, (lambda _secret: pin) if pin else None)
        signer = None if pin is None else HSMSigner(want.key_id, public, lambda _secret: pin, want.label)
        if signer is not None and not public_only:
            public.verify_signature(signer.sign(_PROBE), _PROBE)
        return signer, public
    except p11.PinIncorrect:
        raise InputError(f"the token refused the PIN for {shown}", field=PIN_ENV,
                         expected="the token's user PIN") from None  # fmt: skip
    except p11.PinLocked:
        raise ExternalError(f"the token's PIN is locked ({shown})", hint="unlock it with the SO PIN") from None
    except ValueError as exc:  # securesystemslib: no token, no key, several of them, an unsupported curve
        raise InputError(f"{shown}: {exc}", field=flag,
                         expected="an ECDSA P-256/P-384 key pair with that id on one token") from None  # fmt: skip
    except (pkcs11.PKCS11Error, OSError, RuntimeError) as exc:
        raise ExternalError(f"the PKCS#11 token could not sign with {shown}: {type(exc).__name__}",
                            hint=f"check {MODULE_ENV} and the token") from None  # fmt: skip
    except Exception as exc:
        raise ExternalError(f"the token's key {shown} made a signature that does not verify ({type(exc).__name__})",
                            hint="check the token") from None  # fmt: skip


def remote_signer(ref: str, flag: str) -> Signer:
    """The signer of a KMS or token key, checked by one signature (see the module docstring)."""
    make = _kms_signer if ref.startswith("awskms:") else _hsm_signer
    signer, _ = make(ref, flag, public_only=False)
    assert signer is not None
    return signer


def remote_public_key(ref: str, flag: str) -> SSlibKey:
    """The public key of a KMS or token key (nothing is signed)."""
    make = _kms_signer if ref.startswith("awskms:") else _hsm_signer
    return make(ref, flag, public_only=True)[1]
