"""Apply a customization to a running machine (spec 4.8 steps 2, 4, 5 and 6): what ``template.customize`` and
``image.customize`` share once their machine is up.

A run has its own key pair, its own cloud-init documents (a fresh instance-id, the customization user with this
run's key) and a redactor that knows every secret of the customization file. :func:`apply` logs in as that user,
runs ``ansible/customize.yml`` (the customize role, the sysprep role, then a seal that removes the user and powers
the machine off) and returns once the playbook has scheduled the seal; the caller waits for the power-off its own
way (vSphere's power state, QEMU's exit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.progress import Say
from imagebuilder.core.ssh import KeyPair, Login, run_key, run_playbook, wait_for_login
from imagebuilder.core.untrusted import Redactor
from imagebuilder.customization.model import Customization, SeedDocuments, seed_documents

KEEP_USER_WARNING = (
    "--keep-user: the customization user, its key and its sudo rule stay in the image; every clone can be logged "
    "into with this run's key"
)


@dataclass(frozen=True)
class Run:
    """One customization run: what the machine is given at boot and how to log in to it."""

    customization: Customization
    key: KeyPair
    documents: SeedDocuments
    keep_user: bool
    redact: Redactor

    @property
    def user(self) -> str:
        return self.customization.user.name


@contextlib.contextmanager
def run(customization: Customization, *, keep_user: bool = False) -> Iterator[Run]:
    """A run whose key pair exists for the ``with`` block only.

    A ``ssh_public_key`` in the customization file is what the documents authorize when ``--keep-user`` keeps the
    user (so its owner can log in to clones); this run still logs in with its own key, authorized beside it.
    """
    with run_key("image-builder customize (this run only)") as key:
        keys = [key.public]
        given = customization.user.ssh_public_key
        if given and keep_user:
            keys.append(given)
        docs = seed_documents(customization.user.name, keys)
        yield Run(customization, key, docs, keep_user, Redactor(customization.secret_values()))


def apply(
    target: Run,
    host: str,
    port: int = 22,
    *,
    log: Path,
    timeout: float,
    say: Say,
    gone: Callable[[], str | None] = lambda: None,
    extra_vars: dict[str, str] | None = None,
) -> None:
    """Log in, apply the role, clean up and seal; Ansible's output goes to ``log`` (redacted, kept after the run so
    a failure can be read). ``extra_vars`` (no secrets) reach the playbook beside the customization's: image.customize
    sets ``sbom_inventory`` so the sbom role hands it the image's package database before the seal."""
    login = Login(host, port, target.user, target.key.private)
    waited = wait_for_login(login, timeout=timeout, say=say, gone=gone)
    say(f"logged in as {target.user}@{host} after {waited:.0f} s")
    log.parent.mkdir(parents=True, exist_ok=True)
    run_playbook(
        login,
        "customize.yml",
        {**target.customization.role_vars(user=target.user, keep_user=target.keep_user), **(extra_vars or {})},
        secret_env=target.customization.secret_env(),
        log=log,
        redact=target.redact,
        say=say,
    )


def log_path(folder: Path, name: str) -> Path:
    """``<folder>/logs/<name>-customize-<UTC time>.log``, as builds name theirs."""
    import datetime as dt

    return folder / "logs" / f"{name}-customize-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.log"
