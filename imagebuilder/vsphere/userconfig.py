"""``user.yaml`` (spec 2.4): the vCenter user, group and roles to create and the objects they get rights on.

Every problem of the file is reported in one go, each naming the field and what is expected; the five optional
names default from the profile. Object paths are checked for their shape here (no server needed); whether they exist
is checked when connected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core import grammar
from imagebuilder.core.errors import InputError, InputErrors, did_you_mean
from imagebuilder.core.files import load_yaml_mapping
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


def load_user_config(path: str | Path) -> UserConfig:
    source = str(path)
    raw = load_yaml_mapping(path, "user config")
    vu = load_profile().vsphere_user
    problems: list[InputError] = []

    def problem(field: str, message: str, expected: str | None = None) -> None:
        problems.append(InputError(message, source=source, field=field, expected=expected))

    for key in raw:
        if key not in ("apiVersion", "kind", "spec"):
            problem(key, f"unknown field{did_you_mean(str(key), ['apiVersion', 'kind', 'spec'])}")
    if raw.get("apiVersion") != vu.api_version:
        problem("apiVersion", f"got {raw.get('apiVersion')!r}", repr(vu.api_version))
    if raw.get("kind") != vu.kind:
        problem("kind", f"got {raw.get('kind')!r}", repr(vu.kind))
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        problem("spec", "required mapping is missing" if spec is None else "must be a mapping")
        raise InputErrors(problems)
    for key in spec:
        if key not in SPEC_KEYS:
            problem(f"spec.{key}", f"unknown field{did_you_mean(str(key), SPEC_KEYS)}")

    def text(key: str, default: str | None, expected: str) -> str:
        value = spec.get(key, default)
        if isinstance(value, str) and not value.strip() and default is not None:
            value = default  # an optional field given empty is not set (the reference tool's files do that)
        if value is None:
            problem(f"spec.{key}", "required field is missing", expected)
            return ""
        if not isinstance(value, str) or not value.strip():
            problem(f"spec.{key}", f"got {value!r}", expected)
            return ""
        return value.strip()

    username = text("username", load_profile().product.short_name, "the SSO user name")
    group = text("group", vu.group, "the SSO group name")
    name_rule = "letters, digits and . _ - (no '@', spaces or other punctuation)"
    for key, value in (("username", username), ("group", group)):
        if value and not SSO_NAME.fullmatch(value):
            problem(f"spec.{key}", f"{value[:60]!r} is not an SSO name", name_rule)
    if len(username) > MAX_USERNAME:
        problem(
            "spec.username",
            f"is {len(username)} characters long",
            f"at most {MAX_USERNAME} (it cannot be changed later)",
        )
    global_role = text("globalRole", vu.global_role, "a role name")
    user_role = text("userRole", vu.user_role, "a role name")
    admin_role = text("adminRole", vu.admin_role, "a role name")
    datacenter = text("datacenter", None, "the datacenter name")
    domain = text(DOMAIN_KEY, None, "the SSO domain users log in with, as in user@vsphere.local")
    if domain:
        try:
            grammar.domain_name(domain)
        except ValueError as exc:
            problem(f"spec.{DOMAIN_KEY}", str(exc), "a domain such as vsphere.local")
    if datacenter and not INVENTORY_NAME.fullmatch(datacenter):
        problem(
            "spec.datacenter",
            f"{datacenter[:60]!r} is not a datacenter name",
            "a name without '/' or control characters",
        )
    roles = {"globalRole": global_role, "userRole": user_role, "adminRole": admin_role}
    for key, value in roles.items():
        if value and not INVENTORY_NAME.fullmatch(value):
            problem(f"spec.{key}", f"{value[:60]!r} is not a role name", "a name without '/' or control characters")
        elif value.lower() in SYSTEM_ROLES:
            problem(
                f"spec.{key}",
                f"{value} is one of vCenter's system roles: setup-user never creates, changes or grants them",
                "a role name of your own (the default is safe)",
            )
    for key, value in roles.items():
        others = [k for k, v in roles.items() if k != key and v and v == value]
        if value and others and key > others[0]:
            problem(
                f"spec.{key}",
                f"{value!r} is also {others[0]}: the three roles hold different privileges",
                "three different role names",
            )
    connection = spec.get("connection")
    server, insecure = "", False
    if not isinstance(connection, dict):
        problem(
            "spec.connection",
            "required mapping is missing" if connection is None else "must be a mapping",
            "server and insecure",
        )
    else:
        for key in connection:
            if key not in ("server", "insecure"):
                problem(f"spec.connection.{key}", f"unknown field{did_you_mean(str(key), ['server', 'insecure'])}")
        server = connection.get("server") or ""
        if not isinstance(server, str) or not server.strip():
            problem("spec.connection.server", "required field is missing", "the vCenter host name, IP or URL")
            server = ""
        else:
            try:
                split_server(server)
            except InputError as exc:
                problem("spec.connection.server", exc.detail, "the vCenter host name, IP or URL")
        if not isinstance(connection.get("insecure"), bool):
            problem(
                "spec.connection.insecure",
                "required field is missing" if "insecure" not in connection else f"got {connection.get('insecure')!r}",
                "true or false",
            )
        else:
            insecure = connection["insecure"]

    objects = spec.get("objects")
    lists: dict[str, tuple[str, ...]] = {k: () for k in OBJECT_SHAPES}
    if not isinstance(objects, dict):
        problem(
            "spec.objects",
            "required mapping is missing" if objects is None else "must be a mapping",
            ", ".join(OBJECT_SHAPES),
        )
    else:
        for key in objects:
            if key not in OBJECT_SHAPES:
                problem(f"spec.objects.{key}", f"unknown field{did_you_mean(str(key), OBJECT_SHAPES)}")
        for key, (root, depth, shape) in OBJECT_SHAPES.items():
            items = objects.get(key)
            field = f"spec.objects.{key}"
            if items is None:
                problem(field, "required field is missing", f"a list of paths {shape}")
                continue
            if not isinstance(items, list):
                problem(field, "must be a list", f"a list of paths {shape}")
                continue
            for i, item in enumerate(items):
                if not isinstance(item, str):
                    problem(f"{field}[{i}]", f"got {item!r}", f"a path {shape} (write it as !!str)")
                    continue
                parts = [p for p in item.split("/") if p]
                if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in item):
                    problem(f"{field}[{i}]", f"{item[:60]!r} contains a control character", shape)
                elif not item.startswith("/") or len(parts) < depth or parts[1] != root:
                    problem(f"{field}[{i}]", f"'{item}' has the wrong shape", shape)
                elif datacenter and parts[0] != datacenter:
                    problem(f"{field}[{i}]", f"'{item}' is not in datacenter '{datacenter}'", shape)
            lists[key] = tuple(i for i in items if isinstance(i, str))
    if problems:
        raise InputErrors(problems)
    return UserConfig(
        source=source,
        username=username,
        group=group,
        global_role=global_role,
        user_role=user_role,
        admin_role=admin_role,
        datacenter=datacenter,
        domain=domain,
        server=server,
        insecure=insecure,
        networks=lists["networks"],
        datastores=lists["datastores"],
        resource_pools=lists["resourcePools"],
        folders=lists["folders"],
        templates=lists["templates"],
    )
