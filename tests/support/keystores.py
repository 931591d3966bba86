"""Where production signing keys live, run here for real: a KMS-compatible server and SoftHSM2.

**KMS.** moto (the AWS simulator the other AWS tests use, in server mode) does not implement ``Sign`` with
``MessageType=DIGEST`` (moto 5.2.5, ``moto/kms/models.py``: "The MessageType-parameter DIGEST is not yet
implemented"): it signs the digest as if it were the message, so every signature securesystemslib's AWSSigner asks
for fails to verify. The KMS here is local-kms (github.com/nsmithuk/local-kms, built from source through the Go
module proxy by setup.sh), which implements the KMS JSON API's CreateKey, CreateAlias, GetPublicKey and Sign with
digests. It listens on every interface and has no flag to bind 127.0.0.1 only, so it runs inside a network
namespace the test makes (only a loopback in it), and the commands that talk to it run there too.

**HSM.** SoftHSM2 from Debian, a real PKCS#11 module: a token is initialised in a folder of the test's
(``SOFTHSM2_CONF``), and its EC key pairs are made through PKCS#11 itself (python-pkcs11).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.common import BIN, ROOT, stop, wait_until

LOCAL_KMS = ROOT / ".tools" / "bin" / "local-kms"
SOFTHSM = Path("/usr/lib/softhsm/libsofthsm2.so")
SO_PIN = "55667788"  # the token's security officer PIN (a test token)


@dataclass(frozen=True)
class Kms:
    """A local KMS in the network namespace ``ns``: ``env`` points boto3 at it."""

    ns: str
    env: dict[str, str]

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: int = 600
    ) -> subprocess.CompletedProcess[str]:
        """``args`` inside the namespace, with the KMS's environment (and ``env``)."""
        return subprocess.run(["ip", "netns", "exec", self.ns, *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, **self.env, **(env or {})}, timeout=timeout)  # fmt: skip

    def create_key(self, spec: str, alias: str | None = None, usage: str = "SIGN_VERIFY") -> str:
        """A new KMS key (of ``spec`` and ``usage``) and its alias; returns its key ID."""
        script = (
            "import boto3, json, sys\n"
            "kms = boto3.client('kms')\n"
            "args = {'KeyUsage': sys.argv[2]}\n"
            "if sys.argv[1] != 'SYMMETRIC_DEFAULT': args['KeySpec'] = sys.argv[1]\n"
            "key = kms.create_key(**args)['KeyMetadata']['KeyId']\n"
            "if sys.argv[3]: kms.create_alias(AliasName=sys.argv[3], TargetKeyId=key)\n"
            "print(json.dumps(key))\n"
        )
        proc = self.run(str(BIN / "python"), "-c", script, spec, usage, alias or "")
        assert proc.returncode == 0, proc.stderr
        return str(json.loads(proc.stdout))


@contextlib.contextmanager
def local_kms(work: Path) -> Iterator[Kms]:
    """local-kms in a namespace of its own (removed after), its database in ``work``."""
    assert LOCAL_KMS.is_file(), f"{LOCAL_KMS} is missing: run ./scripts/setup.sh --test"
    ns = f"ib-kms-{os.getpid()}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    data = work / "kms-data"
    data.mkdir(parents=True, exist_ok=True)
    port = "4599"
    env = {**os.environ, "PORT": port, "KMS_DATA_PATH": str(data), "KMS_REGION": "eu-west-1",
           "KMS_ACCOUNT_ID": "111122223333"}  # fmt: skip
    proc = subprocess.Popen(["ip", "netns", "exec", ns, str(LOCAL_KMS)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    kms = Kms(ns, {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "AKIALOCALKMSTEST0001",
        "AWS_SECRET_ACCESS_KEY": "local-kms-Secret-Marker-4410",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    })  # fmt: skip
    try:
        wait_until(
            lambda: kms.run("curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/").returncode == 0,
            proc,
            "local-kms",
        )
        yield kms
    finally:
        stop(proc)
        subprocess.run(["ip", "netns", "delete", ns], check=False)


@dataclass(frozen=True)
class Token:
    """A SoftHSM2 token: its label, user PIN, and the environment that finds it."""

    label: str
    pin: str
    env: dict[str, str]

    def create_key(self, key_id: int, curve: str = "secp256r1", *, rsa: bool = False) -> None:
        """An EC (or RSA) key pair with CKA_ID ``key_id`` on the token, made by the token (PKCS#11)."""
        script = (
            "import os, sys, pkcs11, pkcs11.util.ec\n"
            "from pkcs11 import KeyType, Attribute\n"
            "lib = pkcs11.lib(os.environ['PYKCS11LIB'])\n"
            "tok = lib.get_token(token_label=sys.argv[1])\n"
            "kid = pkcs11.util.biginteger(int(sys.argv[2]))\n"
            "with tok.open(rw=True, user_pin=os.environ['IMAGE_BUILDER_HSM_PIN']) as s:\n"
            "    if sys.argv[4] == 'rsa':\n"
            "        s.generate_keypair(KeyType.RSA, 2048, id=kid, store=True)\n"
            "    else:\n"
            "        params = s.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS:"
            " pkcs11.util.ec.encode_named_curve_parameters(sys.argv[3])}, local=True)\n"
            "        params.generate_keypair(id=kid, store=True)\n"
        )
        proc = subprocess.run([str(BIN / "python"), "-c", script, self.label, str(key_id), curve,
                               "rsa" if rsa else "ec"], env={**os.environ, **self.env}, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr


@contextlib.contextmanager
def softhsm_token(work: Path, label: str = "image-builder-test") -> Iterator[Token]:
    """A fresh SoftHSM2 token in ``work`` (its own configuration: nothing of the host's tokens is touched)."""
    assert SOFTHSM.is_file(), f"{SOFTHSM} is missing: run ./scripts/setup.sh --test (package softhsm2)"
    tokens = work / "softhsm-tokens"
    tokens.mkdir(parents=True, exist_ok=True)
    conf = work / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n")
    pin = secrets.token_hex(4)
    env = {"SOFTHSM2_CONF": str(conf), "PYKCS11LIB": str(SOFTHSM), "IMAGE_BUILDER_HSM_PIN": pin}
    subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", SO_PIN, "--pin", pin],
                   env={**os.environ, **env}, check=True, capture_output=True)  # fmt: skip
    yield Token(label, pin, env)
