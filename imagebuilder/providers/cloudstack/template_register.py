"""``cloudstack.template-register``: the built OS-3 qcow2 added to CloudStack as a template (spec 1.7).

CloudStack downloads the image itself from a URL (``serve`` or any web server), so registering is one
``registerTemplate`` call and then waiting until the template is Ready in its zone. Around that call:

- the zone and the OS type are looked up by name first; a name CloudStack does not know is bad input (exit 2, with
  the names it does know), and nothing is registered;
- registering is idempotent by name: a template of that name already in the zone (``templatefilter=self``) is
  waited for and reported, not registered twice; one registered from another URL is an error, never replaced;
- a download that fails removes the template this run registered (a failure cleans up what it made) and reports
  CloudStack's own status text.

Credentials are the ``cs`` client's environment variables (``CLOUDSTACK_ENDPOINT``, ``CLOUDSTACK_KEY``,
``CLOUDSTACK_SECRET``): never flags, never printed. The client signs every request (HMAC-SHA1, signature
version 3 with an expiry), as the CloudStack API requires.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imagebuilder.core import faults
from imagebuilder.core.errors import ExternalError, InputError, did_you_mean
from imagebuilder.core.grammar import display_name, url
from imagebuilder.core.progress import Say, poll, silent
from imagebuilder.core.untrusted import masked, redact_url

if TYPE_CHECKING:
    from cs import CloudStack

ENDPOINT_ENV, KEY_ENV, SECRET_ENV = "CLOUDSTACK_ENDPOINT", "CLOUDSTACK_KEY", "CLOUDSTACK_SECRET"
FORMATS = ("QCOW2", "RAW")


def name_of(text: str, what: str) -> str:
    """A CloudStack template, zone or OS type name: printable, at most 255 characters (CloudStack's column size)."""
    return display_name(text, what, 255)


@dataclass(frozen=True)
class TemplateRequest:
    url: str
    name: str
    zone: str
    os_type: str
    format: str = "QCOW2"
    hypervisor: str = "KVM"  # the CloudStack build's qcow2 is a KVM disk


@dataclass(frozen=True)
class Result:
    template_id: str | None
    status: str
    created: bool
    zone_id: str
    os_type_id: str


def client_from_env() -> CloudStack:
    """The ``cs`` client from its environment variables; a missing one is bad input (exit 2)."""
    from cs import CloudStack

    missing = [v for v in (ENDPOINT_ENV, KEY_ENV, SECRET_ENV) if not os.environ.get(v)]
    if missing:
        raise InputError(
            f"{', '.join(missing)} not set",
            field="environment",
            expected=f"the CloudStack API endpoint and the user's API key and secret in {ENDPOINT_ENV}, {KEY_ENV}, "
            f"{SECRET_ENV}",
        )
    endpoint = os.environ[ENDPOINT_ENV]
    try:
        url(endpoint, ("http", "https"))
    except ValueError as exc:
        raise InputError(str(exc), field=ENDPOINT_ENV) from None
    return CloudStack(endpoint=endpoint, key=os.environ[KEY_ENV], secret=os.environ[SECRET_ENV], timeout=30, retry=2)


def _api(what: str, call: Callable[[], Any]) -> Any:
    """One API call; CloudStack's refusals and transport failures as :class:`ExternalError` (exit 1)."""
    import requests
    from cs import CloudStackApiException, CloudStackException

    try:
        return call()
    except CloudStackApiException as exc:
        error = exc.error if isinstance(exc.error, dict) else {}
        code, text = error.get("errorcode", "?"), error.get("errortext", str(exc))
        raise ExternalError(f"{what}: CloudStack error {code}: {text}", hint=_HINTS.get(code, "")) from None
    except CloudStackException as exc:
        raise ExternalError(f"{what}: {_scrub(str(exc))[:300]}") from None
    except requests.RequestException as exc:
        raise ExternalError(
            f"{what}: cannot reach the CloudStack API: {type(exc).__name__}", hint=f"check {ENDPOINT_ENV}"
        ) from None


_SIGNED = re.compile(r"(?i)\b(apikey|signature|secret[a-z]*)=[^&\s\"']+")


def _scrub(text: str) -> str:
    """A client message without the request's key, signature or any URL password in it."""
    return _SIGNED.sub(lambda m: f"{m.group(1)}=********", masked(text))


_HINTS = {
    401: f"check {KEY_ENV} and {SECRET_ENV} (and this host's clock: signed requests expire)",
    431: "a parameter was refused: check the zone, OS type and URL",
    432: "this CloudStack does not offer the command (check the endpoint is the API's /client/api)",
}


def _one(items: list[dict[str, Any]], key: str, value: str, what: str, flag: str) -> dict[str, Any]:
    """The item whose ``key`` is exactly ``value``; else bad input naming what CloudStack does know."""
    known = [str(i.get(key)) for i in items]
    exact = [i for i in items if i.get(key) == value]
    if not exact:
        raise InputError(
            f"CloudStack has no {what} {value!r}{did_you_mean(value, known)}",
            field=flag,
            expected=f"one of {', '.join(sorted(known)[:12])}" if known else f"a {what} CloudStack knows",
        )
    return exact[0]


def _status(template: dict[str, Any]) -> str:
    return str(template.get("status") or ("Ready" if template.get("isready") else "not ready"))


def _failed(status: str) -> bool:
    return any(word in status.lower() for word in ("fail", "error", "abandoned", "invalid"))


def register_template(
    request: TemplateRequest,
    *,
    dry_run: bool = False,
    client: Callable[[], CloudStack] = client_from_env,
    interval: float = 10,
    timeout: float = 3 * 3600,
    say: Say = silent,
) -> Result:
    """Look up the zone and OS type, then register the template (unless it is there or this is a dry run) and wait
    until it is Ready; see the module's docstring."""
    api = client()
    zones = _api("listing zones", lambda: api.listZones(fetch_list=True))
    zone = _one(zones, "name", request.zone, "zone", "--zone")
    types = _api("listing OS types", lambda: api.listOsTypes(fetch_list=True))
    os_type = _one(types, "description", request.os_type, "OS type", "--os-type")
    zone_id, os_type_id = str(zone["id"]), str(os_type["id"])
    existing = [
        t
        for t in _api(
            f"looking for template {request.name!r}",
            lambda: api.listTemplates(templatefilter="self", name=request.name, zoneid=zone_id, fetch_list=True),
        )
        if t.get("name") == request.name
    ]
    if existing:
        template = existing[0]
        there = template.get("url")
        if there and there != request.url:
            raise ExternalError(
                f"a template named {request.name!r} ({template['id']}) is already in zone {request.zone}, registered "
                f"from {redact_url(str(there))}",
                hint="give another --name, or delete that template first",
            )
        say(f"template {request.name!r} is already registered ({template['id']}): {_status(template)}")
        if dry_run:
            return Result(str(template["id"]), _status(template), False, zone_id, os_type_id)
        status = _wait(api, str(template["id"]), zone_id, interval, timeout, say)
        return Result(str(template["id"]), status, False, zone_id, os_type_id)
    if dry_run:
        return Result(None, "not registered (--dry-run)", False, zone_id, os_type_id)
    registered = _api(
        f"registering template {request.name!r}",
        lambda: api.registerTemplate(
            name=request.name,
            displaytext=request.name,
            url=request.url,
            zoneid=zone_id,
            ostypeid=os_type_id,
            format=request.format,
            hypervisor=request.hypervisor,
        ),
    )
    template_id = str(registered["template"][0]["id"])
    say(
        faults.step(
            f"registered {request.name!r} as {template_id}; CloudStack is downloading {redact_url(request.url)}"
        )
    )
    try:
        status = _wait(api, template_id, zone_id, interval, timeout, say)
    except BaseException:
        # ours and not usable: removed, so a rerun starts clean (a Ctrl-C included)
        _api(f"removing template {template_id}", lambda: api.deleteTemplate(id=template_id, zoneid=zone_id))
        raise
    return Result(template_id, status, True, zone_id, os_type_id)


def _wait(api: CloudStack, template_id: str, zone_id: str, interval: float, timeout: float, say: Say) -> str:
    last = ""

    def check() -> tuple[bool, str]:
        nonlocal last
        found = _api(
            f"reading template {template_id}",
            lambda: api.listTemplates(templatefilter="self", id=template_id, zoneid=zone_id, fetch_list=True),
        )
        if not found:
            raise ExternalError(f"template {template_id} disappeared while it downloaded")
        status = _status(found[0])
        if found[0].get("isready"):
            return True, status
        if _failed(status):
            raise ExternalError(
                f"CloudStack could not download template {template_id}: {status}",
                hint="check that the URL is reachable from CloudStack's secondary storage VM and the format is right",
            )
        if status != last:
            say(f"template {template_id}: {status}")
            last = status
        return False, status

    return poll(check, f"downloading template {template_id}", timeout, interval=interval)


__all__ = ["FORMATS", "Result", "TemplateRequest", "client_from_env", "name_of", "register_template"]
