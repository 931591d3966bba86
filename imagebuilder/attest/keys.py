"""Signing keys: in a KMS or on a token (``awskms:``, ``hsm:``, ``pkcs11:`` references, :mod:`.signers`), or in
files, as securesystemslib reads them: PEM private keys (PKCS#8 or the algorithm's own form)
of ed25519, ECDSA (P-256, P-384) or RSA, public keys as PEM SubjectPublicKeyInfo.

Why so strict: a key is the one secret that makes every signature mean something. A private key file readable by
the group or others is refused (exit 2) before it is read, as ssh refuses an exposed identity file; a key never
travels in argv or a log, only its path and its key ID do. An encrypted private key is opened with the password in
``IMAGE_BUILDER_KEY_PASSWORD`` (never a flag).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.core import untrusted
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import atomic_write

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner, Signer, SSlibKey

#: the environment variable an encrypted private key's password comes from
PASSWORD_ENV = "IMAGE_BUILDER_KEY_PASSWORD"  # noqa: S105 (a variable name, not a password)
KINDS = ("ed25519", "ecdsa", "rsa")
#: a key file is a few kilobytes; anything larger is not one
_MAX_KEY_BYTES = 64 * 1024


def _read_key_file(path: Path, flag: str, *, private: bool) -> bytes:
    """A key file's bytes, read through the untrusted-value layer (a regular file, opened without blocking): its mode
    checked on the open file before a byte is read (a private key others can read is refused unread), its size
    bounded, and a file that is no PEM at all refused before the cryptography stack is loaded."""
    with untrusted.open_regular(path, "key file", field=flag) as fh:
        st = os.fstat(fh.fileno())
        if private and st.st_mode & 0o077:
            raise InputError(
                f"the private key is readable by {'others' if st.st_mode & 0o007 else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): it is refused before it is read",
                source=path, field=flag, expected=f"mode 0600 or stricter (chmod 600 {untrusted.shown(path)})",
            )  # fmt: skip
        if st.st_size > _MAX_KEY_BYTES:
            raise InputError(f"is {st.st_size} bytes: not a key file", source=path, field=flag, expected="a PEM key")
        data = fh.read(_MAX_KEY_BYTES + 1)
    if len(data) > _MAX_KEY_BYTES or b"-----BEGIN " not in data:
        raise InputError("is not a PEM key", source=path, field=flag,
                         expected=f"a PEM {'private' if private else 'public'} key file")  # fmt: skip
    return data


def load_signer(key: str | Path, flag: str = "--signing-key") -> Signer:
    """The signer of ``key``: a KMS or token reference (checked by one signature), or a private key file (exit 2
    naming the file when it is not one)."""
    from imagebuilder.attest.signers import is_reference, remote_signer

    if is_reference(key):
        return remote_signer(str(key), flag)
    return load_file_signer(Path(key), flag)


def load_file_signer(path: Path, flag: str = "--signing-key") -> CryptoSigner:
    """The private key in ``path`` as a securesystemslib signer (exit 2 naming the file when it is not one)."""
    data = _read_key_file(path, flag, private=True)  # before the imports: a file that is no key is answered at once
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    password = os.environ.get(PASSWORD_ENV)
    try:
        key = load_pem_private_key(data, password.encode() if password else None)
    except TypeError:  # encrypted and no password, or a password for a key that has none
        raise InputError(
            "the private key is encrypted" if not password else "the private key is not encrypted, a password was set",
            source=path, field=flag,
            expected=f"its password in {PASSWORD_ENV}" if not password else f"{PASSWORD_ENV} unset",
        ) from None  # fmt: skip
    except ValueError:  # never echo the cause: it may quote the key
        raise InputError("is not a PEM private key (or the password is wrong)", source=path, field=flag,
                         expected="a PEM ed25519, ECDSA or RSA private key") from None  # fmt: skip
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise InputError(f"is a {type(key).__name__}", source=path, field=flag,
                         expected="an ed25519, ECDSA or RSA private key")  # fmt: skip
    return CryptoSigner(key)


def load_public_key(key: str | Path, flag: str = "--public-key") -> SSlibKey:
    """A PEM public key file (a private key file given by mistake is refused: never read it), or the public key of
    a KMS or token reference, read from the KMS or token."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    from imagebuilder.attest.signers import is_reference, remote_public_key

    if is_reference(key):
        return remote_public_key(str(key), flag)
    path = Path(key)
    data = _read_key_file(path, flag, private=False)
    if b"PRIVATE KEY" in data:
        raise InputError("is a private key", source=path, field=flag, expected="the public key (a .pub file)")
    try:
        return SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise InputError(f"is not a PEM public key ({exc})", source=path, field=flag,
                         expected="a PEM ed25519, ECDSA or RSA public key") from None  # fmt: skip


def public_pem(key: SSlibKey) -> bytes:
    """``key`` as a PEM SubjectPublicKeyInfo (what :func:`load_public_key` reads back)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    public = str(key.keyval["public"])
    if key.keytype == "ed25519":  # securesystemslib keeps ed25519 keys as hex; the others as PEM already
        raw = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public))
        return raw.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return public.encode()


def export_public_key(key: SSlibKey, dest: Path, *, dry_run: bool = False) -> bool:
    """Write ``key`` as PEM to ``dest``; False when ``dest`` already holds it (a rerun), exit 2 when it holds
    another key (a public key file is never silently replaced: verifiers trust it). A dry run checks the same and
    writes nothing."""
    pem = public_pem(key)
    if dest.exists():
        if load_public_key(dest, "--dest").keyid == key.keyid:
            return False
        raise InputError("holds another public key", source=dest, field="--dest",
                         expected="a new file name, or the old file moved away")  # fmt: skip
    if dry_run:
        return True
    with atomic_write(dest, "wb", perm=0o644) as fh:
        fh.write(pem)
    return True


def public_path(private: Path) -> Path:
    """Where :func:`generate` puts the public half of ``private``."""
    return private.with_name(private.name + ".pub")


def generate(path: Path, kind: str = "ed25519") -> str:
    """A new private key at ``path`` (0600, PKCS#8 PEM) and its public key beside it (``<path>.pub``); returns the
    key ID. Refuses to overwrite a key: a lost key is a lost repository."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.signer import CryptoSigner

    if kind not in KINDS:
        raise InputError(f"'{kind}' is not a key type", field="--type", expected=", ".join(KINDS))
    for target in (path, public_path(path)):
        if target.exists():
            raise InputError("exists: a key is never overwritten", source=target, field="--dest",
                             expected="a new file name (or move the old key away)")  # fmt: skip
    signer = {"ed25519": CryptoSigner.generate_ed25519, "ecdsa": CryptoSigner.generate_ecdsa,
              "rsa": CryptoSigner.generate_rsa}[kind]()  # fmt: skip
    private = signer.private_bytes  # PKCS#8 PEM, unencrypted: the file's mode protects it
    pub = (
        serialization.load_pem_private_key(private, None)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with atomic_write(path, "wb", perm=0o600) as fh:
        fh.write(private)
    with atomic_write(public_path(path), "wb", perm=0o644) as fh:
        fh.write(pub)
    return str(signer.public_key.keyid)
