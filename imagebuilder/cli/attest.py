"""``attest.*``: signing as its own step (issue 45). A CI's build job has no key and writes its provenance unsigned;
a later job that may use the KMS or token signs it with ``attest.sign``. ``attest.public-key`` writes the PEM public
key of a KMS or token key, for those who verify without access to the KMS (``image.verify --public-key``)."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core.errors import InputError
from imagebuilder.core.untrusted import printable

KEY_HELP = "a private key file (PEM, mode 0600), awskms:<key id|alias/name|ARN>, or hsm:<id>[?label=<token>] /"
KEY_HELP += " pkcs11:token=<label>;id=<id> (PIN in $IMAGE_BUILDER_HSM_PIN; default: $IMAGE_BUILDER_SIGNING_KEY)"


@task(
    help={
        "provenance": "the <name>.intoto.json a build wrote (signed in place)",
        "signing_key": "the key that signs it: " + KEY_HELP,
        "image": "the image it is about (default: the file its subject names, beside it)",
        "dry_run": "check the statement against the image and SBOM, and the key by one signature; write nothing",
    },
)
@cli_task
def sign(c: Context, provenance: str = "", signing_key: str = "", image: str = "", dry_run: bool = False) -> None:
    """Sign a provenance a build wrote unsigned (refused when it does not describe the image and SBOM beside it).

    Examples:
        image-builder attest.sign --provenance ubuntu.gz.intoto.json --signing-key signing.pem --dry-run
    """
    path = flags.existing_file(flags.required(provenance, "--provenance", "<name>.intoto.json"), "--provenance")
    target = flags.existing_file(image, "--image") if image else None
    from imagebuilder.attest.provenance import sign_statement
    from imagebuilder.cli.build import signer_for

    signer = signer_for(signing_key or None)
    if signer is None:
        raise InputError("no key given", field="--signing-key", expected=KEY_HELP)
    done = sign_statement(path, signer, target, dry_run=dry_run)
    if done.written:
        print(f"signed {path} ({done.subject}) with key {done.keyid}")
    elif dry_run:
        print(f"would sign {path} ({done.subject}) with key {done.keyid} (--dry-run)")
    else:
        print(f"unchanged {path}: already signed by key {done.keyid}")


@task(
    help={
        "key": "the key: awskms:..., hsm:... or pkcs11:... (its public half is read from the KMS or token)",
        "dest": "where to write the PEM public key (refused if it exists and holds another key)",
        "dry_run": "read the public key from the KMS or token and check --dest; write nothing",
    },
)
@cli_task
def public_key(c: Context, key: str = "", dest: str = "", dry_run: bool = False) -> None:
    """Write the PEM public key of a key in a KMS or on a token (for image.verify --public-key elsewhere).

    Examples:
        image-builder attest.public-key --key awskms:alias/image-signing --dest signing.pub
    """
    from imagebuilder.attest.keys import export_public_key, load_public_key
    from imagebuilder.attest.signers import is_reference

    ref = flags.required(key, "--key", "awskms:<key>, hsm:<id> or pkcs11:token=<label>;id=<id>")
    if not is_reference(ref):
        raise InputError(f"'{printable(ref, 120)}' is not a KMS or token key reference", field="--key",
                         expected="awskms:<key>, hsm:<id> or pkcs11:token=<label>;id=<id>")  # fmt: skip
    out = flags.dest_file(flags.required(dest, "--dest", "a file for the PEM public key"), "--dest")
    public = load_public_key(ref, "--key")
    written = export_public_key(public, out, dry_run=dry_run)
    said = ("would write" if dry_run else "wrote") if written else "unchanged"
    print(f"{said} {out}: key {public.keyid} ({public.scheme})")
