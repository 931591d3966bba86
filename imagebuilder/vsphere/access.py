"""``vsphere.setup-user`` (spec 2.4, 2.7, 4.6, 4.7): the SSO user and group, three roles, and their permissions.

The work is a plan first -- every object compared with the server -- then the plan applied. ``--dry-run`` prints
the plan, which is the diff between the server and the desired state. Reruns converge: what exists is kept.
``--force`` additionally overwrites the group's permission (role, propagation) on each object and brings each
role's privileges back to the shipped lists, which the reference tool never does (a role edited by hand keeps
working differently from what the product expects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from imagebuilder.core.errors import ExternalError, InputError, InputErrors
from imagebuilder.core.paths import config_dir
from imagebuilder.vsphere import inventory
from imagebuilder.vsphere.session import VSphere
from imagebuilder.vsphere.userconfig import UserConfig

ROLE_FILES = {"global": "global.json", "user": "user.json", "admin": "admin.json"}
#: privileges vCenter adds to every role by itself
IMPLICIT = frozenset({"System.Anonymous", "System.Read", "System.View"})


def shipped_privileges(kind: str) -> list[str]:
    """``config/privileges/<kind>.json``: the privilege IDs of a role (spec 2.7)."""
    path = config_dir() / "privileges" / ROLE_FILES[kind]
    data = json.loads(path.read_text())
    assert isinstance(data, list) and all(isinstance(p, str) for p in data), f"{path}: expected a list of strings"
    return data


@dataclass
class Step:
    """One line of the plan: ``+`` create, ``~`` change, ``=`` already right, ``!`` differs (``--force`` fixes)."""

    mark: str
    text: str
    apply: Any = None  # a callable doing the change, or None

    def __str__(self) -> str:
        return f"{self.mark} {self.text}"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, mark: str, text: str, apply: Any = None) -> None:
        self.steps.append(Step(mark, text, apply))

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.apply is not None]


def _principal_key(name: str) -> str:
    """``VSPHERE.LOCAL\\Group`` and ``Group@vsphere.local`` are the same principal."""
    if "\\" in name:
        domain, _, user = name.partition("\\")
    else:
        user, _, domain = name.partition("@")
    return f"{user}@{domain.lower()}"


def plan_setup_user(vs: VSphere, cfg: UserConfig, password: str | None, force: bool) -> Plan:
    from pyVmomi import vim

    plan = Plan(notes=list(cfg.notes))
    sso = vs.sso
    user = f"{cfg.username}@{cfg.domain}"

    # SSO user, group, membership
    user_exists = sso.person_user_exists(cfg.username, cfg.domain)
    if user_exists:
        plan.add("=", f"user {user} exists" + (" (its password is left unchanged)" if password else ""))
    elif password:
        plan.add("+", f"create user {user}", lambda: sso.create_person_user(cfg.username, password, "image-builder"))
    else:
        raise InputError(
            f"user {user} does not exist on {vs.target.server}, and --force cannot create it",
            field="--password",
            expected="--password (-, @FILE or env:VAR) to create the user",
        )
    if sso.group_exists(cfg.group, cfg.domain):
        plan.add("=", f"group {cfg.principal} exists")
    else:
        plan.add("+", f"create group {cfg.principal}", lambda: sso.create_group(cfg.group, "image-builder users"))
    if user_exists and cfg.group in sso.parent_groups(cfg.username, cfg.domain):
        plan.add("=", f"{user} is a member of {cfg.group}")
    else:
        plan.add("+", f"add {user} to {cfg.group}", lambda: sso.add_user_to_group(cfg.username, cfg.domain, cfg.group))

    # roles
    auth = vs.content.authorizationManager
    role_list = auth.roleList  # one read: every role with all its privileges
    role_fields = {cfg.global_role: "spec.globalRole", cfg.user_role: "spec.userRole", cfg.admin_role: "spec.adminRole"}
    roles = {r.name: r for r in role_list}
    admin = next((r for r in role_list if r.roleId == -1), None)
    # the Administrator role holds every privilege the server defines (vcsim's privilegeList is empty)
    known = {p.privId for p in auth.privilegeList} | set(admin.privilege if admin is not None else ())
    desired = {
        cfg.global_role: shipped_privileges("global"),
        cfg.user_role: shipped_privileges("user"),
        # the admin role is the server's own Administrator role's privileges (spec 2.7), not a copied list
        cfg.admin_role: list(admin.privilege) if admin is not None else shipped_privileges("admin"),
    }
    role_ids: dict[str, Any] = {}
    for name, privs in desired.items():
        unknown = sorted(set(privs) - known)
        if unknown:
            raise ExternalError(
                f"vCenter {vs.target.server} does not know the privileges {', '.join(unknown)} of role {name}",
                hint="vSphere 7 or later is required (spec 8)",
            )
        want = set(privs) | IMPLICIT
        role = roles.get(name)
        if role is not None and (getattr(role, "system", False) or role.roleId < 0):
            # vCenter's own roles (Admin, ReadOnly, NoAccess...) are never changed, nor granted by this tool
            raise InputError(
                f"{name} is one of vCenter's system roles: it is never created, changed or granted by setup-user",
                source=cfg.source,
                field=role_fields[name],
                expected="a role name of your own, e.g. the defaults",
            )
        if role is None:
            role_ids[name] = None

            def create(name: str = name, privs: list[str] = privs) -> None:
                auth.AddAuthorizationRole(name=name, privIds=privs)
                # the id is read back by name: vcsim answers AddAuthorizationRole with 0, not the new id
                role_ids[name] = next(r.roleId for r in auth.roleList if r.name == name)

            plan.add("+", f"create role {name} with {len(want)} privileges", create)
            continue
        role_ids[name] = role.roleId
        have = set(role.privilege) | IMPLICIT
        if have == want:
            plan.add("=", f"role {name} has its {len(want)} privileges")
            continue
        diff = _diff(want - have, have - want)
        if force:

            def update(role: Any = role, privs: list[str] = privs) -> None:
                auth.UpdateAuthorizationRole(roleId=role.roleId, newName=role.name, privIds=privs)

            plan.add("~", f"reset role {name} privileges: {diff}", update)
        else:
            plan.add("!", f"role {name} privileges differ from the list: {diff} (--force resets them)")

    # folders, then permissions
    folders = list(dict.fromkeys(cfg.folders + cfg.templates))
    entities = {p: inventory.find(vs, p) for p in [*folders, *cfg.networks, *cfg.datastores, *cfg.resource_pools]}
    entities["/"] = vs.content.rootFolder
    _check_kinds(cfg, entities)
    for path in folders:
        if entities[path] is None:
            plan.add("+", f"create folder {path}", lambda path=path: inventory.ensure_folder(vs, path))
        else:
            plan.add("=", f"folder {path} exists")
    targets: list[tuple[str, str]] = [("/", cfg.global_role)]
    targets += [(p, cfg.admin_role) for p in folders]
    targets += [(p, cfg.user_role) for p in cfg.networks + cfg.datastores + cfg.resource_pools]
    me = _principal_key(cfg.principal)
    names = {r.roleId: r.name for r in role_list}
    for path, role_name in targets:
        entity = entities[path]
        if entity is None and path not in folders:
            raise ExternalError(
                f"{path} (in {cfg.source}) does not exist on {vs.target.server}",
                hint="fix the path in user.yaml; list the inventory with: govc ls /" + cfg.datacenter,
            )
        current = None
        if entity is not None:
            for perm in auth.RetrieveEntityPermissions(entity=entity, inherited=False):
                if _principal_key(perm.principal) == me:
                    current = perm
        label = f"{cfg.principal} -> {role_name} on {path} (propagating)"

        def grant(path: str = path, role_name: str = role_name) -> None:
            target = vs.content.rootFolder if path == "/" else inventory.need(vs, path, "object")
            perm = vim.AuthorizationManager.Permission(
                principal=cfg.principal, group=True, roleId=role_ids[role_name], propagate=True
            )
            auth.SetEntityPermissions(entity=target, permission=[perm])

        if current is None:
            plan.add("+", f"grant {label}", grant)
        elif names.get(current.roleId) == role_name and current.propagate and current.group:
            plan.add("=", f"permission {label} exists")
        elif force:
            plan.add("~", f"overwrite {names.get(current.roleId, current.roleId)} with {label}", grant)
        else:
            plan.add(
                "!",
                f"{cfg.principal} has role {names.get(current.roleId, current.roleId)} on {path}, "
                f"not {role_name} (--force overwrites)",
            )
    return plan


#: user.yaml's object lists -> the vSphere types each may name (a resource pool may be given as its cluster or host)
OBJECT_KINDS: dict[str, tuple[str, ...]] = {
    "folders": ("Folder",),
    "templates": ("Folder",),
    "networks": ("Network",),  # a standard port group, a distributed port group, an opaque network
    "datastores": ("Datastore", "StoragePod"),
    "resourcePools": ("ResourcePool", "ComputeResource"),  # a cluster (its Resources), a vApp
}


def _check_kinds(cfg: UserConfig, entities: dict[str, Any]) -> None:
    """Every object user.yaml lists is of the kind its list names (a VM listed as a folder would get the admin role
    granted on it): one exit 2 naming each path, the kind found and the kind expected. Only vCenter knows the kind,
    so this runs on the dry run's plan too."""
    from pyVmomi import vim

    lists = {"folders": cfg.folders, "templates": cfg.templates, "networks": cfg.networks,
             "datastores": cfg.datastores, "resourcePools": cfg.resource_pools}  # fmt: skip
    problems = []
    for key, paths in lists.items():
        kinds = OBJECT_KINDS[key]
        for i, path in enumerate(paths):
            entity = entities.get(path)
            if entity is None or any(isinstance(entity, getattr(vim, k)) for k in kinds):
                continue
            found = type(entity).__name__.rsplit(".", 1)[-1]
            problems.append(InputError(f"{path} is a {found} on vCenter", source=cfg.source,
                                       field=f"spec.objects.{key}[{i}]",
                                       expected=f"a {' or '.join(kinds)}"))  # fmt: skip
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InputErrors(problems)


def _diff(missing: set[str], extra: set[str]) -> str:
    parts = []
    if missing:
        parts.append("missing " + ", ".join(sorted(missing)))
    if extra:
        parts.append("extra " + ", ".join(sorted(extra)))
    return "; ".join(parts)


def apply(plan: Plan) -> None:
    for step in plan.changes:
        step.apply()


def global_permission_step(cfg: UserConfig) -> str:
    """Spec 4.7: global permissions have no public API; the exact manual step."""
    return (
        "Manual step (spec 4.7): global permissions cannot be set through a public API. In the vSphere Client open "
        "Administration > Access Control > Global Permissions, click Add, and set\n"
        f"  Domain: {cfg.domain}\n"
        f"  User/Group: {cfg.group} (the group {cfg.principal})\n"
        f"  Role: {cfg.global_role}\n"
        "  Propagate to children: checked"
    )
