"""The grammars of the values that travel from input to somewhere that interprets them.

Each function takes text (or a number already typed by a parser) and returns the value in its canonical form, or
raises :class:`ValueError` whose message says what was expected. The same function serves a command-line flag
(:mod:`imagebuilder.cli.flags` names the flag) and a config field (the models name the file and field), so a value is
held to one rule wherever it is written. Numbers are strict: digits only (Python's ``int`` would take ``1_0`` and
`` 10 ``), booleans are not numbers.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from imagebuilder.core import untrusted
from imagebuilder.core.untrusted import redact_url

_DIGITS = re.compile(r"[0-9]{1,18}")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_DURATION = re.compile(r"([0-9]{1,9})(s|m|h)?")


def integer(value: object, lo: int, hi: int) -> int:
    """A whole number from ``lo`` to ``hi``: an int (not a bool) or text of digits."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number from {lo} to {hi}, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.lstrip("-")) and value.count("-") <= int(value[:1] == "-"):
        number = int(value)
    else:
        raise ValueError(f"expected a whole number from {lo} to {hi}, got {str(value)[:40]!r}")
    if not lo <= number <= hi:
        raise ValueError(f"{number} is out of range (expected {lo} to {hi})")
    return number


_PERCENTAGE = re.compile(r"\d{1,3}(\.\d{1,2})?")


def percentage(value: str) -> float:
    """A percentage from 0 to 100, with at most two decimals (``90``, ``87.5``)."""
    if not _PERCENTAGE.fullmatch(value.strip()) or float(value) > 100:
        raise ValueError("expected a percentage from 0 to 100 (90, 87.5)")
    return float(value)


def port(value: object) -> int:
    """A TCP/UDP port, 1 to 65535."""
    try:
        return integer(value, 1, 65535)
    except ValueError:
        raise ValueError(f"expected a port from 1 to 65535, got {str(value)[:40]!r}") from None


def duration(value: object, lo: int, hi: int) -> int:
    """Seconds from ``lo`` to ``hi``: a number of seconds, or digits with s, m or h."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"expected seconds ({lo} to {hi}) or a number with s, m or h, got {str(value)[:40]!r}")
    seconds = int(match.group(1)) * {"s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    if not lo <= seconds <= hi:
        raise ValueError(f"{seconds} s is out of range (expected {lo} to {hi} s)")
    return seconds


def is_ip(text: str, version: int | None = None) -> bool:
    """``text`` is an IP address (of ``version`` 4 or 6, when given)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return version is None or address.version == version


def ip_address(text: str) -> str:
    """An IPv4 or IPv6 address in its canonical form."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"expected an IPv4 or IPv6 address, got {text[:60]!r}") from None


#: the characters of an IPv4 or IPv6 address (an IPv6 one in brackets too, or with a zone after '%')
_ADDRESS_LIKE = re.compile(r"\[?[0-9A-Fa-f.:]+(%[^\]]*)?\]?")


def hostname(text: str) -> str:
    """A DNS name (RFC 1123 labels, at most 253 characters) or an IP address; lower-cased."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected a host name or IP address, got nothing")
    if _ADDRESS_LIKE.fullmatch(text):  # only what could be an address is parsed as one (a failed parse is slow)
        try:
            return str(ipaddress.ip_address(text.strip("[]") if text.startswith("[") else text))
        except ValueError:
            pass
    name = text.rstrip(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"expected a host name (letters, digits, '-', dots) or an IP address, got {text[:60]!r}")
    return name.lower()


def host_port(text: str, default_port: int | None = None) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port``."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected host or host:port, got nothing")
    host, port_text = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"expected [IPv6]:port, got {text[:60]!r}")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"expected [IPv6]:port, got {text[:60]!r}")
            port_text = rest[1:]
        return ip_address(host), port(port_text) if port_text is not None else default_port
    if text.count(":") == 1:
        host, port_text = text.split(":")
    return hostname(host), port(port_text) if port_text is not None else default_port


def url(text: str, schemes: tuple[str, ...] = ("https",), *, credentials: bool = False) -> SplitResult:
    """An absolute URL with one of ``schemes``, a valid host and port; user:password only when allowed.

    Messages never repeat a password that was in the URL."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected a URL, got nothing")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in text):
        raise ValueError("a URL may not contain spaces or control characters")
    shown = redact_url(text)
    try:
        parts = urlsplit(text)
        if parts.port == 0:  # urlsplit raises past 65535 only: port 0 names no service
            raise ValueError(parts.port)
    except ValueError:
        raise ValueError(f"expected a URL ({'/'.join(schemes)}), got {shown[:80]!r}: bad port or address") from None
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"expected a {' or '.join(schemes)} URL, got {shown[:80]!r}")
    if not parts.hostname:
        raise ValueError(f"the URL {shown[:80]!r} has no host")
    if (parts.username or parts.password) and not credentials:
        raise ValueError(f"the URL {shown[:80]!r} carries credentials; give them in the environment instead")
    hostname(parts.hostname)
    return parts


#: what the kernel takes (dev_valid_name: no '/', ':' or white space; ':' names an old-style alias label, which
#: neither DHCP server can listen on) and a shell or a dhcpd.conf string holds without escaping
_INTERFACE = re.compile(r"[A-Za-z0-9_.@-]{1,15}")
_LINUX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_NO_PROXY_ENTRY = re.compile(r"[A-Za-z0-9.*:/_\[\]-]+")


def interface_name(text: str) -> str:
    """A Linux network interface name (IFNAMSIZ: at most 15 characters), not '.' or '..'."""
    if not isinstance(text, str) or not _INTERFACE.fullmatch(text) or text in (".", ".."):
        raise ValueError(f"{str(text)[:40]!r} is not a network interface name")
    return text


def linux_user(text: str) -> str:
    """A portable Linux user name (useradd's default rule): never starts with '-', so never reads as an option."""
    if not _LINUX_USER.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a Linux user name ([a-z_][a-z0-9_-]*, 32 at most)")
    return text


def no_proxy_list(text: str) -> str:
    """A no_proxy value: hosts, domains, IPs and CIDRs separated by commas (spaces around them allowed)."""
    entries = text.replace(" ", "").split(",")
    if not all(_NO_PROXY_ENTRY.fullmatch(e) for e in entries):
        raise ValueError(f"{text[:60]!r} is not a no_proxy list (hosts, domains, CIDRs, comma-separated)")
    return text


_CLUSTER = re.compile(r"[a-zA-Z][a-zA-Z0-9-]{1,79}")


def cluster_name(text: object) -> str:
    """A cluster name as the product accepts it: a letter, then letters, digits and '-'; at most 80 characters."""
    if not isinstance(text, str) or not _CLUSTER.fullmatch(text):
        raise ValueError(
            f"{str(text)[:60]!r} is not a cluster name (a letter, then letters, digits and '-', 2 to 80 characters)"
        )
    return text


def domain_name(text: object) -> str:
    """A DNS domain name: labels of letters, digits and '-', separated by dots."""
    if not isinstance(text, str) or not text or text.replace(".", "").isdigit():
        raise ValueError(f"{str(text)[:60]!r} is not a domain name")
    try:
        name = hostname(text)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a domain name (labels of letters, digits and '-', dots)") from None
    return name


_DISPLAY_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]+")


def display_name(text: str, what: str, limit: int = 255) -> str:
    """A name a service shows and stores (a CloudStack template, a Nutanix image): 1 to ``limit`` printable
    characters (no control, reordering or zero-width character), no leading or trailing space."""
    if not isinstance(text, str) or not _DISPLAY_NAME.fullmatch(text) or len(text) > limit or text != text.strip():
        article = "an" if what[:1].lower() in tuple("aeiou") else "a"
        raise ValueError(
            f"expected {article} {what} name (1-{limit} printable characters), got {untrusted.shown(text, 60)!r}"
        )
    return text


#: hex digits of each digest kind a config file, manifest or flag may give
DIGEST_HEX_LENGTH = {"sha256": 64, "sha512": 128}


def is_hex_digest(value: str, kind: str) -> bool:
    """``value`` is a ``kind`` digest written in hex (either case)."""
    n = DIGEST_HEX_LENGTH.get(kind)
    return n is not None and re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", value) is not None


def digest_in_sums(text: str, name: str, kind: str = "sha256") -> str | None:
    """The ``kind`` digest a checksum file published beside a file gives for ``name``, or None: a lone digest (a
    ``.sha256`` of one file), or ``sha256sum`` lines (``<hex>  name`` or ``<hex> *name``), of which the line naming
    ``name`` counts. Lower case; a file that is neither gives None (it is never quoted: see callers)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) == 1 and is_hex_digest(lines[0], kind):
        return lines[0].lower()
    for ln in lines:
        parts = ln.split(None, 1)
        if len(parts) == 2 and is_hex_digest(parts[0], kind) and parts[1].lstrip("*").rsplit("/", 1)[-1] == name:
            return parts[0].lower()
    return None


# AWS names (ami.export, spec 4.4): held to the services' own rules, so a typo fails here and not in a request
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_AWS_REGION = re.compile(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}")
_IAM_ROLE = re.compile(r"[\w+=,.@-]{1,64}", re.ASCII)
_AMI_ID = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")


def s3_bucket(text: str) -> str:
    """An S3 bucket name (general purpose): 3-63 lower-case letters, digits, dots and hyphens, starting and ending
    with a letter or digit, no '..', not an IP address, none of the reserved prefixes and suffixes."""
    reserved = text.startswith(("xn--", "sthree-", "amzn-s3-demo-")) or text.endswith(("-s3alias", "--ol-s3", "--x-s3"))
    ip_like = re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+", text) is not None
    if not _S3_BUCKET.fullmatch(text) or ".." in text or ip_like or reserved:
        raise ValueError(f"expected an S3 bucket name (3-63 of a-z 0-9 . -), got {text[:70]!r}")
    return text


def s3_prefix(text: str) -> str:
    """A key prefix inside a bucket: printable, no leading '/', no empty or '.'/'..' segment; canonical form without
    a trailing '/' ('' for the bucket's top)."""
    value = text.rstrip("/")
    segments = value.split("/") if value else []
    if (
        len(text) > 900
        or text.startswith("/")
        or any(not s or s in (".", "..") for s in segments)
        or any(not c.isprintable() for c in text)
    ):
        raise ValueError(f"expected a key prefix such as exports/node-images, got {text[:70]!r}")
    return value


def _matching(pattern: re.Pattern[str], text: str, expected: str) -> str:
    if not pattern.fullmatch(text):
        raise ValueError(f"expected {expected}, got {text[:70]!r}")
    return text


def aws_region(text: str) -> str:
    """An AWS region code (us-west-2, eu-central-1, us-gov-west-1)."""
    return _matching(_AWS_REGION, text, "an AWS region such as us-west-2")


def iam_role_name(text: str) -> str:
    """An IAM role name: 1-64 of letters, digits and + = , . @ _ -."""
    return _matching(_IAM_ROLE, text, "an IAM role name (1-64 of A-Z a-z 0-9 + = , . @ _ -)")


def ami_id(text: str) -> str:
    """An AMI ID: ami- and 8 or 17 hex digits."""
    return _matching(_AMI_ID, text, "an AMI ID such as ami-0123456789abcdef0")
