"""The one untrusted-value layer: how a value from outside is shown, opened and parsed.

A value from outside is anything the user or another machine chose: a flag, an environment variable, a file a user
named or a document pointed at, a reply. Such a value reaches three kinds of code, and each has one way in, here:

- **a message** (an error, a warning, a dry run's plan, any output): :func:`shown` renders one value (credentials
  masked, control characters replaced, long values shortened), :func:`message` a whole text; the command line passes
  everything it prints through :func:`masked` and every error through :func:`message`, so a value quoted by code
  that forgot :func:`shown` is still masked;
- **a file**: :func:`read_bytes` and :func:`read_text` open regular files only, without blocking on a FIFO or a
  device, under a size limit, and turn a name the OS refuses into bad input (exit 2) instead of a crash;
  :func:`path_stat` answers "what is there" for a path the same way;
- **a document**: :func:`parse_json` bounds size and depth before parsing (then a strict model reads it:
  :mod:`imagebuilder.core.validation`); YAML's bounds are :func:`imagebuilder.core.files.parse_yaml_documents`'.

Why one place: each new group of tasks met hostile input less well than the last, because each wrote its own
quoting, opening and parsing. Credentials hide in more places than ``user:password@`` (a PKCS#11 ``pin-value`` in
any case, an ``hsm:`` query, a presigned URL's token), and a name too long for the OS, a FIFO or a document nested
100,000 deep each crashed or hung a task that had not thought of it. `tests/unit/test_layers.py` holds the rest of
the library to this module.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from imagebuilder.core.errors import InputError

if TYPE_CHECKING:
    from xml.etree.ElementTree import Element

MASK = "********"

# ---------------------------------------------------------------------------------------------------------------
# credentials: masked in every position of every reference form the tool takes

#: ``scheme://user:password@``, also as a path spells it once normalised (``scheme:/user:password@``: pathlib and
#: os.path fold the double slash of a URL given where a file was expected, and a message then quotes the path). The
#: password runs to the last ``@`` before a space: a password may hold ``@``, ``/`` and ``:``
_URL_USERINFO = re.compile(r"((?:[A-Za-z][A-Za-z0-9+.-]{0,31})?:/{1,2})([^/\s:@]*):([^\s]*)@")
#: ``scheme://TOKEN@``: a user part without a password is a token as often as a name (``s3://KEY@bucket``). It runs
#: to the last ``@`` before a space, a ``:`` or the query (an AWS secret holds ``/`` and ``+``, a token may hold
#: ``@``), but for an image digest's (``oci://registry/pause@sha256:...`` names no one): erring on the side of
#: hiding, a path that holds an ``@`` is hidden with it
_URL_TOKEN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}:/{1,2})([^\s:@?#][^\s:?#]*)@(?!sha(?:256|384|512):)")
#: a URL's query: its values are signatures, tokens and keys as often as anything else
_URL_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}:/{1,2}[^\s?#]*\?)([^\s#]*)")
#: a key in a KMS or on a token, whatever the case of its scheme: ``pkcs11:``, ``hsm:``, ``awskms:``
_KEY_REFERENCE = re.compile(r"(?i)(?<![A-Za-z0-9+.-])(pkcs11|hsm|awskms):([^\s'\"]*)")
#: what a PKCS#11 URI's path may show (RFC 7512's attributes that name a thing); any other attribute, whatever its
#: case (``PIN-VALUE``), is masked
_P11_SHOWN = {"token", "id", "object", "type", "manufacturer", "model", "serial", "library-manufacturer",
              "library-description", "library-version", "slot-description", "slot-manufacturer", "slot-id"}  # fmt: skip
#: what a query may show, per reference scheme; every other query value is masked
_QUERY_SHOWN = {"pkcs11": {"module-path", "module-name"}, "hsm": {"label"}, "awskms": set()}


def _mask_query(query: str, shown: set[str] | frozenset[str] = frozenset()) -> str:
    """Every value of a query hidden but those named in ``shown``, its names kept (``X-Amz-Signature=********``);
    a part without a name goes whole."""
    return "&".join(
        part if part.split("=", 1)[0].lower() in shown else (
            f"{part.split('=', 1)[0]}={MASK}" if "=" in part else (MASK if part else part))
        for part in query.split("&")
    )  # fmt: skip


def _mask_key_reference(scheme: str, rest: str) -> str:
    kind = scheme.lower()
    path, sep, query = rest.partition("?")
    if kind == "pkcs11":
        names = [part.split("=", 1)[0] for part in path.split(";")]
        path = ";".join(
            part if "=" not in part or name.lower() in _P11_SHOWN else f"{name}={MASK}"
            for name, part in zip(names, path.split(";"), strict=True)
        )
    elif "=" in path:  # an hsm: or awskms: key is never name=value: what is, is not a key id
        path = MASK
    return f"{scheme}:{path}{sep}{_mask_query(query, _QUERY_SHOWN[kind]) if sep else ''}"


def masked(text: str) -> str:
    """``text`` with every credential in it replaced by ``********``, wherever it sits: the password of a URL's
    ``user:password@`` (and a user part that stands alone: a token), every value of a URL's query, every PKCS#11
    attribute that names no object (a ``pin-value`` in any case) and every query field of a key reference but the
    module and the label. For free text of any kind (messages, output); :func:`shown` for one value."""
    if ":" not in text:
        return text  # no URL and no reference: the common case, at no cost
    # a password runs to the last ``@`` (it may hold ``?``); a lone token stops at the query, whose values may hold
    # an ``@`` of their own
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    text = _URL_TOKEN.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _URL_QUERY.sub(lambda m: f"{m.group(1)}{_mask_query(m.group(2))}", text)
    return _KEY_REFERENCE.sub(lambda m: _mask_key_reference(m.group(1), m.group(2)), text)


#: how much of one value or one line is read for credentials (a scheme is 32 characters at most, so each pattern
#: costs a bounded amount per character; what is past this is never shown)
SCAN = 8192


def _masked_head(text: str, cap: int = SCAN) -> str:
    """:func:`masked` of ``text``'s first ``cap`` characters, a credential cut at the cap hidden too: the head is
    masked as if an ``@`` followed it (a ``user:pass`` or token cut before its ``@`` is then one)."""
    if len(text) <= cap:
        return masked(text)
    out = masked(text[:cap] + "@")
    return out[:-1] if out.endswith("@") else out


def redact_url(text: str) -> str:
    """One URL with its secrets replaced: safe to print. The password of a ``user:password@`` part, a user part
    without a password (a token: ``s3://TOKEN@bucket``), every query value.

    Errs on the side of hiding: everything between the first ':' of the user part and the last '@' goes."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    if "@" in rest and not re.match(r"sha(?:256|384|512):", rest.rpartition("@")[2]):  # an image digest's @
        userinfo, _, host = rest.rpartition("@")
        user = userinfo.split(":", 1)[0]
        if ":" in userinfo and not any(c in user for c in "/?#"):  # a password runs to the last ``@``: it may hold
            rest = f"{user}:{MASK}@{host}"  # ``@``, ``/`` and ``?`` (a user name holds none of them)
        elif sep and not any(c in userinfo for c in "?#:"):  # a lone token; an ``@`` past ``?`` is a query value's
            rest = f"{MASK}@{host}"
    if sep and "?" in rest:
        head, _, query = rest.partition("?")
        query, hash_, fragment = query.partition("#")
        rest = f"{head}?{_mask_query(query)}{hash_}{fragment}"
    return f"{scheme}{sep}{rest}"


def carries_credentials(value: str) -> bool:
    """``value`` holds something :func:`masked` would hide: it must never be written into a file the tool emits."""
    return masked(value) != value or (("://" in value) and redact_url(value) != value)


class Redactor:
    """Replaces every known secret value (a password from the environment, a generated key) in a text with
    ``********``: for the output of a child that was given them."""

    def __init__(self, values: list[str]) -> None:
        self.values = sorted({v for v in values if v}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        return text


# ---------------------------------------------------------------------------------------------------------------
# showing a value

#: C0 and C1 control characters, DEL, and the bidirectional and zero-width formatting characters
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
#: the same without the line feed: a message's own lines stay lines
_UNPRINTABLE_BUT_LF = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
#: the most lines a message prints (a document with 100,000 problems is reported by its first ones)
MESSAGE_LINES = 60


def printable(text: str, limit: int = 253) -> str:
    """Text another machine sent (a DHCP client's host name, a server's reply), made safe to print on a terminal:
    every control character (an escape sequence's ESC included) and every character that reorders or hides text
    becomes ``?``, and it is cut to ``limit`` characters."""
    out = _UNPRINTABLE.sub("?", text)
    return out if len(out) <= limit else out[: limit - 1] + "…"


#: what :func:`printable_lines` keeps of the control characters: the line feed and the tab
_UNPRINTABLE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def printable_lines(text: str) -> str:
    """Text of any length made safe for a terminal, its lines and tabs kept: every other control character (an
    escape sequence's ESC, a carriage return that would overwrite the line) and every character that reorders or hides
    text becomes ``?``. What the command line prints passes through it."""
    return _UNPRINTABLE_IN_LINES.sub("?", text)


def _clipped(original: str, head: str, limit: int, keep: int) -> str:
    """``head`` (``original`` made safe) as it is when neither is over ``limit``, else its first ``keep`` characters and
    how many more there were."""
    if len(original) <= limit and len(head) <= limit:
        return head
    return f"{head[:keep]} ... ({max(len(original), len(head)) - keep:,} more characters)"


def shown(value: object, limit: int = 120) -> str:
    """One value from outside, ready to quote in a message: its credentials masked (:func:`masked`), control and
    reordering characters replaced by ``?``, and shortened past ``limit`` characters with how many more there were
    (``... (9,860 more characters)``)."""
    text = value if isinstance(value, str) else str(value)
    return _clipped(text, _UNPRINTABLE.sub("?", _masked_head(text)), limit, limit)


def message(text: str) -> str:
    """A whole message, whatever it quotes, made safe to print: credentials masked, every control character but the
    line feed replaced, each run of more than 240 characters without a space shortened, at most
    :data:`MESSAGE_LINES` lines. The command line passes every error through it: a value some code quoted without
    :func:`shown` is still safe."""
    lines = text.split("\n", MESSAGE_LINES)
    more = text.count("\n") + 1 - MESSAGE_LINES

    def run(match: re.Match[str]) -> str:
        # no pattern of masked() crosses white space: a run is masked on its own, its first SCAN characters only
        token = match.group(0)
        return _clipped(token, _UNPRINTABLE_BUT_LF.sub("?", _masked_head(token)), 240, 200)

    def line(raw: str) -> str:
        return _UNPRINTABLE_BUT_LF.sub("?", re.sub(r"[^ \n]+", run, raw))

    return "\n".join(line(ln) for ln in lines[:MESSAGE_LINES]) + (f"\n... ({more:,} more lines)" if more > 0 else "")


# ---------------------------------------------------------------------------------------------------------------
# files: regular files only, never blocking, a name the OS refuses is bad input

#: a size limit per kind of file a user names or a document points at
LIMITS = {
    "document": 32 * 1024 * 1024,  # configs, manifests, specs: well under 1 MiB in practice
    "small": 64 * 1024,  # a key reference file, a checksum, a PEM key
}

#: filesystems that hold no user's files: a destination there is refused, and a read is of the kernel's state
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
                                "tracefs", "configfs", "bpf", "pstore", "efivarfs", "fusectl", "mqueue",
                                "binfmt_misc", "autofs", "rpc_pipefs", "nsfs"})  # fmt: skip


def _os_refusal(exc: OSError | ValueError, path: str | Path, what: str, field: str | None) -> InputError:
    """The OS's refusal of a name the user gave, as bad input that says why."""
    if isinstance(exc, ValueError):  # a NUL in the name
        return InputError(f"{what} has a NUL character in its name", source=path, field=field,
                          expected="a path")  # fmt: skip
    reasons = {
        errno.ENAMETOOLONG: ("has a name longer than the system allows", "names of at most 255 bytes, 4096 in all"),
        errno.ENOENT: (f"{what} not found", None),
        errno.ENOTDIR: (f"{what} not found (a part of its path is not a folder)", None),
        errno.ELOOP: ("is a loop of symbolic links", "a path that resolves"),
        errno.EACCES: (f"{what} cannot be read by this user", "a readable file"),
        errno.EPERM: (f"{what} cannot be read by this user", "a readable file"),
        errno.EISDIR: (f"{what} is a directory", "a file"),
    }
    detail, expected = reasons.get(exc.errno or 0, (f"cannot open {what}: {exc.strerror or exc}", None))
    return InputError(detail, source=path, field=field, expected=expected)


_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]  # fmt: skip


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a named pipe``), for a message."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "special")


def path_stat(path: str | Path, what: str = "file", field: str | None = None) -> os.stat_result | None:
    """``path``'s stat (links followed), None when nothing is there; a name the OS refuses (too long, a NUL, a
    link loop, a folder that cannot be searched) is bad input naming ``field``, never an internal error."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        raise _os_refusal(exc, path, what, field) from None


def open_regular(path: str | Path, what: str = "file", *, field: str | None = None) -> BinaryIO:
    """The regular file ``path`` (links followed), open for reading in binary.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before a byte is read: a FIFO, a device, a socket or a
    directory is refused at once (a FIFO would block the task forever, a device never ends); a name the OS refuses is
    bad input (exit 2) naming ``field``. Every reader of a file a user named or a document pointed at opens it here
    (:func:`read_bytes`, the fetcher's local reads, :func:`imagebuilder.core.files.sha256_file`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        raise _os_refusal(exc, path, what, field) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{what} is {kind_of(mode)}, not a regular file", source=path, field=field,
                             expected="a regular file")  # fmt: skip
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, what: str = "file", *, limit: int = LIMITS["document"],
               field: str | None = None) -> bytes:  # fmt: skip
    """The bytes of the regular file ``path`` (:func:`open_regular`), at most ``limit`` of them: a file over
    ``limit`` is refused by its size (a file in ``/proc`` shows 0 and is read to the limit)."""
    with open_regular(path, what, field=field) as fh:
        try:
            if os.fstat(fh.fileno()).st_size > limit or len(data := fh.read(limit + 1)) > limit:
                raise InputError(f"{what} is larger than {_size(limit)}", source=path, field=field)
        except OSError as exc:
            raise _os_refusal(exc, path, what, field) from None
    return data


def read_text(path: str | Path, what: str = "file", *, limit: int = LIMITS["document"],
              field: str | None = None) -> str:  # fmt: skip
    """:func:`read_bytes` as UTF-8 text; text that is not UTF-8 is bad input naming ``field``."""
    data = read_bytes(path, what, limit=limit, field=field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text", source=path, field=field) from None


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def filesystem_of(path: str | Path) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing ancestor) is on, from this process's mount table
    (None when it cannot be read)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    here = os.path.abspath(path)
    best, kind = "", None
    for line in mounts:
        fields = line.split(" - ", 1)
        left, right = fields[0].split(), fields[1].split() if len(fields) == 2 else []
        if len(left) < 5 or not right:
            continue
        point = left[4].encode().decode("unicode_escape")  # the table escapes spaces as \040
        inside = here == point or here.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, right[0]
    return kind


def refuse_pseudo_filesystem(path: str | Path, field: str, what: str) -> None:
    """A destination on a filesystem of the kernel's (``/proc``, ``/sys``, ``/dev``) is bad input: nothing the tool
    writes belongs there, and writes there fail half-way or change the kernel's state."""
    kind = filesystem_of(path)
    if kind in PSEUDO_FILESYSTEMS:
        raise InputError(f"{shown(path)} is on the kernel's {kind} filesystem", field=field, expected=what)


# ---------------------------------------------------------------------------------------------------------------
# documents: bounded before they are parsed

#: how deep a document may nest (no configuration, manifest or provenance comes near it)
MAX_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped), read without parsing it."""
    depth = deepest = 0
    for m in _JSON_BRACKETS.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if m.group(0) in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object naming the same key twice: which one the user meant is unknown, so neither wins."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {shown(key, 60)!r}")
        seen[key] = value
    return seen


def parse_json(text: str | bytes, source: str | Path, *, limit: int = LIMITS["document"],
               max_depth: int = MAX_DEPTH) -> Any:  # fmt: skip
    """Parse untrusted JSON strictly: at most ``limit`` bytes and ``max_depth`` levels, checked before it is parsed;
    duplicate keys, NaN and Infinity are errors; errors give line and column and never quote the text. What it
    returns is still untrusted in its shape: a strict model reads it (:mod:`imagebuilder.core.validation`)."""
    if len(text) > limit:
        raise InputError(f"document is larger than {_size(limit)}", source=source)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("is not UTF-8 text", source=source) from None
    if json_depth(text) > max_depth:
        raise InputError(f"invalid JSON: nested deeper than {max_depth} levels", source=source)

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                         source=source) from None  # fmt: skip
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply", source=source) from None
    except ValueError as exc:
        raise InputError(f"invalid JSON: {exc}", source=source) from None


def xml_elements(path: str | Path, tag_suffix: str, what: str = "XML document") -> Iterator[Element]:
    """The elements of the XML file ``path`` whose tag ends with ``tag_suffix`` (``}rule-result``), parsed
    incrementally, each cleared once the caller has it (its subtree freed; the rest of the tree is kept).
    defusedxml refuses a DTD and so every entity: no entity bomb, no external entity. A file that is not such XML
    is bad input naming ``path``."""
    from defusedxml import ElementTree
    from defusedxml.common import DefusedXmlException

    with open_regular(path, what) as fh:
        try:
            for _, element in ElementTree.iterparse(fh, events=("end",), forbid_dtd=True):
                if element.tag.endswith(tag_suffix):
                    yield element
                    element.clear()
        except (ElementTree.ParseError, DefusedXmlException) as exc:
            raise InputError(f"{what} is not well-formed XML without a DTD: {exc}", source=path) from None
