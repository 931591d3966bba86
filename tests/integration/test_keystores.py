"""Keys where production keys live (issue 45): provenance and TUF roles signed by a key in a KMS (local-kms, a
KMS-compatible server: moto lacks Sign with digests, see tests/support/keystores.py) and on a PKCS#11 token
(SoftHSM2), through the real CLI; verified by image.verify, by python-tuf (download.image) and by tuftool.

Every key is made in the KMS or token by the test; no private key is ever in a file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.attest import provenance
from imagebuilder.attest.keys import load_public_key
from tests.support.common import BIN
from tests.support.keystores import Kms, Token, local_kms, softhsm_token
from tests.support.publishing import cli, make_image, tuftool_download

IB = str(BIN / "image-builder")


@pytest.fixture(scope="module")
def kms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kms]:
    with local_kms(tmp_path_factory.mktemp("kms")) as server:
        yield server


@pytest.fixture
def token(tmp_path: Path) -> Iterator[Token]:
    with softhsm_token(tmp_path) as tok:
        yield tok


def _unsigned(folder: Path, name: str) -> tuple[Path, Path]:
    image = make_image(folder, name, None)
    return image, image.with_name(name + provenance.SUFFIX)


def _signatures(path: Path) -> list[str]:
    return [s["keyid"] for s in json.loads(path.read_text())["signatures"]]


@pytest.mark.parametrize("spec", ["ECC_NIST_P256", "ECC_NIST_P384", "RSA_3072"])
def test_a_kms_key_signs_a_provenance_a_build_left_unsigned(kms: Kms, tmp_path: Path, spec: str) -> None:
    alias = f"alias/prov-{spec.lower().replace('_', '-')}"
    kms.create_key(spec, alias)
    image, prov = _unsigned(tmp_path / "out", "ubuntu-kms")
    assert _signatures(prov) == []
    res = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", f"awskms:{alias}", "--dry-run")
    assert res.returncode == 0 and "would sign" in res.stdout and _signatures(prov) == [], res.stdout + res.stderr
    res = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", f"awskms:{alias}")
    assert res.returncode == 0 and "signed" in res.stdout, res.stdout + res.stderr
    signed = prov.read_bytes()
    again = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", f"awskms:{alias}")
    assert again.returncode == 0 and "unchanged" in again.stdout and prov.read_bytes() == signed, again.stdout
    # verified with the KMS's public key read from the KMS...
    res = kms.run(IB, "image.verify", "--image", str(image), "--provenance", str(prov), "--public-key",
                  f"awskms:{alias}")  # fmt: skip
    assert res.returncode == 0 and "[ok  ] signature" in res.stdout, res.stdout + res.stderr
    # ... and where the KMS cannot be reached, with its PEM public key exported once
    pub = tmp_path / "kms.pub"
    res = kms.run(IB, "attest.public-key", "--key", f"awskms:{alias}", "--dest", str(pub), "--dry-run")
    assert res.returncode == 0 and "would write" in res.stdout and not pub.exists(), res.stdout + res.stderr
    res = kms.run(IB, "attest.public-key", "--key", f"awskms:{alias}", "--dest", str(pub))
    assert res.returncode == 0 and "wrote" in res.stdout, res.stdout + res.stderr
    again = kms.run(IB, "attest.public-key", "--key", f"awskms:{alias}", "--dest", str(pub))
    assert again.returncode == 0 and "unchanged" in again.stdout
    res = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key", str(pub))
    assert res.returncode == 0, res.stdout + res.stderr
    # a key that did not sign it is told apart
    kms.create_key("ECC_NIST_P256", f"{alias}-other")
    res = kms.run(IB, "image.verify", "--image", str(image), "--provenance", str(prov), "--public-key",
                  f"awskms:{alias}-other")  # fmt: skip
    assert res.returncode == 1 and "is not signed by the key" in res.stderr, res.stderr


def test_kms_keys_of_the_wrong_kind_are_refused_before_anything_is_written(kms: Kms, tmp_path: Path) -> None:
    _, prov = _unsigned(tmp_path / "out", "ubuntu-bad")
    before = prov.read_bytes()
    kms.create_key("SYMMETRIC_DEFAULT", "alias/sym", usage="ENCRYPT_DECRYPT")
    kms.create_key("RSA_2048", "alias/rsa-encrypt", usage="ENCRYPT_DECRYPT")
    kms.create_key("ECC_SECG_P256K1", "alias/k1")
    cases = {
        "awskms:alias/sym": "not an asymmetric signing key",
        "awskms:alias/rsa-encrypt": "is for ENCRYPT_DECRYPT, not signing",
        "awskms:alias/k1": "is a ECC_SECG_P256K1 key",
        "awskms:alias/no-such-key": "no KMS key awskms:alias/no-such-key",
        "awskms:alias/bad name": "is not an AWS KMS key reference",
        "awskms:arn:aws:kms:eu-west-1:1234:key/x": "is not an AWS KMS key reference",
        "awskms:" + "a" * 10_000: "is not an AWS KMS key reference",
    }
    for ref, message in cases.items():
        res = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", ref)
        assert res.returncode == 2, (ref, res.stdout, res.stderr)
        assert message in res.stderr and "--signing-key" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert prov.read_bytes() == before
    # an unreachable KMS is an external failure (exit 1), named
    res = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", "awskms:alias/sym",
                  env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})  # fmt: skip
    assert res.returncode == 1 and "could not be reached" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "local-kms-Secret-Marker" not in res.stdout + res.stderr
    assert prov.read_bytes() == before


def test_a_statement_that_does_not_describe_the_image_beside_it_is_not_signed(kms: Kms, tmp_path: Path) -> None:
    kms.create_key("ECC_NIST_P256", "alias/subject")
    image, prov = _unsigned(tmp_path / "out", "ubuntu-swapped")
    image.write_bytes(image.read_bytes() + b"tampered")
    before = prov.read_bytes()
    res = kms.run(IB, "attest.sign", "--provenance", str(prov), "--signing-key", "awskms:alias/subject")
    assert res.returncode == 1 and "not ubuntu-swapped.gz" in res.stderr, res.stdout + res.stderr
    assert prov.read_bytes() == before
    other, other_prov = _unsigned(tmp_path / "out2", "ubuntu-sbom")
    other.with_name("ubuntu-sbom.spdx.json").write_text("{}")
    res = kms.run(IB, "attest.sign", "--provenance", str(other_prov), "--signing-key", "awskms:alias/subject")
    assert res.returncode == 1 and "names the SBOM" in res.stderr, res.stderr
    (tmp_path / "out3").mkdir()
    shutil.copy(other_prov, tmp_path / "out3" / other_prov.name)
    res = kms.run(IB, "attest.sign", "--provenance", str(tmp_path / "out3" / other_prov.name), "--signing-key",
                  "awskms:alias/subject")  # fmt: skip
    assert res.returncode == 2 and "is not beside it" in res.stderr, res.stderr
    junk = tmp_path / "junk.intoto.json"
    junk.write_text("{}")
    res = kms.run(IB, "attest.sign", "--provenance", str(junk), "--signing-key", "awskms:alias/subject")
    assert res.returncode == 2 and "is not a DSSE envelope" in res.stderr, res.stderr


def _download_ok(repo: Path, root: Path, name: str, image: Path, out: Path) -> None:
    got = cli("download.image", "--repo", str(repo), "--root", str(root), "--target", name, "--dest", str(out / "ours"))
    assert got.returncode == 0, got.stdout + got.stderr
    assert (out / "ours" / name).read_bytes() == image.read_bytes()
    tt = tuftool_download(root, repo.joinpath("metadata").as_uri(), repo.joinpath("targets").as_uri(), name,
                          out / "tuftool")  # fmt: skip
    assert tt.returncode == 0, tt.stderr
    assert (out / "tuftool" / name).read_bytes() == image.read_bytes()


def test_tuf_roles_in_the_kms_and_a_role_rotated_from_a_file_to_the_kms(kms: Kms, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    res = cli("repo.keygen", "--dest", str(keys))
    assert res.returncode == 0, res.stderr
    # snapshot and timestamp live in the KMS from the start (a .uri file each); root and targets in files
    for role in ("snapshot", "timestamp"):
        kms.create_key("ECC_NIST_P256", f"alias/tuf-{role}")
        (keys / f"{role}.pem").unlink()
        (keys / f"{role}.pem.pub").unlink()
        (keys / f"{role}.uri").write_text(f"awskms:alias/tuf-{role}\n")
    repo = tmp_path / "repo"
    res = kms.run(IB, "repo.init", "--repo", str(repo), "--keys", str(keys))
    assert res.returncode == 0, res.stdout + res.stderr
    root = repo / "metadata" / "1.root.json"
    image = make_image(tmp_path / "out", "ubuntu-tuf", keys / "targets.pem")
    res = kms.run(IB, "image.publish", "--image", str(image), "--repo", str(repo), "--keys", str(keys))
    assert res.returncode == 0, res.stdout + res.stderr
    _download_ok(repo, root, image.name, image, tmp_path / "dl1")
    # a key tuftool cannot read (ECDSA P-384: its parse of the whole root fails) never goes into the root
    kms.create_key("ECC_NIST_P384", "alias/tuf-p384")
    res = kms.run(IB, "repo.rotate", "--repo", str(repo), "--keys", str(keys), "--role", "targets", "--new-key",
                  "awskms:alias/tuf-p384", "--dry-run")  # fmt: skip
    assert res.returncode == 2 and "which tuftool cannot verify" in res.stderr, res.stdout + res.stderr
    # targets moves from its file to a KMS key: a new root, signed by the root key. (An ECDSA key: local-kms signs
    # RSA-PSS with the longest salt, where AWS KMS uses a 32-byte salt (its RSASSA_PSS_SHA_256), and tuftool's ring
    # accepts only the latter; python-tuf accepts both. The RSA KMS key is proven on the provenance above.)
    kms.create_key("ECC_NIST_P256", "alias/tuf-targets")
    res = kms.run(IB, "repo.rotate", "--repo", str(repo), "--keys", str(keys), "--role", "targets", "--new-key",
                  "awskms:alias/tuf-targets")  # fmt: skip
    assert res.returncode == 0 and "targets.uri" in res.stdout, res.stdout + res.stderr
    (keys / "targets.pem").unlink()
    (keys / "targets.uri").write_text("awskms:alias/tuf-targets\n")
    second = make_image(tmp_path / "out", "ubuntu-tuf-2", keys / "root.pem")
    res = kms.run(IB, "image.publish", "--image", str(second), "--repo", str(repo), "--keys", str(keys))
    assert res.returncode == 0, res.stdout + res.stderr
    _download_ok(repo, root, second.name, second, tmp_path / "dl2")

    def newest(role: str) -> dict[str, Any]:
        files = sorted((repo / "metadata").glob(f"*.{role}.json"), key=lambda p: int(p.name.split(".")[0]))
        return dict(json.loads(files[-1].read_text()))

    signed_by = {s["keyid"] for s in newest("targets")["signatures"]}
    first = json.loads(root.read_text())["signed"]["roles"]["targets"]["keyids"]
    assert signed_by == set(newest("root")["signed"]["roles"]["targets"]["keyids"]) != set(first)
    # a .uri file that holds no reference is bad input, named
    (keys / "timestamp.uri").write_text("/etc/passwd\n")
    res = kms.run(IB, "image.publish", "--image", str(second), "--repo", str(repo), "--keys", str(keys))
    assert res.returncode == 2 and "timestamp.uri" in res.stderr and "is not one key reference" in res.stderr


def test_a_token_key_signs_and_its_pin_never_shows(token: Token, tmp_path: Path) -> None:
    token.create_key(2)
    image, prov = _unsigned(tmp_path / "out", "ubuntu-hsm")
    env = token.env
    ref = f"hsm:2?label={token.label}"
    res = cli("attest.sign", "--provenance", str(prov), "--signing-key", ref, env=env)
    assert res.returncode == 0 and "signed" in res.stdout, res.stdout + res.stderr
    # the RFC 7512 form names the same key
    uri = f"pkcs11:token={token.label};id=%02?module-path={env['PYKCS11LIB']}"
    res = cli("image.verify", "--image", str(image), "--provenance", str(prov), "--public-key", uri,
              env={k: v for k, v in env.items() if k != "PYKCS11LIB"})  # fmt: skip
    assert res.returncode == 0 and "[ok  ] signature" in res.stdout, res.stdout + res.stderr
    again = cli("attest.sign", "--provenance", str(prov), "--signing-key", uri, env=env)
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout + again.stderr
    # a wrong PIN: exit 2 naming where the PIN comes from, never the PIN; nothing written
    _, prov2 = _unsigned(tmp_path / "out2", "ubuntu-hsm-2")
    before = prov2.read_bytes()
    wrong = "98761234"
    res = cli("attest.sign", "--provenance", str(prov2), "--signing-key", ref,
              env={**env, "IMAGE_BUILDER_HSM_PIN": wrong})  # fmt: skip
    assert res.returncode == 2 and "refused the PIN" in res.stderr and "IMAGE_BUILDER_HSM_PIN" in res.stderr
    assert wrong not in res.stdout + res.stderr and token.pin not in res.stdout + res.stderr
    assert prov2.read_bytes() == before
    res = cli("attest.sign", "--provenance", str(prov2), "--signing-key", ref,
              env={**env, "IMAGE_BUILDER_HSM_PIN": ""})  # fmt: skip
    assert res.returncode == 2 and "PIN is not set" in res.stderr, res.stderr


def test_token_references_of_the_wrong_kind_are_refused(token: Token, tmp_path: Path) -> None:
    token.create_key(3, rsa=True)
    token.create_key(4, "secp384r1")
    _, prov = _unsigned(tmp_path / "out", "ubuntu-hsm-bad")
    before = prov.read_bytes()
    cases = {
        f"hsm:3?label={token.label}": "ECDSA P-256/P-384",  # RSA: securesystemslib's HSMSigner signs ECDSA only
        f"hsm:9?label={token.label}": "could not find",
        "hsm:2?label=no-such-token": "No PKCS#11 token found",
        f"pkcs11:token={token.label};id=%02;pin-value=1234": "carries the PIN",
        f"pkcs11:token={token.label};id=%02?pin-source=/tmp/pin": "carries the PIN",
        f"pkcs11:token={token.label}": "is not a PKCS#11 key URI",
        f"pkcs11:token={token.label};id=%02;type=public": "names a public object",
        f"pkcs11:token={token.label};id=%02?module-path=lib.so": "module-path",
        "hsm:two": "is not an HSM key reference",
        "hsm:2?label=" + "x" * 40: "no PKCS#11 label",
    }
    for ref, message in cases.items():
        res = cli("attest.sign", "--provenance", str(prov), "--signing-key", ref, env=token.env)
        assert res.returncode == 2, (ref, res.stdout, res.stderr)
        assert message in res.stderr and "Traceback" not in res.stderr, (ref, res.stderr)
        assert "1234" not in res.stderr and token.pin not in res.stderr
        assert prov.read_bytes() == before
    # a P-384 key signs too
    res = cli("attest.sign", "--provenance", str(prov), "--signing-key", f"hsm:4?label={token.label}", env=token.env)
    assert res.returncode == 0, res.stderr
    no_module = {k: v for k, v in token.env.items() if k != "PYKCS11LIB"}
    res = cli("attest.public-key", "--key", f"hsm:4?label={token.label}", "--dest", str(tmp_path / "k.pub"),
              env=no_module)  # fmt: skip
    assert res.returncode == 2 and "PYKCS11LIB" in res.stderr, res.stderr


def test_a_tuf_role_rotated_onto_a_token_and_tuftool_verifies_it(token: Token, tmp_path: Path) -> None:
    token.create_key(5)
    keys = tmp_path / "keys"
    assert cli("repo.keygen", "--dest", str(keys)).returncode == 0
    repo = tmp_path / "repo"
    assert cli("repo.init", "--repo", str(repo), "--keys", str(keys)).returncode == 0
    ref = f"hsm:5?label={token.label}"
    res = cli("repo.rotate", "--repo", str(repo), "--keys", str(keys), "--role", "timestamp", "--new-key", ref,
              env=token.env)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (keys / "timestamp.pem").unlink()
    (keys / "timestamp.uri").write_text(ref + "\n")
    image = make_image(tmp_path / "out", "ubuntu-token", keys / "targets.pem")
    res = cli("image.publish", "--image", str(image), "--repo", str(repo), "--keys", str(keys), env=token.env)
    assert res.returncode == 0, res.stdout + res.stderr
    _download_ok(repo, repo / "metadata" / "1.root.json", image.name, image, tmp_path / "dl")
    pub = tmp_path / "timestamp.pub"
    assert cli("attest.public-key", "--key", ref, "--dest", str(pub), env=token.env).returncode == 0
    ts = json.loads((repo / "metadata" / "timestamp.json").read_text())
    assert [s["keyid"] for s in ts["signatures"]] == [load_public_key(pub).keyid]
