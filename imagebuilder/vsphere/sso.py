"""The SSO admin API (``urn:sso``): local users, groups and membership (spec 2.4, ``govc sso.*``).

pyvmomi has no bindings for it, so this speaks its SOAP directly, the way vCenter expects:

1. ask the STS (WS-Trust ``Issue``, credentials in a WS-Security ``UsernameToken``) for a SAML bearer token;
2. ``SsoSessionManager.Login`` with that token in the ``wsse:Security`` header; the session is a cookie;
3. the ``PrincipalManagementService`` / ``PrincipalDiscoveryService`` / ``GroupCheckService`` calls.

Endpoints come from vCenter's own ``config.vpxd.sso.*.uri`` settings (their path; the host is the one we reached),
with the standard paths as fallback. The password travels only in request bodies, never in a log.
"""

from __future__ import annotations

import contextlib
import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from defusedxml.ElementTree import fromstring as defused_fromstring

from imagebuilder.core.errors import ExternalError
from imagebuilder.vsphere.http import HttpClient

if TYPE_CHECKING:
    from imagebuilder.vsphere.session import VSphere

SOAP_NS = "http://schemas.xmlsoap.org/soap/envelope/"
SSO_NS = "urn:sso"
WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
WST = "http://docs.oasis-open.org/ws-sx/ws-trust/200512"
SAML = "urn:oasis:names:tc:SAML:2.0:assertion"
DEFAULT_STS_PATH = "/sts/STSService/vsphere.local"
DEFAULT_ADMIN_PATH = "/sso-adminserver/sdk/vsphere.local"


class SsoFault(ExternalError):
    def __init__(self, method: str, fault: str, text: str) -> None:
        self.fault = fault
        super().__init__(f"SSO admin {method} failed: {fault}{': ' + text if text else ''}")


def _timestamp(seconds: int) -> tuple[str, str]:
    now = datetime.now(UTC)
    fmt = "%Y-%m-%dT%H:%M:%S.000Z"
    return now.strftime(fmt), (now + timedelta(seconds=seconds)).strftime(fmt)


def _envelope(body: str, security: str = "") -> str:
    header = f"<soapenv:Header>{security}</soapenv:Header>" if security else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="{SOAP_NS}">'
        f"{header}<soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )


def _principal(tag: str, name: str, domain: str) -> str:
    return f"<{tag}><name>{escape(name)}</name><domain>{escape(domain)}</domain></{tag}>"


class SsoAdmin:
    """A logged-in SSO admin session on the vCenter of ``vs``."""

    def __init__(self, vs: VSphere) -> None:
        self.vs = vs
        self.http = HttpClient(vs.target)
        base = vs.target.base_url
        # the vCenter session cookie rides along, as govc sends it: vcsim's SSO endpoint refuses calls without it
        # (real vCenter authenticates the SSO admin session by the SAML Login below and ignores it)
        self.http.cookies["vmware_soap_session"] = vs.soap_session
        self.sts_url = base + self._path(vs.setting("config.vpxd.sso.sts.uri"), DEFAULT_STS_PATH)
        self.admin_url = base + self._path(vs.setting("config.vpxd.sso.admin.uri"), DEFAULT_ADMIN_PATH)
        self.refs: dict[str, tuple[str, str]] = {}
        for method, this in (
            ("SsoAdminServiceInstance", '<_this type="SsoAdminServiceInstance">SsoAdminServiceInstance</_this>'),
            ("SsoGroupcheckServiceInstance", '<_this type="SsoGroupcheckServiceInstance">ServiceInstance</_this>'),
        ):
            for content in self._returns(method, this):
                for child in content:
                    self.refs.setdefault(child.tag.split("}")[-1], (child.get("type", ""), child.text or ""))
        self._login()

    @staticmethod
    def _path(setting: str | None, default: str) -> str:
        return urlsplit(setting).path or default if setting else default

    def _this(self, service: str) -> str:
        kind, value = self.refs[service]
        return f'<_this type="{escape(kind)}">{escape(value)}</_this>'

    def _post(self, url: str, action: str, envelope: str, what: str) -> ET.Element:
        self.vs.calls.count_soap()
        res = self.http.request(
            "POST",
            url,
            body=envelope.encode(),
            headers={"Content-Type": "text/xml; charset=utf-8", "SOAPAction": action},
        )
        try:
            root = defused_fromstring(res.data)
        except ET.ParseError:
            raise ExternalError(f"SSO endpoint {url} answered HTTP {res.status} without SOAP") from None
        fault = root.find(f".//{{{SOAP_NS}}}Fault")
        if fault is not None:
            detail = fault.find("detail")
            kind = ""
            if detail is not None and len(detail):
                kind = detail[0].tag.split("}")[-1].removesuffix("Fault")
            text = (fault.findtext("faultstring") or "").strip()
            raise SsoFault(what, kind or "fault", text)
        if not res.ok:
            raise ExternalError(f"SSO endpoint {url}: HTTP {res.status}")
        body = root.find(f"{{{SOAP_NS}}}Body")
        assert body is not None
        return body

    def _call(self, method: str, args: str, security: str = "") -> ET.Element:
        body = self._post(
            self.admin_url,
            "urn:sso/version2",
            _envelope(f'<{method} xmlns="{SSO_NS}">{args}</{method}>', security),
            method,
        )
        response = body.find(f"{{{SSO_NS}}}{method}Response")
        return response if response is not None else ET.Element("none")

    def _returns(self, method: str, args: str) -> list[ET.Element]:
        """The ``returnval`` elements of a call (none, one, or a list)."""
        return self._call(method, args).findall(f"{{{SSO_NS}}}returnval")

    def _token(self) -> str:
        """A SAML bearer token for our credentials, from the STS."""
        created, expires = _timestamp(600)
        creds = self.vs.credentials
        security = (
            f'<wsse:Security xmlns:wsse="{WSSE}" xmlns:wsu="{WSU}">'
            f"<wsu:Timestamp><wsu:Created>{created}</wsu:Created><wsu:Expires>{expires}</wsu:Expires></wsu:Timestamp>"
            f"<wsse:UsernameToken><wsse:Username>{escape(creds.username)}</wsse:Username>"
            f"<wsse:Password>{escape(creds.password)}</wsse:Password></wsse:UsernameToken></wsse:Security>"
        )
        body = (
            f'<RequestSecurityToken xmlns="{WST}"><TokenType>urn:oasis:names:tc:SAML:2.0:assertion</TokenType>'
            f"<RequestType>{WST}/Issue</RequestType>"
            f'<Lifetime><Created xmlns="{WSU}">{created}</Created><Expires xmlns="{WSU}">{expires}</Expires></Lifetime>'
            f'<Renewing Allow="false" OK="false"></Renewing><KeyType>{WST}/Bearer</KeyType>'
            "<SignatureAlgorithm>http://www.w3.org/2001/04/xmldsig-more#rsa-sha256</SignatureAlgorithm>"
            "</RequestSecurityToken>"
        )
        answer = self._post(self.sts_url, f"{WST}/RST/Issue", _envelope(body, security), "token request")
        assertion = answer.find(f".//{{{SAML}}}Assertion")
        if assertion is None:
            raise ExternalError("the SSO token service issued no SAML assertion", hint="check the credentials")
        return ET.tostring(assertion, encoding="unicode")

    def _login(self) -> None:
        created, expires = _timestamp(60)
        security = (
            f'<wsse:Security xmlns:wsse="{WSSE}" xmlns:wsu="{WSU}">'
            f'<wsu:Timestamp wsu:Id="_{uuid.uuid4()}"><wsu:Created>{created}</wsu:Created>'
            f"<wsu:Expires>{expires}</wsu:Expires></wsu:Timestamp>{self._token()}</wsse:Security>"
        )
        self._call("Login", self._this("sessionManager"), security)

    def close(self) -> None:
        with contextlib.suppress(ExternalError, OSError):
            self._call("Logout", self._this("sessionManager"))
        self.http.close()

    # -- principals -------------------------------------------------------------------------------------------

    def person_user_exists(self, name: str, domain: str) -> bool:
        args = self._this("principalDiscoveryService") + _principal("userId", name, domain)
        return bool(self._returns("FindPersonUser", args))

    def group_exists(self, name: str, domain: str) -> bool:
        args = self._this("principalDiscoveryService") + _principal("groupId", name, domain)
        return bool(self._returns("FindGroup", args))

    def create_person_user(self, name: str, password: str, description: str) -> None:
        self._call(
            "CreateLocalPersonUser",
            self._this("principalManagementService")
            + f"<userName>{escape(name)}</userName>"
            + f"<userDetails><description>{escape(description)}</description></userDetails>"
            + f"<password>{escape(password)}</password>",
        )

    def create_group(self, name: str, description: str) -> None:
        self._call(
            "CreateLocalGroup",
            self._this("principalManagementService")
            + f"<groupName>{escape(name)}</groupName>"
            + f"<groupDetails><description>{escape(description)}</description></groupDetails>",
        )

    def parent_groups(self, name: str, domain: str) -> set[str]:
        """Names of the groups ``name@domain`` belongs to."""
        args = self._this("groupCheckService") + _principal("userId", name, domain)
        return {el.findtext(f"{{{SSO_NS}}}name") or "" for el in self._returns("FindAllParentGroups", args)} - {""}

    def add_user_to_group(self, name: str, domain: str, group: str) -> None:
        self._call(
            "AddUsersToLocalGroup",
            self._this("principalManagementService")
            + _principal("userIds", name, domain)
            + f"<groupName>{escape(group)}</groupName>",
        )
