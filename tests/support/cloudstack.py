"""A CloudStack API contract server (no CloudStack simulator exists): the few commands
``cloudstack.template-register`` calls, each request checked against the API's documented rules.

What it checks on every request, as CloudStack's API documentation ("Signing API Requests", the command reference)
describes them:
- ``GET /client/api`` with ``command``, ``apiKey`` (the registered user's key), ``response=json`` and ``signature``;
- the signature: every other parameter, field names lower-cased and sorted, values URL-encoded as Java's
  URLEncoder does with ``%20`` for spaces, joined with ``&``, the whole string lower-cased, HMAC-SHA1 with the
  secret key, base64; a mismatch is error 401;
- ``signatureVersion=3`` requests carry an ``expires`` timestamp still in the future (401 otherwise);
- each command's parameters: the required ones present (431 otherwise), none it does not document (431), and
  the values of the ones it checks well formed; an unknown command is 432.
Responses have CloudStack's shape: ``{"<command>response": {"count": n, "<item>": [...]}}`` and
``{"errorresponse": {"errorcode": n, "errortext": "..."}}``.

Labelled as what it is: a contract test against a local stand-in, not a CloudStack.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

KEY = "cs-api-key-0001"
SECRET = "cs-Secret-Marker-5521"

#: command -> (required parameters, optional parameters); paging is accepted on every list command
COMMON = {"command", "apikey", "response", "signature", "signatureversion", "expires"}
PAGING = {"page", "pagesize"}
COMMANDS: dict[str, tuple[set[str], set[str]]] = {
    "listZones": (set(), {"id", "name", "available", "keyword"} | PAGING),
    "listOsTypes": (set(), {"id", "description", "oscategoryid", "keyword"} | PAGING),
    "listTemplates": ({"templatefilter"}, {"id", "name", "zoneid", "hypervisor", "keyword"} | PAGING),
    "registerTemplate": (
        {"format", "hypervisor", "name", "url"},
        {"displaytext", "ostypeid", "zoneid", "zoneids", "isextractable", "ispublic", "passwordenabled", "checksum"},
    ),
    "deleteTemplate": ({"id"}, {"zoneid", "forced"}),
}
TEMPLATE_FILTERS = {"featured", "self", "selfexecutable", "sharedexecutable", "executable", "community", "all"}
FORMATS = {"QCOW2", "RAW", "VHD", "VHDX", "OVA", "VMDK", "ISO", "TAR"}


def java_urlencode(value: str) -> str:
    """java.net.URLEncoder.encode(value, UTF-8) with '+' as %20: what CloudStack signs."""
    return quote(value, safe="*-._").replace("~", "%7E")


def signature_of(params: dict[str, str], secret: str = SECRET) -> str:
    text = "&".join(f"{k.lower()}={java_urlencode(v)}" for k, v in sorted(params.items(), key=lambda kv: kv[0].lower()))
    digest = hmac.new(secret.encode(), text.lower().encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


@dataclass
class State:
    zones: list[dict[str, Any]] = field(default_factory=lambda: [
        {"id": "zone-0001", "name": "zone-a", "allocationstate": "Enabled"},
        {"id": "zone-0002", "name": "zone-b", "allocationstate": "Enabled"},
    ])  # fmt: skip
    os_types: list[dict[str, Any]] = field(default_factory=lambda: [
        {"id": "ost-rhel8", "description": "Red Hat Enterprise Linux 8.0 (64-bit)"},
        {"id": "ost-ubuntu", "description": "Ubuntu 20.04 LTS"},
    ])  # fmt: skip
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: every request, checked and decoded (the signature removed): what the tests assert on
    requests: list[dict[str, str]] = field(default_factory=list)
    #: polls a template takes to download; a URL with "broken" in it fails instead
    polls_to_ready: int = 2


class _Error(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def _check(params: dict[str, str]) -> str:
    lowered = {k.lower(): v for k, v in params.items()}
    if lowered.get("response") != "json":
        raise _Error(431, "response=json is expected")
    if lowered.get("apikey") != KEY:
        raise _Error(401, "unable to verify user credentials and/or request signature")
    given = lowered.get("signature", "")
    signed = {k: v for k, v in params.items() if k.lower() != "signature"}
    if not hmac.compare_digest(given, signature_of(signed)):
        raise _Error(401, "unable to verify user credentials and/or request signature")
    if lowered.get("signatureversion") == "3":
        try:
            expires = dt.datetime.strptime(lowered.get("expires", ""), "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            raise _Error(401, "expires is not a timestamp (yyyy-MM-dd'T'HH:mm:ssZ)") from None
        if expires < dt.datetime.now(dt.UTC):
            raise _Error(401, "the request has expired")
    command = lowered.get("command", "")
    if command not in COMMANDS:
        raise _Error(432, f"The given command:{command} does not exist or it is not available for user")
    required, optional = COMMANDS[command]
    names = set(lowered) - COMMON
    missing = required - names
    if missing:
        raise _Error(
            431, f"Unable to execute API command {command.lower()} due to missing parameter {sorted(missing)[0]}"
        )
    unknown = names - required - optional
    if unknown:
        raise _Error(431, f"Unknown parameters : {', '.join(sorted(unknown))}")
    return command


def _answer(state: State, command: str, p: dict[str, str]) -> dict[str, Any]:
    def listing(item: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {f"{command.lower()}response": {"count": len(rows), item: rows} if rows else {}}

    if command == "listZones":
        return listing("zone", [z for z in state.zones if p.get("name") in (None, z["name"])])
    if command == "listOsTypes":
        return listing("ostype", [t for t in state.os_types if p.get("description") in (None, t["description"])])
    if command == "listTemplates":
        if p["templatefilter"] not in TEMPLATE_FILTERS:
            raise _Error(431, f"templatefilter: not one of {sorted(TEMPLATE_FILTERS)}")
        rows = [t for t in state.templates.values()
                if p.get("name") in (None, t["name"]) and p.get("id") in (None, t["id"])
                and p.get("zoneid") in (None, t["zoneid"])]  # fmt: skip
        for t in rows:
            if p.get("id") and not t["isready"] and "broken" not in t["url"]:
                t["polls"] += 1
                t["status"] = f"{min(99, 35 * t['polls'])}% Downloaded"
                if t["polls"] >= state.polls_to_ready:
                    t["isready"], t["status"] = True, "Download Complete"
            elif p.get("id") and "broken" in t["url"]:
                t["status"] = "Failed post download script: Unable to download the template (404 Not Found)"
        return listing("template", [{k: v for k, v in t.items() if k != "polls"} for t in rows])
    if command == "registerTemplate":
        if p["format"] not in FORMATS:
            raise _Error(431, f"Format {p['format']} is not supported")
        if p["hypervisor"] not in {"KVM", "XenServer", "VMware", "Hyperv", "LXC", "Ovm3"}:
            raise _Error(431, f"Hypervisor {p['hypervisor']} is not supported")
        if not p["url"].startswith(("http://", "https://")):
            raise _Error(431, "Please specify a valid URL. URL:" + p["url"] + " is an invalid for the given format")
        zone = p.get("zoneid") or p.get("zoneids", "")
        if zone not in {z["id"] for z in state.zones}:
            raise _Error(431, f"Unable to find zone by id {zone}")
        if p.get("ostypeid") and p["ostypeid"] not in {t["id"] for t in state.os_types}:
            raise _Error(431, f"Unable to find os type by id {p['ostypeid']}")
        tid = str(uuid.uuid4())
        state.templates[tid] = {"id": tid, "name": p["name"], "displaytext": p.get("displaytext", p["name"]),
                                "url": p["url"], "zoneid": zone, "ostypeid": p.get("ostypeid"),
                                "format": p["format"], "hypervisor": p["hypervisor"], "isready": False,
                                "status": "Download started", "polls": 0}  # fmt: skip
        return {"registertemplateresponse": {"count": 1, "template": [
            {k: v for k, v in state.templates[tid].items() if k != "polls"}]}}  # fmt: skip
    if command == "deleteTemplate":
        if state.templates.pop(p["id"], None) is None:
            raise _Error(431, f"unable to find template by id {p['id']}")
        return {"deletetemplateresponse": {"jobid": str(uuid.uuid4())}}
    raise AssertionError(command)


@contextlib.contextmanager
def contract_server(state: State | None = None) -> Iterator[tuple[str, State]]:
    """The server on 127.0.0.1 (an ephemeral port): its API endpoint and its state."""
    state = state or State()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = dict(parse_qsl(parts.query, keep_blank_values=True))
            try:
                if parts.path != "/client/api":
                    raise _Error(404, f"no API at {parts.path}")
                command = _check(params)
                clean = {k.lower(): v for k, v in params.items() if k.lower() not in COMMON or k.lower() == "command"}
                state.requests.append(clean)
                body, code = _answer(state, command, clean), 200
            except _Error as err:
                body, code = {"errorresponse": {"errorcode": err.code, "errortext": err.text}}, err.code
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/client/api", state
    finally:
        server.shutdown()
        server.server_close()
