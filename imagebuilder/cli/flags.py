"""The one flag layer: every typed flag is parsed here, and every bad value exits 2 naming the flag.

Tasks declare their flags as text (Invoke would otherwise convert ``--port abc`` itself and crash with a traceback)
and turn each into its type with one of these functions. The rules are those of :mod:`imagebuilder.core.grammar`, the
same a config file's fields follow.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import SplitResult

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import InputError, did_you_mean

if TYPE_CHECKING:
    from imagebuilder.hardening.model import HardeningRequest

T = TypeVar("T")


def _typed(flag: str, value: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(value)
    except ValueError as exc:
        raise InputError(str(exc), field=flag) from None


def required(value: T | None, flag: str, expected: str) -> T:
    """``value`` when given (a text, or the list of a repeatable flag); a missing required flag says what it
    wants. Every task checks its required flags with this, so the message is the same everywhere."""
    if not value:
        raise InputError("required flag missing", field=flag, expected=expected)
    return value


def integer(value: str, flag: str, lo: int, hi: int) -> int:
    return _typed(flag, value, lambda v: grammar.integer(v, lo, hi))


def percentage(value: str, flag: str) -> float:
    return _typed(flag, value, grammar.percentage)


#: the help of --hardening's companions, the same on every task that takes them
HARDENING_HELP = {
    "hardening_content": "with --hardening: folder of ComplianceAsCode data streams (ssg-<product>-ds.xml) to use"
    " (default: {=hardening_content} built from source, cached)",
    "hardening_min_pass": "with --hardening: the pass rate over the applicable rules the scan must reach, in percent"
    " (default {=hardening_min_pass})",
}


def hardening(profile: str | None, content: str | None, min_pass: str | None) -> HardeningRequest | None:
    """``--hardening PROFILE`` with ``--hardening-content`` and ``--hardening-min-pass``; a companion without the
    profile is refused (it would do nothing)."""
    if not profile:
        for flag, value in (("--hardening-content", content), ("--hardening-min-pass", min_pass)):
            if value:
                raise InputError(f"{flag} says how to harden, and no profile is asked for", field=flag,
                                 expected="--hardening PROFILE with it, or neither")  # fmt: skip
        return None
    # imported only when asked for: a command without it answers a mistyped flag before pydantic loads
    from imagebuilder.hardening.model import DEFAULT_MIN_PASS, HardeningRequest

    folder = existing_dir(content, "--hardening-content") if content else None
    rate = percentage(min_pass, "--hardening-min-pass") if min_pass else DEFAULT_MIN_PASS
    return HardeningRequest(profile=profile, content=folder, min_pass=rate)


def port(value: str, flag: str = "--port") -> int:
    return _typed(flag, value, grammar.port)


def duration(value: str, flag: str, lo: int, hi: int) -> int:
    return _typed(flag, value, lambda v: grammar.duration(v, lo, hi))


def ip_address(value: str, flag: str) -> str:
    return _typed(flag, value, grammar.ip_address)


def url(value: str, flag: str, schemes: tuple[str, ...] = ("https",), *, credentials: bool = False) -> SplitResult:
    return _typed(flag, value, lambda v: grammar.url(v, schemes, credentials=credentials))


def base_url(value: str, flag: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL that paths are appended to (a repository's, a release's base): no query or fragment, which the path
    appended after them would not survive (``?sig=...`` + ``/metadata/1.root.json`` is another query, not a path)."""
    parts = url(value, flag, schemes)
    if parts.query or parts.fragment:
        raise InputError(f"{untrusted.shown(value)!r} has a query or fragment, which the paths appended to it would "
                         "not keep", field=flag, expected="a base URL: scheme://host[:port]/path")  # fmt: skip
    return parts.geturl()


def publish_destination(value: str, flag: str) -> str:
    """Where a TUF repository is published: s3://bucket/prefix (no credentials, query or fragment: those come from
    the environment), or a folder path (on the machine that publishes, so not checked here beyond its text)."""
    if "://" in value:
        parts = url(value, flag, ("s3",))
        if parts.query or parts.fragment:
            raise InputError("an S3 location has no query or fragment", field=flag, expected="s3://bucket/prefix")
        return parts.geturl()
    if not value or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value) or len(value) > 4096:
        raise InputError("not a folder path", field=flag, expected="a folder, or s3://bucket/prefix")
    return value


def url_or_file(value: str, flag: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL with one of ``schemes``, or an existing file."""
    if "://" in value:
        return url(value, flag, schemes).geturl()
    return str(existing_file(value, flag))


def existing_file(value: str, flag: str) -> Path:
    """A regular file that exists (links followed): a FIFO, a device or a directory is refused here, before
    anything opens it; a name the OS refuses is bad input naming ``flag``."""
    info = untrusted.path_stat(value, "file", flag) if value else None
    if info is None:
        raise InputError(f"{untrusted.shown(value)!r} does not exist", field=flag, expected="an existing file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{untrusted.shown(value)} is {untrusted.kind_of(info.st_mode)}, not a regular file",
                         field=flag, expected="an existing file")  # fmt: skip
    return Path(value)


def existing_dir(value: str, flag: str) -> Path:
    info = untrusted.path_stat(value, "directory", flag) if value else None
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise InputError(f"{untrusted.shown(value)!r} is not a directory", field=flag,
                         expected="an existing directory")  # fmt: skip
    return Path(value)


def served_dir(value: str, flag: str) -> Path:
    """A folder to serve over HTTP: an existing directory, not on one of the kernel's filesystems (``/proc`` holds the
    machine's secrets, and its entries come and go as it is walked)."""
    folder = existing_dir(value, flag)
    untrusted.refuse_pseudo_filesystem(folder, flag, "a folder of images and boot assets")
    return folder


#: the machine's own trees: never a build's output folder, and a search through them would read the whole system
SYSTEM_TREES = tuple(Path(p) for p in ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run",
                                       "/sbin", "/sys", "/usr", "/var"))  # fmt: skip


def output_folder(value: str, flag: str) -> Path:
    """An existing folder that builds write outputs into (searched through its subfolders): not ``/`` or one of the
    system's own trees."""
    folder = existing_dir(value, flag)
    if folder.resolve() in SYSTEM_TREES:
        raise InputError(f"{untrusted.shown(value)} is the system's own {folder.resolve()}, not an output folder",
                         field=flag, expected="the folder your builds write into (their --output-dir)")  # fmt: skip
    return folder


#: what a destination given as a reference or URL would be: never a local path, whatever a folder of that name
#: would hold (``repo.keygen --dest awskms:alias/x`` would write private keys into ``./awskms:alias/x``)
_NOT_A_PATH = re.compile(r"(?i)(awskms|hsm|pkcs11|s3|https?|ftp|file):")


def _local_destination(value: str, flag: str, what: str) -> Path:
    """The checks every destination shares: given, a local path (not a key reference or a URL), a name the OS
    takes, and not on one of the kernel's filesystems."""
    if not value:
        raise InputError("required flag missing", field=flag, expected=what)
    if _NOT_A_PATH.match(value):
        raise InputError(f"{untrusted.shown(value)!r} is a key reference or a URL, not a local path", field=flag,
                         expected=f"{what}; ./{untrusted.shown(value, 40)} names a folder of that name")  # fmt: skip
    path = Path(value)
    parent = path
    while untrusted.path_stat(parent, "destination", flag) is None and parent != parent.parent:
        parent = parent.parent
    untrusted.refuse_pseudo_filesystem(parent, flag, what)
    return path


def _creatable(path: Path, flag: str, what: str) -> None:
    """The nearest existing ancestor of ``path`` is a directory we can write into."""
    parent = path.parent
    while untrusted.path_stat(parent, "destination", flag) is None:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{untrusted.shown(parent)} is not a directory, so {untrusted.shown(path)} cannot be "
                         "created", field=flag, expected=what)  # fmt: skip
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{untrusted.shown(parent)} is not writable, so {untrusted.shown(path)} cannot be created",
                         field=flag, expected=what)  # fmt: skip


def dest_dir(value: str, flag: str) -> Path:
    """A directory that exists or can be created (checked, not created: a dry run creates nothing)."""
    path = _local_destination(value, flag, "a directory")
    info = untrusted.path_stat(path, "destination", flag)
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise InputError(f"{untrusted.shown(value)} exists and is not a directory", field=flag,
                             expected="a directory")  # fmt: skip
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"{untrusted.shown(value)} is not writable", field=flag, expected="a writable directory")
        return path
    _creatable(path, flag, "a directory that can be created")
    return path


def dest_file(value: str, flag: str) -> Path:
    """A file to write: not a directory, in a folder that exists or can be created."""
    path = _local_destination(value, flag, "a file path")
    info = untrusted.path_stat(path, "destination", flag)
    if (info is not None and stat.S_ISDIR(info.st_mode)) or value.endswith("/"):
        raise InputError(f"{untrusted.shown(value)} is a directory", field=flag, expected="a file path")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise InputError(f"{untrusted.shown(value)} is {untrusted.kind_of(info.st_mode)}", field=flag,
                         expected="a regular file's path")  # fmt: skip
    if info is not None and not os.access(path, os.W_OK):
        raise InputError(f"{untrusted.shown(value)} is not writable", field=flag, expected="a writable file")
    _creatable(path, flag, "a file in a folder that exists or can be created")
    return path


def hex_digest(value: str, flag: str, kind: str) -> str:
    """A ``kind`` digest (sha256, sha512) written in hex, lowercased: checked before anything is fetched."""
    if not grammar.is_hex_digest(value.strip(), kind):
        n = grammar.DIGEST_HEX_LENGTH[kind]
        raise InputError(f"{untrusted.printable(value[:40])!r} is not a {kind.upper()}", field=flag,
                         expected=f"{n} hex digits")  # fmt: skip
    return value.strip().lower()


def grammar_of(parse: Callable[[str], str], value: str, flag: str) -> str:
    """``value`` held to one of :mod:`imagebuilder.core.grammar`'s rules, named by ``flag`` when it breaks it."""
    return _typed(flag, value, parse)


def comma_list(value: str | list[str] | None, flag: str) -> list[str]:
    """A list of distinct values, comma-separated, repeated, or both (``--os ubuntu,redhat``, ``--os ubuntu --os
    redhat``): every list flag takes both (issue 61; a task declares it ``iterable`` for the repetition)."""
    joined = ",".join(value) if isinstance(value, list) else (value or "")
    items = [v.strip() for v in joined.split(",") if v.strip()]
    if not items:
        raise InputError("is empty", field=flag, expected="a comma-separated list")
    if len(set(items)) != len(items):
        raise InputError(f"lists a value twice: {joined}", field=flag, expected="each value once")
    return items


#: what a switch's value may be, when one is given (``--insecure=false``)
_SWITCH_VALUES = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def switch(value: str | bool | None, flag: str) -> bool | None:
    """A switch that may carry a value: given alone, on; ``=true``/``=false`` (and yes/no, on/off, 1/0) as said;
    not given, None (the caller's default). Anything else is bad input, never "true" because it is not empty."""
    if value is None or isinstance(value, bool):
        return value
    key = value.strip().lower()
    if key not in _SWITCH_VALUES:
        raise InputError(f"{untrusted.shown(value, 40)!r} is not on or off", field=flag,
                         expected=f"{flag} alone, or {flag}=true|false")  # fmt: skip
    return _SWITCH_VALUES[key]


def listed(value: str | list[str] | None, flag: str) -> list[str]:
    """An optional list flag's values (:func:`comma_list`), or none when it is not given."""
    return comma_list(value, flag) if value else []


def choice(value: str, flag: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(
            f"{value[:40]!r} is not one of them{did_you_mean(value, choices)}",
            field=flag,
            expected=" or ".join(choices),
        )
    return value


def secret(value: str, flag: str) -> str:
    """``-`` reads stdin, ``@FILE`` a file, ``env:VAR`` a variable; anything else is the secret itself (and is
    visible in the process list, so a warning says so)."""
    if value == "-":
        secret = sys.stdin.readline().rstrip("\n")
    elif value.startswith("@"):
        secret = untrusted.read_text(value[1:], "secret file", limit=untrusted.LIMITS["small"], field=flag)
        secret = secret.rstrip("\n")
    elif value.startswith("env:"):
        secret = os.environ.get(value[4:], "")
        if not secret:
            raise InputError(f"environment variable {untrusted.shown(value[4:], 60)} is empty or unset", field=flag)
    else:
        print(
            f"warning: a secret given on the command line is visible to other users in the process list; "
            f"prefer {flag} @FILE, {flag} - (stdin) or {flag} env:VAR",
            file=sys.stderr,
        )
        secret = value
    if not secret:
        raise InputError("the password is empty", field=flag)
    return secret


#: where ``--signing-key`` comes from when the flag is not given
SIGNING_KEY_ENV = "IMAGE_BUILDER_SIGNING_KEY"


def key(value: str, flag: str) -> str | Path:
    """A key: a reference to a KMS or token key (``awskms:``, ``hsm:``, ``pkcs11:``; parsed when it is loaded), else
    an existing file."""
    from imagebuilder.attest.signers import is_reference

    return value if is_reference(value) else existing_file(value, flag)


def signing_key(value: str | None, flag: str = "--signing-key") -> str | Path | None:
    """The key to sign with (the flag, else ``$IMAGE_BUILDER_SIGNING_KEY``), or None. Only its path or reference
    travels; the key is read (and its file's mode checked, or the KMS or token asked) by
    :func:`imagebuilder.attest.keys.load_signer`."""
    given = value or os.environ.get(SIGNING_KEY_ENV) or None
    return key(given, flag if value else SIGNING_KEY_ENV) if given else None


#: what each flag takes, by its name in the tasks' signatures (issue 60). The flag harness (tests/integration/
#: adversarial/test_every_flag.py) attacks a flag with the hostile values of its kind on top of those every flag
#: gets; a flag not listed here gets the kind its name implies (:func:`flag_kind`), so a new flag is attacked without
#: a word added. Kinds: ``document`` (a file that is parsed), ``path-in``, ``path-out``, ``key`` (a key file or a
#: KMS or token reference), ``url``, ``number``, ``duration``, ``version``, ``choice``, ``name``, ``secret``,
#: ``text``.
FLAG_KINDS: dict[str, str] = {
    "against": "path-in", "ova": "path-in", "image": "path-in", "source": "path-in", "source_image": "path-in",
    "packer": "path-in", "packer_plugins": "path-in", "public_key": "path-in", "keys": "path-in", "dir": "path-in",
    "mirror": "path-in", "repo": "path-in", "layer_cache": "path-out", "emit_file": "path-out", "prefix": "path-in",
    "root": "document", "manifest": "document", "file": "document", "from_file": "document", "config": "document",
    "customize": "document", "files_config": "document", "provenance": "document", "release_manifest": "document",
    "signing_key": "key", "key": "key", "new_key": "key",
    "url": "url", "base_url": "url", "metadata_url": "url", "targets_url": "url", "http_proxy": "url",
    "https_proxy": "url", "server": "text", "dhcp_server": "choice", "ci_publish": "url",
    "disk_gb": "number", "min_disk_gb": "number", "size_gb": "number", "port": "number", "jobs": "number",
    "threshold": "number", "ci_concurrency": "number", "ansible_verbosity": "number",
    "timeout": "duration", "boot_timeout": "duration", "node_timeout": "duration", "expires": "text",
    "kubernetes": "version", "release_channel": "version", "os_version": "version", "containerd": "version",
    "eksa_release": "version",
    "os": "choice", "hypervisor": "choice", "provider": "choice", "variant": "choice", "engine": "choice",
    "firmware": "choice", "runtime": "choice", "arch": "choice", "emit": "choice", "type": "choice",
    "format": "choice", "role": "choice", "suite": "choice", "pairs": "choice", "roles": "choice",
    "skip_check": "choice",
    "password": "secret",
    "hardening": "name", "hardening_content": "path-in", "hardening_min_pass": "number",
    "hardening_product": "name",
}  # fmt: skip
#: a flag's kind read from its name when :data:`FLAG_KINDS` does not list it (first match wins)
_KIND_BY_NAME: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"(^|_)(dest|output|output_dir|log|out)$|_file$", "path-out"),
        (r"_config$|(^|_)(manifest|spec)$", "document"),
        (r"(^|_)(url|proxy)$", "url"),
        (r"(^|_)key$", "key"),
        (r"(^|_)(gb|count|jobs|port|threshold|concurrency)$", "number"),
        (r"(^|_)timeout$", "duration"),
        (r"(^|_)(dir|path|image|folder)$", "path-in"),
        (r"(^|_)(password|token|secret)$", "secret"),
        (r"(^|_)(version|release)$", "version"),
        (r"(^|_)name$", "name"),
    )
)


def flag_kind(name: str) -> str:
    """The kind of the flag ``name`` (``disk_gb`` or ``--disk-gb``): listed in :data:`FLAG_KINDS`, else read from
    its name, else ``text``."""
    key = name.removeprefix("--").replace("-", "_")
    listed = FLAG_KINDS.get(key)
    if listed is not None:
        return listed
    return next((kind for pattern, kind in _KIND_BY_NAME if pattern.search(key)), "text")
