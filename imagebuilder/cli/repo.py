"""``repo.*``: the TUF repository images are published to (issue 31): its keys, its creation, its refresh and key
rotation. Publishing itself is ``image.publish``; reading is ``download.image``."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core.errors import InputError

if TYPE_CHECKING:
    from imagebuilder.publish.repository import Change

REPO_HELP = "the repository: a folder, or s3://bucket/prefix (endpoint and credentials from the environment)"
KEYS_HELP = "folder of private keys named for their role: root.pem or root-<n>.pem, targets.pem, snapshot.pem, "
KEYS_HELP += "timestamp.pem (mode 0600; made by repo.keygen), or <role>.uri files holding a KMS or token key reference"
EXPIRES_HELP = "days each role's new metadata stays valid, role=days comma-separated (default root=365,targets=90,"
EXPIRES_HELP += "snapshot=7,timestamp=1)"


def print_change(change: Change, *, dry_run: bool = False) -> None:
    for name in change.swept:
        print(f"removed   {name} (left by a writer that was killed)")
    for name in change.written:
        print(f"{'would write' if dry_run else 'wrote    '} {name}")
    for name in change.unchanged:
        print(f"unchanged {name}")
    if change.versions:
        print("versions: " + ", ".join(f"{role} {v}" for role, v in sorted(change.versions.items())))


def _counts(text: str, flag: str, defaults: dict[str, int], lo: int = 1, hi: int = 16) -> dict[str, int]:
    from imagebuilder.publish.repository import ROLES, role_numbers

    return role_numbers(flags.comma_list(text, flag) if text else [], flag, defaults, lo, hi, unit="N",
                        expected=f"roles {', '.join(ROLES)}; N {lo}-{hi}")  # fmt: skip


@task(
    help={
        "dest": "folder to write the keys into (created; existing key files are kept, never overwritten)",
        "roles": "how many keys each role gets, role=N comma-separated (default root=1,targets=1,snapshot=1,"
        "timestamp=1; e.g. root=3 for a threshold of root keys)",
        "type": "ed25519 (default), ecdsa or rsa",
        "dry_run": "check the folder and the flags, list the key files that would be made; write nothing",
    },
)
@cli_task
def keygen(c: Context, dest: str = "", roles: str = "", type: str = "ed25519", dry_run: bool = False) -> None:
    """Make the repository's signing keys (private 0600, public .pub beside each).

    Examples:
        image-builder repo.keygen --dest keys --dry-run
    """
    from imagebuilder.attest.keys import KINDS
    from imagebuilder.publish.repository import ROLES, make_keys

    out = flags.dest_dir(flags.required(dest, "--dest", "a folder for the keys"), "--dest")
    kind = flags.choice(type, "--type", KINDS)
    counts = _counts(roles, "--roles", dict.fromkeys(ROLES, 1))
    for path, done, key_id in make_keys(out, counts, kind, dry_run=dry_run):
        print({"made": f"wrote     {path} (key ID {key_id})", "kept": f"kept      {path} (exists)",
               "would make": f"would write {path} ({kind})"}[done])  # fmt: skip


@task(
    help={
        "repo": REPO_HELP,
        "keys": KEYS_HELP,
        "threshold": "signatures each role needs, role=N comma-separated (default 1; e.g. root=2 with 3 root keys)",
        "expires": EXPIRES_HELP,
        "dry_run": "check the keys and the repository; write nothing",
    },
)
@cli_task
def init(c: Context, repo: str = "", keys: str = "", threshold: str = "", expires: str = "",
         dry_run: bool = False) -> None:  # fmt: skip
    """Create a TUF repository (consistent snapshots) and print its root's SHA-512 for distribution.

    Examples:
        image-builder repo.init --repo repo --keys keys --dry-run
    """
    from imagebuilder.publish import repository as r
    from imagebuilder.publish.storage import open_store

    location = flags.required(repo, "--repo", "a folder or s3://bucket/prefix")
    key_dir = flags.existing_dir(flags.required(keys, "--keys", "the keys folder (repo.keygen)"), "--keys")
    thresholds = _counts(threshold, "--threshold", dict.fromkeys(r.ROLES, 1))
    days = r.expiry(expires)
    store = open_store(location)
    asked = _counts(threshold, "--threshold", {}) if threshold else {}  # the roles whose threshold was given
    root, change = r.init(store, r.load_keys(key_dir, r.ROLES), thresholds, days, dry_run=dry_run, asked=list(asked))
    print_change(change, dry_run=dry_run)
    print(f"root:     {store.location}/metadata/1.root.json")
    print(f"root SHA-512: {r.root_sha512(root)}")
    print("give clients that root.json (download.image --root) and the SHA-512 to check it by (--root-sha512)")


@task(
    help={
        "repo": REPO_HELP,
        "keys": KEYS_HELP + "; snapshot and timestamp (and targets with --targets) are needed",
        "expires": EXPIRES_HELP,
        "targets": "re-sign the targets metadata too (its own expiry is due)",
        "dry_run": "check the keys and the repository; write nothing",
    },
)
@cli_task
def refresh(c: Context, repo: str = "", keys: str = "", expires: str = "", targets: bool = False,
            dry_run: bool = False) -> None:  # fmt: skip
    """Re-sign snapshot and timestamp (and targets) with new expiry dates, before clients see them expire.

    Examples:
        image-builder repo.refresh --repo repo --keys keys --dry-run
    """
    from imagebuilder.publish import repository as r
    from imagebuilder.publish.storage import open_store

    location = flags.required(repo, "--repo", "a folder or s3://bucket/prefix")
    key_dir = flags.existing_dir(flags.required(keys, "--keys", "the keys folder"), "--keys")
    days = r.expiry(expires)
    roles = ("snapshot", "timestamp", *(("targets",) if targets else ()))
    change = r.refresh(open_store(location), r.load_keys(key_dir, roles), days, targets=targets, dry_run=dry_run)
    print_change(change, dry_run=dry_run)


@task(
    help={
        "repo": REPO_HELP,
        "keys": KEYS_HELP + "; the current root keys sign the new root",
        "role": "the role whose keys change: root, targets, snapshot or timestamp",
        "new_key": "a new key of the role: a private key file, or a KMS or token key (awskms:..., hsm:..., pkcs11:...)"
        " (repeatable, each key counted once); every old key of the role that is not among them is revoked",
        "threshold": "signatures the role needs from now on (default 1)",
        "expires": EXPIRES_HELP,
        "dry_run": "check the keys and the repository; write nothing",
    },
    iterable=["new_key"],
)
@cli_task
def rotate(c: Context, repo: str = "", keys: str = "", role: str = "", new_key: list[str] | None = None,
           threshold: str = "1", expires: str = "", dry_run: bool = False) -> None:  # fmt: skip
    """Replace a role's keys: a new root version, signed by the old root keys (and the new ones for root).

    Examples:
        image-builder repo.rotate --repo repo --keys keys --role targets --new-key new-targets.pem --dry-run
    """
    from imagebuilder.attest.keys import load_signer
    from imagebuilder.publish import repository as r
    from imagebuilder.publish.storage import open_store

    location = flags.required(repo, "--repo", "a folder or s3://bucket/prefix")
    key_dir = flags.existing_dir(flags.required(keys, "--keys", "the keys folder"), "--keys")
    flags.choice(flags.required(role, "--role", "root, targets, snapshot or timestamp"), "--role", r.ROLES)
    if not new_key:
        raise InputError("no new key given", field="--new-key", expected="a private key file (repo.keygen makes one)")
    new = [load_signer(flags.key(k, "--new-key"), "--new-key") for k in new_key]
    count = flags.integer(threshold, "--threshold", 1, 16)
    days = r.expiry(expires)
    needed = ("root", "snapshot", "timestamp", *(("targets",) if role == "targets" else ()))
    current = r.load_keys(key_dir, tuple(dict.fromkeys(x for x in needed if x != role or role == "root")))
    if role != "root":
        # the role's old keys, where the folder still holds them, sign too: clients keep working while it rotates
        with contextlib.suppress(InputError):
            current.signers[role] = r.load_keys(key_dir, (role,)).signers[role]
    change = r.rotate(open_store(location), current, role, new, count, days, dry_run=dry_run)
    print_change(change, dry_run=dry_run)
    if not change.written:
        print(f"the {role} role has these keys and this threshold already: nothing written")
        return
    revoked = ", ".join(k[:12] for k in change.revoked) or "none (every old key is among the new ones)"
    print(f"{'would revoke' if dry_run else 'revoked'} {role} key(s): {revoked}")
    if not dry_run:
        print(f"the {role} keys are now {', '.join(new_key)}: put them in {key_dir} in place of the old ones (a key"
              f" in a KMS or on a token as a {role}.uri file holding its reference)")  # fmt: skip
