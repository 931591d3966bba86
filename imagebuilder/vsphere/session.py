"""The logged-in vCenter: pyvmomi's SOAP session and, on first use, the REST, tagging, library and SSO clients.

The facade on top of the vSphere layers: :mod:`~imagebuilder.vsphere.connection` (target, credentials, TLS) at
the bottom, the clients (:mod:`~imagebuilder.vsphere.rest` -> tags/library, :mod:`~imagebuilder.vsphere.sso`) on
it, and this module above them all; nothing below imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.progress import poll
from imagebuilder.vsphere.connection import (
    CallCounter,
    Credentials,
    Target,
    check_pin,
    credentials_from_env,
    external_errors,
    fault_text,
    ssl_context,
)
from imagebuilder.vsphere.library import Library
from imagebuilder.vsphere.rest import RestClient
from imagebuilder.vsphere.sso import SsoAdmin
from imagebuilder.vsphere.tags import Tagging


class VSphere:
    """A logged-in vCenter: pyvmomi's ``content`` plus, on first use, the REST and SSO admin sessions.

    Use as a context manager; every session is logged out on exit.
    """

    def __init__(self, target: Target, credentials: Credentials) -> None:
        self.target = target
        self.credentials = credentials
        self.calls = CallCounter()
        self._si: Any = None
        #: objects looked up once per session (folders, datastores, pools shared by many templates)
        self.cache: dict[str, Any] = {}

    def __enter__(self) -> VSphere:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        from pyVim.connect import SmartConnect
        from pyVmomi import vim

        with external_errors(f"connecting to vCenter {self.target.server}"):
            check_pin(self.target)  # before the credentials are sent
            try:
                self._si = SmartConnect(
                    host=self.target.host,
                    port=self.target.port,
                    user=self.credentials.username,
                    pwd=self.credentials.password,
                    sslContext=ssl_context(self.target),
                    connectionPoolTimeout=-1,
                )
            except vim.fault.InvalidLogin:
                raise ExternalError(
                    f"vCenter {self.target.server} refused the login of {self.credentials.username}",
                    hint="check the user name and password in the environment (spec 5)",
                ) from None
            except vim.fault.HostConnectFault as exc:
                raise ExternalError(f"cannot connect to vCenter {self.target.server}: {exc.msg}") from None
        self._count_calls()

    def _count_calls(self) -> None:
        stub = self._si._stub
        invoke_method, invoke_accessor = stub.InvokeMethod, stub.InvokeAccessor

        def method(*args: Any, **kwargs: Any) -> Any:
            self.calls.count_soap()
            return invoke_method(*args, **kwargs)

        def accessor(*args: Any, **kwargs: Any) -> Any:
            self.calls.count_soap()
            return invoke_accessor(*args, **kwargs)

        stub.InvokeMethod, stub.InvokeAccessor = method, accessor

    @property
    def si(self) -> Any:
        assert self._si is not None, "not connected"
        return self._si

    @cached_property
    def content(self) -> Any:
        return self.si.RetrieveContent()

    @cached_property
    def rest(self) -> RestClient:
        return RestClient(self.target, self.credentials, self.calls, api_version=self.content.about.apiVersion)

    @cached_property
    def tagging(self) -> Tagging:
        """Tag categories and tags, cached for this session (many templates share them)."""
        return Tagging(self.rest)

    @cached_property
    def library(self) -> Library:
        return Library(self.rest)

    def properties(self, obj: Any, *paths: str) -> dict[str, Any]:
        """Several properties of one object in one round trip (attribute access costs one call per attribute).
        An unset property is absent from the answer and comes back as None."""
        from pyVmomi import vmodl

        pc = vmodl.query.PropertyCollector
        spec = pc.FilterSpec(
            objectSet=[pc.ObjectSpec(obj=obj, skip=False)],
            propSet=[pc.PropertySpec(type=type(obj), pathSet=list(paths), all=False)],
        )
        result = self.content.propertyCollector.RetrievePropertiesEx(specSet=[spec], options=pc.RetrieveOptions())
        values = {p: None for p in paths}
        for o in result.objects if result else []:
            for prop in o.propSet or []:
                values[prop.name] = prop.val
        return values

    def wait(self, task: Any, what: str) -> Any:
        """Wait for a vCenter task (one call per poll)."""

        def done() -> tuple[bool, Any]:
            info = task.info
            if info.state == "error":
                raise ExternalError(f"{what} failed: {fault_text(info.error)}")
            return info.state == "success", info.result

        return poll(done, what)

    @cached_property
    def sso(self) -> SsoAdmin:
        return SsoAdmin(self)

    def setting(self, key: str) -> str | None:
        """A vpxd advanced setting (``config.vpxd.sso.admin.uri`` and the like), or None."""
        try:
            values = self.content.setting.QueryView(key)
        except Exception:
            return None
        return str(values[0].value) if values else None

    @property
    def soap_session(self) -> str:
        """The SOAP session id (the ``vmware_soap_session`` cookie)."""
        cookie = str(self.si._stub.cookie or "")
        return cookie.partition("=")[2].partition(";")[0].strip('"')

    def close(self) -> None:
        if "rest" in self.__dict__:
            self.rest.close()
        if "sso" in self.__dict__:
            self.sso.close()
        if self._si is not None:
            from pyVim.connect import Disconnect

            with contextlib.suppress(Exception):
                Disconnect(self._si)
            self._si = None


@contextlib.contextmanager
def connect(target: Target, what: str) -> Iterator[VSphere]:
    """A session logged in with the environment's credentials (spec 5); any vCenter, HTTP or socket failure inside
    becomes one :class:`ExternalError` saying ``what`` was being done."""
    credentials = credentials_from_env()
    with external_errors(what), VSphere(target, credentials) as vs:
        yield vs
