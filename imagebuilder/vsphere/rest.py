"""The vSphere Automation REST session: tagging and content library live only here, not in the SOAP API.

vCenter 7.0 U2 and later serve ``/api``; older ones (and vcsim) only ``/rest``, whose requests wrap their bodies in a
named key (``create_spec``, ``spec``...), whose ids are written ``id:<x>``, whose actions are ``~action=`` and whose
answers are wrapped in ``{"value": ...}``. :class:`RestClient` logs in to whichever the server has and each call
names both forms, so the callers above never see the difference.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from imagebuilder.core.errors import ExternalError
from imagebuilder.vsphere.connection import CallCounter, Credentials, Target
from imagebuilder.vsphere.http import HttpClient, Response

SESSION_HEADER = "vmware-api-session-id"


@dataclass(frozen=True)
class Call:
    """One REST operation in both dialects. Paths take ``{id}``; ``wrap`` is the /rest body key, if any."""

    method: str
    api: str
    rest: str
    wrap: str | None = None


class RestError(ExternalError):
    def __init__(self, message: str, status: int, *, hint: str | None = None) -> None:
        self.status = status
        super().__init__(message, hint=hint)


class RestClient:
    def __init__(
        self,
        target: Target,
        credentials: Credentials,
        calls: CallCounter,
        timeout: float = 60.0,
        api_version: str | None = None,
    ) -> None:
        self.base = target.base_url
        self.calls = calls
        self.timeout = timeout
        self.http = HttpClient(target, timeout)
        self.dialect = self._login(credentials, api_version)

    def _login(self, credentials: Credentials, api_version: str | None) -> str:
        basic = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        order = [("api", "/api/session"), ("rest", "/rest/com/vmware/cis/session")]
        if api_version and _older_than_api(api_version):
            order.reverse()  # /api/session arrived in vCenter 7.0 U2: ask an older server for /rest first
        for dialect, path in order:
            self.calls.count_rest()
            res = self.http.request("POST", path, headers={"Authorization": f"Basic {basic}"})
            if res.status == 404:
                continue
            if res.status in (401, 403):
                raise ExternalError(
                    f"the vCenter REST API refused the login of {credentials.username}",
                    hint="check the user name and password in the environment (spec 5)",
                )
            if not res.ok:
                raise RestError(f"REST login failed: HTTP {res.status} {res.text[:200]}", res.status)
            body = res.json()
            token = body["value"] if dialect == "rest" else body
            self.http.headers[SESSION_HEADER] = str(token)
            return dialect
        raise ExternalError(f"{self.base} serves neither /api nor /rest", hint="is this a vCenter (not an ESXi host)?")

    def close(self) -> None:
        if SESSION_HEADER in self.http.headers:
            path = "/api/session" if self.dialect == "api" else "/rest/com/vmware/cis/session"
            try:
                self.calls.count_rest()
                self.http.request("DELETE", path, timeout=10)
            except (OSError, ExternalError):
                pass
        self.http.close()

    def url(self, call: Call, ident: str | None = None, action: str | None = None) -> str:
        if self.dialect == "api":
            path = "/api" + call.api.format(id=ident)
            return path + (f"?action={action}" if action else "")
        path = "/rest" + call.rest.format(id=f"id:{ident}")
        return path + (f"?~action={action}" if action else "")

    def __call__(
        self,
        call: Call,
        body: Any = None,
        *,
        ident: str | None = None,
        action: str | None = None,
        params: Mapping[str, str] | None = None,
        method: str | None = None,
    ) -> Any:
        """Make one call (``method`` overrides the call's); returns the unwrapped answer."""
        if body is not None and self.dialect == "rest" and call.wrap:
            body = {call.wrap: body}
        self.calls.count_rest()
        res = self.http.request(method or call.method, self.url(call, ident, action), json_body=body, params=params)
        if not res.ok:
            raise RestError(
                f"vCenter REST {call.method} {self.url(call, ident, action)}: HTTP {res.status} {_message(res)}",
                res.status,
            )
        if not res.data:
            return None
        data = res.json()
        if self.dialect == "rest" and isinstance(data, dict) and "value" in data:
            return data["value"]
        return data


def _older_than_api(api_version: str) -> bool:
    try:
        return tuple(int(x) for x in api_version.split(".")[:3]) < (7, 0, 2)
    except ValueError:
        return False


def _message(res: Response) -> str:
    try:
        data = res.json()
    except ValueError:
        return res.text[:300]
    value = data.get("value", data) if isinstance(data, dict) else data
    if isinstance(value, dict):
        messages = value.get("messages") or []
        text = "; ".join(str(m.get("default_message", "")) for m in messages if isinstance(m, dict))
        return text or str(value.get("error_type", value))[:300]
    return str(value)[:300]
