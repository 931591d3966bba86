"""``user.yaml`` (spec 2.4): the vCenter user, group and roles to create and the objects they get rights on.

Every problem of the file is reported in one go, each naming the field and what is expected; the five optional
names default from the profile. Object paths are checked for their shape here (no server needed); whether they exist
is checked when connected.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictBool, StrictStr

from imagebuilder.core import grammar
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import load_yaml_mapping
from imagebuilder.core.validation import FieldProblem, Problem, StrictModel, raise_problems, validated
from imagebuilder.release.profile import load_profile
from imagebuilder.vsphere.connection import split_server

MAX_USERNAME = 300  # spec 5, 8: and it cannot be changed after creation
#: SSO user and group names: what the SSO admin API takes without escaping in a principal ``name@domain``
SSO_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
#: an inventory object's or role's name: no path separator, no control characters
INVENTORY_NAME = re.compile(r"[^/\x00-\x1f\x7f]{1,255}")
#: vCenter's system roles (AuthorizationRole.system; ids -1 to -7): never created, changed or granted here
SYSTEM_ROLES = frozenset(
    name.lower() for name in ("Admin", "ReadOnly", "NoAccess", "Anonymous", "View", "NoCryptoAdmin", "NoTrustedAdmin")
)
DOMAIN_KEY = "vSphereDomain"

#: objects key -> (inventory root under the datacenter, minimum path depth, shape shown in errors)
OBJECT_SHAPES: dict[str, tuple[str, int, str]] = {
    "networks": ("network", 3, "/<datacenter>/network/<name>"),
    "datastores": ("datastore", 3, "/<datacenter>/datastore/<name>"),
    "resourcePools": ("host", 3, "/<datacenter>/host/<cluster>[/Resources/<pool>]"),
    "folders": ("vm", 3, "/<datacenter>/vm/<folder path>"),
    "templates": ("vm", 3, "/<datacenter>/vm/<template folder path>"),
}
SPEC_KEYS = (
    "username",
    "group",
    "globalRole",
    "userRole",
    "adminRole",
    "datacenter",
    DOMAIN_KEY,
    "connection",
    "objects",
)


@dataclass(frozen=True)
class UserConfig:
    source: str
    username: str
    group: str
    global_role: str
    user_role: str
    admin_role: str
    datacenter: str
    domain: str
    server: str
    insecure: bool
    networks: tuple[str, ...]
    datastores: tuple[str, ...]
    resource_pools: tuple[str, ...]
    folders: tuple[str, ...]
    templates: tuple[str, ...]

    @property
    def principal(self) -> str:
        """The group as vCenter permissions name it: ``<group>@vsphere.local``."""
        return f"{self.group}@{self.domain}"

    @property
    def notes(self) -> list[str]:
        out = []
        for pool in self.resource_pools:
            parts = [p for p in pool.split("/") if p]
            if len(parts) == 3:
                out.append(
                    f"{pool} is a cluster, not a pool: the cluster spec's resourcePool must then be "
                    f"{pool.rstrip('/')}/Resources (spec 2.4)"
                )
        return out


def _profile_value(expected: str) -> Callable[[object], object]:
    """A check that a field holds the profile's own value (``apiVersion``, ``kind``), named in the problem."""

    def check(value: object) -> object:
        if value != expected:
            raise FieldProblem(f"got {value!r}", repr(expected))
        return value

    return check


def _sso_name(value: str) -> str:
    value = value.strip()
    if not SSO_NAME.fullmatch(value):
        raise FieldProblem(f"{value[:60]!r} is not an SSO name",
                           "letters, digits and . _ - (no '@', spaces or other punctuation)")  # fmt: skip
    return value


def _inventory_name(what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        value = value.strip()
        if not INVENTORY_NAME.fullmatch(value):
            raise FieldProblem(f"{value[:60]!r} is not a {what} name", "a name without '/' or control characters")
        return value

    return check


def _role(value: str) -> str:
    value = _inventory_name("role")(value)
    if value.lower() in SYSTEM_ROLES:
        raise FieldProblem(f"{value} is one of vCenter's system roles: setup-user never creates, changes or grants "
                           "them", "a role name of your own (the default is safe)")  # fmt: skip
    return value


def _username(value: str) -> str:
    value = _sso_name(value)
    if len(value) > MAX_USERNAME:
        raise FieldProblem(f"is {len(value)} characters long", f"at most {MAX_USERNAME} (it cannot be changed later)")
    return value


def _domain(value: str) -> str:
    value = value.strip()
    try:
        grammar.domain_name(value)
    except ValueError as exc:
        raise FieldProblem(str(exc), "a domain such as vsphere.local") from None
    return value


def _server(value: str) -> str:
    try:
        split_server(value)
    except InputError as exc:
        raise FieldProblem(exc.detail, "the vCenter host name, IP or URL") from None
    return value


def _path_of(key: str) -> AfterValidator:
    """The check of a path of the ``objects.<key>`` list: its shape (whether it exists is checked once connected)."""
    root, depth, shape = OBJECT_SHAPES[key]

    def check(item: str) -> str:
        parts = [p for p in item.split("/") if p]
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in item):
            raise FieldProblem(f"{item[:60]!r} contains a control character", shape)
        if not item.startswith("/") or len(parts) < depth or parts[1] != root:
            raise FieldProblem(f"'{item}' has the wrong shape", shape)
        return item

    return AfterValidator(check)


def _paths(key: str) -> Any:
    return Field(description=f"a list of paths {OBJECT_SHAPES[key][2]}")


Username = Annotated[StrictStr, AfterValidator(_username)]
SsoName = Annotated[StrictStr, AfterValidator(_sso_name)]
Role = Annotated[StrictStr, AfterValidator(_role)]


class UserConnection(StrictModel):
    server: Annotated[StrictStr, Field(min_length=1), AfterValidator(_server)] = Field(
        description="the vCenter host name, IP or URL"
    )
    insecure: StrictBool = Field(description="true or false")


class UserObjects(StrictModel):
    """The inventory objects the roles are granted on (spec 2.4), by kind, as the file names them."""

    networks: list[Annotated[StrictStr, _path_of("networks")]] = _paths("networks")
    datastores: list[Annotated[StrictStr, _path_of("datastores")]] = _paths("datastores")
    resourcePools: list[Annotated[StrictStr, _path_of("resourcePools")]] = _paths("resourcePools")
    folders: list[Annotated[StrictStr, _path_of("folders")]] = _paths("folders")
    templates: list[Annotated[StrictStr, _path_of("templates")]] = _paths("templates")


class UserSpec(StrictModel):
    """``spec`` of user.yaml: the five names default from the profile when left out (or given empty)."""

    username: Username | None = None
    group: SsoName | None = None
    globalRole: Role | None = None
    userRole: Role | None = None
    adminRole: Role | None = None
    datacenter: Annotated[StrictStr, Field(min_length=1), AfterValidator(_inventory_name("datacenter"))] = Field(
        description="the datacenter name"
    )
    vSphereDomain: Annotated[StrictStr, Field(min_length=1), AfterValidator(_domain)] = Field(
        description="the SSO domain users log in with, as in user@vsphere.local"
    )
    connection: UserConnection = Field(description="server and insecure")
    objects: UserObjects = Field(description=", ".join(OBJECT_SHAPES))


class UserFile(StrictModel):
    """user.yaml (spec 2.4): the kind and apiVersion the profile names, and its spec."""

    apiVersion: Annotated[object, AfterValidator(_profile_value(load_profile().vsphere_user.api_version))] = Field(
        None, validate_default=True
    )
    kind: Annotated[object, AfterValidator(_profile_value(load_profile().vsphere_user.kind))] = Field(
        None, validate_default=True
    )
    spec: UserSpec = Field(description="the user, group, roles, connection and objects")


def load_user_config(path: str | Path) -> UserConfig:
    """user.yaml, every problem of it reported in one go (the one validation layer), with the profile's defaults."""
    source = str(path)
    doc = validated(UserFile, load_yaml_mapping(path, "user config"), source)
    spec, vu = doc.spec, load_profile().vsphere_user
    problems: list[Problem] = []
    roles = {"globalRole": spec.globalRole or vu.global_role, "userRole": spec.userRole or vu.user_role,
             "adminRole": spec.adminRole or vu.admin_role}  # fmt: skip
    for key, value in roles.items():
        others = [k for k, v in roles.items() if k != key and v == value]
        if others and key > others[0]:
            problems.append(Problem(f"spec.{key}", f"{value!r} is also {others[0]}: the three roles hold different "
                                    "privileges", "three different role names"))  # fmt: skip
    objects = spec.objects.model_dump()
    for key, (_, _, shape) in OBJECT_SHAPES.items():
        for i, item in enumerate(objects[key]):
            if next(p for p in item.split("/") if p) != spec.datacenter:
                problems.append(Problem(f"spec.objects.{key}[{i}]", f"'{item}' is not in datacenter "
                                        f"'{spec.datacenter}'", shape))  # fmt: skip
    raise_problems(problems, source)
    return UserConfig(
        source=source,
        username=spec.username or load_profile().product.short_name,
        group=spec.group or vu.group,
        global_role=roles["globalRole"],
        user_role=roles["userRole"],
        admin_role=roles["adminRole"],
        datacenter=spec.datacenter,
        domain=spec.vSphereDomain,
        server=spec.connection.server,
        insecure=spec.connection.insecure,
        networks=tuple(spec.objects.networks),
        datastores=tuple(spec.objects.datastores),
        resource_pools=tuple(spec.objects.resourcePools),
        folders=tuple(spec.objects.folders),
        templates=tuple(spec.objects.templates),
    )
