"""Inventory paths (``/<datacenter>/vm/<folder>``, ``/<datacenter>/host/<cluster>/Resources``...) to objects.

Paths are what users write in user.yaml and the cluster spec (spec 2.4, 2.5); vCenter's ``SearchIndex`` resolves
them in one call, the way ``govc`` does.
"""

from __future__ import annotations

from typing import Any

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.vsphere.session import VSphere


def split_path(path: str) -> list[str]:
    return [p for p in path.strip().split("/") if p]


def find(vs: VSphere, path: str) -> Any | None:
    """The managed object at inventory ``path``, or None.

    A resource pool may be written without its ``Resources`` step (``/<dc>/host/<cluster>/<pool>``, the form of the
    product's user.yaml example, which govc resolves); vCenter's own path has it."""
    parts = split_path(path)
    if not parts:
        return vs.content.rootFolder
    obj = vs.content.searchIndex.FindByInventoryPath("/".join(parts))
    if obj is None and len(parts) >= 4 and parts[1] == "host" and parts[3] != "Resources":
        obj = vs.content.searchIndex.FindByInventoryPath("/".join([*parts[:3], "Resources", *parts[3:]]))
    return obj


def need(vs: VSphere, path: str, what: str, field: str | None = None) -> Any:
    obj = find(vs, path)
    if obj is None:
        parts = split_path(path)
        hint = "check the path in the vSphere client or with: govc ls " + "/" + "/".join(parts[:-1])
        raise ExternalError(
            f"{what} {path} does not exist on {vs.target.server}" + (f" ({field})" if field else ""), hint=hint
        )
    return obj


def moid(obj: Any) -> str:
    return str(obj._moId)


def datacenter_of(path: str, field: str, source: str | None = None) -> str:
    parts = split_path(path)
    if len(parts) < 2:
        raise InputError(f"'{path}' is not an inventory path", source=source, field=field, expected="/<datacenter>/...")
    return parts[0]


def ensure_folder(vs: VSphere, path: str, created: list[str] | None = None) -> Any:
    """The VM folder at ``path`` (``/<dc>/vm/a/b``), creating the missing ones; ``created`` collects their paths.

    A folder created by someone else between our look and our create (DuplicateName) is simply used.
    """
    from pyVmomi import vim

    parts = split_path(path)
    if len(parts) < 2 or parts[1] != "vm":
        raise InputError(f"'{path}' is not a VM folder path", field="folder", expected="/<datacenter>/vm/<folder path>")
    current = need(vs, "/".join(parts[:2]), "VM folder of datacenter")
    for i in range(2, len(parts)):
        sub = "/" + "/".join(parts[: i + 1])
        found = find(vs, sub)
        if found is None:
            try:
                found = current.CreateFolder(parts[i])
            except vim.fault.DuplicateName:
                found = need(vs, sub, "folder")
            if created is not None:
                created.append(sub)
        elif not isinstance(found, vim.Folder):
            raise ExternalError(f"{sub} exists but is a {type(found).__name__.rsplit('.', 1)[-1]}, not a folder")
        current = found
    return current


def resource_pool(vs: VSphere, path: str) -> Any:
    """``/<dc>/host/<cluster>`` (its root pool), ``/<dc>/host/<cluster>/Resources[/<pool>...]``."""
    from pyVmomi import vim

    obj = need(vs, path, "resource pool")
    if isinstance(obj, vim.ComputeResource):
        return obj.resourcePool
    if not isinstance(obj, vim.ResourcePool):
        raise ExternalError(f"{path} is a {type(obj).__name__.rsplit('.', 1)[-1]}, not a resource pool or cluster")
    return obj


def only_child(vs: VSphere, path: str, kind: Any, what: str, flag: str) -> str:
    """The single object of ``kind`` under ``path``; several or none is an input error asking for ``flag``."""
    parent = need(vs, path, what)
    names = [c.name for c in getattr(parent, "childEntity", []) if isinstance(c, kind)]
    if len(names) != 1:
        raise InputError(
            f"{'no' if not names else len(names)} {what}s under {path}",
            field=flag,
            expected=f"{flag} naming one of: {', '.join(path.rstrip('/') + '/' + n for n in names) or '(none)'}",
        )
    return f"{path.rstrip('/')}/{names[0]}"


def vms_in(vs: VSphere, folder: Any) -> dict[str, Any]:
    """The virtual machines and templates directly in ``folder``, by name, in one call."""
    from pyVmomi import vim, vmodl

    pc = vmodl.query.PropertyCollector
    spec = pc.FilterSpec(
        objectSet=[
            pc.ObjectSpec(
                obj=folder,
                skip=True,
                selectSet=[pc.TraversalSpec(name="children", type=vim.Folder, path="childEntity")],
            )
        ],
        propSet=[pc.PropertySpec(type=vim.VirtualMachine, pathSet=["name"], all=False)],
    )
    result = vs.content.propertyCollector.RetrievePropertiesEx(specSet=[spec], options=pc.RetrieveOptions())
    found: dict[str, Any] = {}
    while result:
        for o in result.objects:
            found[o.propSet[0].val] = o.obj
        if not result.token:
            break
        result = vs.content.propertyCollector.ContinueRetrievePropertiesEx(token=result.token)
    return found


# --- govc-style paths: relative to a datacenter, and patterns ---------------------------------------------------------

#: where a relative path of each cluster-spec field lives under its datacenter (the product completes a relative
#: path as /<datacenter>/<folder>/<path>, and govc resolves relative names from the same folders)
KIND_FOLDERS = {
    "network": "network",
    "datastore": "datastore",
    "folder": "vm",
    "template": "vm",
    "resourcePool": "host",
}
_GLOB = set("*?[")


def absolute(path: str, datacenter: str, kind: str) -> str:
    """``path`` made absolute the way the product does: ``/<dc>/...`` stays, anything else goes under
    ``/<dc>/<kind folder>/``. Patterns stay patterns."""
    text = path.strip()
    if text.startswith("/"):
        return "/" + "/".join(split_path(text))
    return f"/{datacenter}/{KIND_FOLDERS[kind]}/" + "/".join(split_path(text))


def is_pattern(path: str) -> bool:
    return any(ch in _GLOB for ch in path)


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The named children of an inventory object, as govc lists them."""
    from pyVmomi import vim

    if isinstance(obj, vim.Datacenter):
        return [("vm", obj.vmFolder), ("host", obj.hostFolder), ("datastore", obj.datastoreFolder),
                ("network", obj.networkFolder)]  # fmt: skip
    if isinstance(obj, vim.Folder):
        return [(c.name, c) for c in obj.childEntity]
    if isinstance(obj, vim.ComputeResource):
        return [("Resources", obj.resourcePool)]
    if isinstance(obj, vim.ResourcePool):
        return [(c.name, c) for c in obj.resourcePool]
    return []


def glob(vs: VSphere, pattern: str, limit: int = 50) -> list[str]:
    """Every inventory path matching ``pattern`` (``*``, ``?`` and ``[...]`` within one component, as govc does)."""
    import fnmatch

    level: list[tuple[str, Any]] = [("", vs.content.rootFolder)]
    for part in split_path(pattern):
        nxt: list[tuple[str, Any]] = []
        for path, obj in level:
            for name, child in _children(obj):
                if fnmatch.fnmatchcase(name, part):
                    nxt.append((f"{path}/{name}", child))
        level = nxt[: limit + 1]
        if not level:
            break
    return [p for p, _ in level]


def resolve(vs: VSphere, path: str) -> tuple[Any | None, list[str]]:
    """(the one object ``path`` names, the paths it matched): a plain path is looked up in one call; a pattern must
    match exactly one object (None and the matches otherwise)."""
    if not is_pattern(path):
        obj = find(vs, path)
        return obj, [path] if obj is not None else []
    matches = glob(vs, path)
    return (find(vs, matches[0]) if len(matches) == 1 else None), matches
