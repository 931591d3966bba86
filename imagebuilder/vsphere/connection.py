"""The vCenter connection's bottom layer: server, credentials, TLS trust and call counting (polling is
:func:`imagebuilder.core.progress.poll`, shared with every service that runs tasks).

Everything vSphere builds on this: the REST and SSO clients, and the :class:`~imagebuilder.vsphere.session.VSphere`
facade above them. It imports none of them.

Credentials come only from the environment (spec 5): ``<PREFIX>_VSPHERE_USERNAME``/``_PASSWORD`` (the product's
prefix, from the profile) or govc's ``GOVC_USERNAME``/``GOVC_PASSWORD``/``GOVC_URL``. They are never read from argv
(another user could see them in ``ps``) and never printed; :class:`Credentials` hides the password from ``repr``.

TLS is verified by default. A self-signed vCenter is either pinned by its SHA1 thumbprint (what the cluster spec's
``thumbprint`` field holds, spec 2.5) or, knowingly, ``insecure``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import ExternalError, InputError

#: a SHA1 thumbprint as vSphere writes it: 20 upper-case hex pairs joined by colons
THUMBPRINT_RE = re.compile(r"^(?:[0-9A-F]{2}:){19}[0-9A-F]{2}$")
THUMBPRINT_EXPECTED = "the SHA1 thumbprint: 20 hex pairs joined by ':' (image-builder vsphere.thumbprint --server HOST)"


def split_server(value: str) -> tuple[str, int]:
    """``vc.example.com``, ``vc:8443``, ``https://vc/sdk`` or ``https://u:p@vc:8443/sdk`` -> (host, port)."""
    text = value.strip()
    try:
        # user:password@ is allowed (GOVC_URL carries it) and never repeated in a message
        parts = grammar.url(text if "://" in text else f"https://{text}", ("https", "http"), credentials=True)
    except ValueError as exc:
        raise InputError(
            f"{untrusted.redact_url(text)[:80]!r} is not a server address: {exc}",
            field="server",
            expected="a host name, IP or URL (a password with '#', '/' or '@' must be percent-encoded)",
        ) from None
    assert parts.hostname
    return parts.hostname, parts.port or 443


@dataclass(frozen=True)
class Target:
    """Which vCenter, and how its certificate is trusted."""

    server: str
    insecure: bool = False
    thumbprint: str | None = None

    @property
    def host(self) -> str:
        return split_server(self.server)[0]

    @property
    def port(self) -> int:
        return split_server(self.server)[1]

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def target_from(server: str | None, insecure: bool | None, thumbprint: str | None, env: Mapping[str, str]) -> Target:
    """The target from flags (or a config file), falling back to ``GOVC_URL``, ``GOVC_INSECURE`` and
    ``GOVC_THUMBPRINT`` in ``env``."""
    server = server or env.get("GOVC_URL")
    if not server:
        raise InputError(
            "no vCenter given", field="--server", expected="--server HOST (or GOVC_URL in the environment)"
        )
    if insecure is None:
        insecure = _truthy(env.get("GOVC_INSECURE"))
    thumbprint = thumbprint or env.get("GOVC_THUMBPRINT") or None
    if thumbprint:
        thumbprint = thumbprint.strip().upper()
        if not THUMBPRINT_RE.match(thumbprint):
            raise InputError(f"'{thumbprint}' is not a thumbprint", field="--thumbprint", expected=THUMBPRINT_EXPECTED)
    # userinfo in GOVC_URL is a credential; only host and port are kept
    host, port = split_server(server)
    return Target(f"{host}:{port}", insecure=insecure, thumbprint=thumbprint)


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials:
    """``<PREFIX>_VSPHERE_USERNAME``/``_PASSWORD``, else ``GOVC_USERNAME``/``GOVC_PASSWORD``, else the user info of
    ``GOVC_URL`` (spec 5)."""
    env = os.environ if env is None else env
    from imagebuilder.release.profile import load_profile  # pydantic: when a connection is made, not at start-up

    prefix = f"{load_profile().product.env_prefix}_VSPHERE"
    for user_var, pass_var in ((f"{prefix}_USERNAME", f"{prefix}_PASSWORD"), ("GOVC_USERNAME", "GOVC_PASSWORD")):
        if env.get(user_var) and env.get(pass_var):
            return Credentials(env[user_var], env[pass_var])
    url = env.get("GOVC_URL", "")
    if "://" in url or "@" in url:
        parts = urlsplit(url if "://" in url else f"https://{url}")
        if parts.username and parts.password:
            return Credentials(unquote(parts.username), unquote(parts.password))
    raise InputError(
        "no vCenter credentials in the environment",
        field="environment",
        expected=f"{prefix}_USERNAME and {prefix}_PASSWORD (or GOVC_USERNAME and GOVC_PASSWORD), not flags",
    )


def fetch_certificate(host: str, port: int = 443, timeout: float = 10.0) -> bytes:
    """The server's leaf certificate (DER), read without trusting it: this is how the thumbprint is learned."""
    ctx = _unverified()
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            ctx.wrap_socket(sock, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except OSError as exc:
        raise ExternalError(
            f"cannot read the TLS certificate of {host}:{port}: {exc}", hint="check the server name, port and network"
        ) from None
    if not der:
        raise ExternalError(f"{host}:{port} presented no certificate")
    return der


def sha1_thumbprint(der: bytes) -> str:
    """``AA:BB:...`` -- the SHA1 of the DER certificate, upper-case pairs, as vSphere and the cluster spec write it."""
    digest = hashlib.sha1(der, usedforsecurity=False).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def server_thumbprint(target: Target) -> str:
    return sha1_thumbprint(fetch_certificate(target.host, target.port))


def ssl_context(target: Target) -> ssl.SSLContext:
    """Verify against the system CAs, or -- for a pinned or insecure target -- accept the certificate here and check
    the pin separately (:func:`check_pin` before the SOAP login; the REST and SSO client on each connection)."""
    if target.insecure or target.thumbprint:
        return _unverified()
    return ssl.create_default_context()


def _unverified() -> ssl.SSLContext:
    """A TLS client context that accepts any certificate (no CA bundle loaded: nothing is verified by it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_pin(target: Target) -> None:
    """Before the SOAP login: pyvmomi does not check a thumbprint when it is given an SSL context, so the pin is
    checked here on a connection of our own (REST and SSO check it on each of their connections)."""
    if target.thumbprint and not target.insecure:
        actual = server_thumbprint(target)
        if actual != target.thumbprint:
            raise ExternalError(
                f"the certificate of {target.server} has thumbprint {actual}, not the pinned {target.thumbprint}",
                hint=PIN_HINT,
            )


PIN_HINT = "if the vCenter certificate was replaced, check it and pass the new thumbprint"
_TLS_HINT = "pin it with --thumbprint (image-builder vsphere.thumbprint --server HOST prints it) or pass --insecure"


@contextlib.contextmanager
def external_errors(what: str) -> Iterator[None]:
    """Turn a vCenter, HTTP or socket failure into an :class:`ExternalError` (exit 1) naming ``what`` failed."""
    from pyVmomi import vmodl

    try:
        yield
    except ssl.SSLCertVerificationError as exc:
        raise ExternalError(
            f"{what}: the server certificate is not trusted ({exc.verify_message})", hint=_TLS_HINT
        ) from None
    except ssl.SSLError as exc:
        raise ExternalError(
            f"{what}: the TLS connection to vCenter broke ({exc})",
            hint="check that vCenter is up and reachable, then rerun: completed steps are kept and not repeated",
        ) from None
    except vmodl.MethodFault as exc:
        raise ExternalError(f"{what}: vCenter refused: {fault_text(exc)}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ExternalError(
            f"{what}: lost the connection to vCenter ({type(exc).__name__}: {exc})",
            hint="check that vCenter is up and reachable, then rerun: completed steps are kept and not repeated",
        ) from None


def fault_text(exc: Any) -> str:
    msg = getattr(exc, "msg", "") or ""
    name = type(exc).__name__.rsplit(".", 1)[-1]
    return f"{name}: {msg}" if msg else name


class CallCounter:
    """API calls made, by kind (the benchmark reports calls per template); safe across import threads."""

    def __init__(self) -> None:
        self.soap = 0
        self.rest = 0
        self._lock = threading.Lock()

    def count_soap(self) -> None:
        with self._lock:
            self.soap += 1

    def count_rest(self) -> None:
        with self._lock:
            self.rest += 1

    @property
    def total(self) -> int:
        return self.soap + self.rest
