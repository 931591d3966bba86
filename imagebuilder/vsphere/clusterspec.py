"""``cluster.validate``: the vSphere fields of cluster specs (spec 2.5, 7.2), checked before any VM exists.

Static checks need only the files: endpoint IPs (valid, one per cluster, not shared across the files given), the
server/thumbprint/insecure rule, thumbprint and path shapes, one folder per cluster. Connected checks add what only
vCenter knows: the thumbprint matches, the objects exist, and the template exists and carries its two tags.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, StrictBool, StrictStr

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError, InputErrors
from imagebuilder.core.files import parse_yaml_documents, read_text
from imagebuilder.core.validation import FieldProblem, ForeignModel, model_problems
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.profile import load_profile
from imagebuilder.vsphere import inventory
from imagebuilder.vsphere.connection import THUMBPRINT_EXPECTED, THUMBPRINT_RE, server_thumbprint, target_from
from imagebuilder.vsphere.session import VSphere, connect


@dataclass
class Machine:
    """A machine config's placement, its paths made absolute (patterns stay patterns)."""

    name: str
    datastore: str
    folder: str
    resource_pool: str
    template: str | None  #: None: Bottlerocket without a template (the product imports its default OVA)
    os_family: str


#: what each path field may look like, absolute; each may also be relative to its folder under the datacenter
PATH_SHAPES = {
    "network": "/{dc}/network/<name>, or the name alone",
    "datastore": "/{dc}/datastore/<name>, or the name alone",
    "folder": "/{dc}/vm[/<folder path>], or a folder path relative to /{dc}/vm",
    "resourcePool": "/{dc}/host/<cluster>/Resources[/<pool>...] or <cluster>/Resources[/<pool>...]; * for any",
    "template": "/{dc}/vm/<folder path>/<template>, or the template's name",
}
_ROOTS = {"network": ("network", 3), "datastore": ("datastore", 3), "folder": ("vm", 2), "template": ("vm", 3),
          "resourcePool": ("host", 4)}  # fmt: skip


def path_problem(key: str, value: str, datacenter: str) -> str | None:
    """What is wrong with the shape of a path field (None: nothing). Patterns are checked for shape only."""
    import fnmatch

    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return f"{value[:60]!r} contains a control character"
    if any(p in (".", "..") for p in inventory.split_path(value)):
        return f"{value!r} has a '.' or '..' component"
    if not datacenter:
        return None
    parts = inventory.split_path(inventory.absolute(value, datacenter, key))
    root, depth = _ROOTS[key]
    if len(parts) < depth or not fnmatch.fnmatchcase(datacenter, parts[0]) or parts[1] != root:
        label = {"resourcePool": "resource pool", "folder": "VM folder"}.get(key, key)
        return f"{value!r} is not a {label} path under datacenter {datacenter!r}"
    if key == "resourcePool" and not fnmatch.fnmatchcase("Resources", parts[3]):
        return f"{value!r} is not a resource pool path (a cluster's pools are under <cluster>/Resources)"
    return None


@dataclass
class ClusterSpec:
    source: str
    name: str
    kubernetes: str
    endpoint: str
    datacenter: str
    network: str
    server: str
    insecure: bool
    thumbprint: str | None
    machines: list[Machine] = field(default_factory=list)


M = TypeVar("M", bound=BaseModel)


def _is_host_address(value: str) -> bool:
    """An address a host can have: not unspecified (0.0.0.0), loopback, multicast or broadcast."""
    ip = ipaddress.ip_address(value)
    return not (ip.is_unspecified or ip.is_loopback or ip.is_multicast or str(ip) == "255.255.255.255")


def _get(doc: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def _endpoint(value: str) -> str:
    if not grammar.is_ip(value) or not _is_host_address(value):
        raise FieldProblem(f"{value!r} is not " + ("an IP address" if not grammar.is_ip(value) else
                                                    "a unicast host address"), ENDPOINT_EXPECTED)  # fmt: skip
    return value


def _kubernetes(value: str) -> str:
    try:
        load_catalog().channel_for_kubernetes(value, "kubernetesVersion")
    except InputError as exc:
        raise FieldProblem.of(exc) from None
    return value


def _number_as_text(value: object) -> object:
    # YAML reads an unquoted 1.24 as a number; the product's users write it so
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _server(value: str) -> str:
    try:
        grammar.host_port(value)  # host[:port]
    except ValueError:
        raise FieldProblem(f"{value!r} is not a host name or IP[:port]", "the vCenter FQDN or IP") from None
    return value


def _thumbprint(value: str) -> str:
    value = value.strip().upper()
    if not THUMBPRINT_RE.match(value):
        raise FieldProblem(f"{value!r} is not a SHA1 thumbprint", THUMBPRINT_EXPECTED)
    return value


def _os_family(value: str) -> str:
    value = value.strip()
    try:
        load_catalog().os(value, "osFamily")
    except InputError as exc:
        raise FieldProblem(exc.detail, "bottlerocket, ubuntu or redhat") from None
    return value


ENDPOINT_EXPECTED = "the cluster's static control-plane IP, excluded from DHCP (spec 2.5, 8)"
#: a path field (a network, a machine's placement): text, its shape checked after, against the datacenter
#: (another document)
InventoryPath = Annotated[StrictStr, AfterValidator(str.strip)]


class _Ref(ForeignModel):
    name: StrictStr = Field(description="the name of a document in the file")


class _Endpoint(ForeignModel):
    host: Annotated[StrictStr, AfterValidator(_endpoint)] = Field(description=ENDPOINT_EXPECTED)


class _ControlPlane(ForeignModel):
    endpoint: _Endpoint = Field(description="host: the control-plane IP")
    machineGroupRef: _Ref | None = None


class _Group(ForeignModel):
    machineGroupRef: _Ref | None = None


class _ClusterBody(ForeignModel):
    datacenterRef: _Ref = Field(description="the name of the file's datacenter config")
    controlPlaneConfiguration: _ControlPlane = Field(description="endpoint and machineGroupRef")
    kubernetesVersion: Annotated[StrictStr, BeforeValidator(_number_as_text), AfterValidator(_kubernetes)] = Field(
        description="the cluster's Kubernetes version, as 1.24"
    )
    workerNodeGroupConfigurations: list[_Group] = Field(default_factory=list)
    externalEtcdConfiguration: _Group | None = None


class ClusterDoc(ForeignModel):
    """The fields of the product's Cluster document that ``cluster.validate`` checks."""

    spec: _ClusterBody = Field(description="the cluster's spec")


class _DatacenterBody(ForeignModel):
    datacenter: StrictStr = Field(min_length=1, description="the datacenter name")
    server: Annotated[StrictStr, AfterValidator(_server)] = Field(min_length=1, description="the vCenter FQDN or IP")
    insecure: StrictBool = Field(False, description="true or false")
    thumbprint: Annotated[StrictStr, AfterValidator(_thumbprint)] | None = None
    network: InventoryPath | None = None  # required: checked with its shape, which names the datacenter


class DatacenterDoc(ForeignModel):
    """The fields of the product's vSphere datacenter config that ``cluster.validate`` checks."""

    spec: _DatacenterBody = Field(description="datacenter, server, network, insecure or thumbprint")


class _MachineBody(ForeignModel):
    datastore: InventoryPath | None = None
    folder: InventoryPath | None = None
    resourcePool: InventoryPath | None = None
    template: InventoryPath | None = None
    osFamily: Annotated[StrictStr, AfterValidator(_os_family)] | None = None


class MachineDoc(ForeignModel):
    """The placement fields of the product's vSphere machine config."""

    spec: _MachineBody = Field(description="datastore, folder, resourcePool, template, osFamily")


def load_cluster_specs(paths: list[str]) -> list[ClusterSpec]:
    """Parse and statically check every file; all problems of all files are reported together (exit 2). Each
    document is read through its model (the fields this task checks); what depends on another document (paths under
    the datacenter, the machines a cluster refers to, one folder per cluster) is checked after."""
    kinds = load_profile().cluster_spec
    problems: list[InputError] = []
    specs: list[ClusterSpec] = []
    for path in paths:
        source = str(path)
        docs = [d for d in parse_yaml_documents(read_text(path, "cluster spec"), source) if d]

        def problem(where: str, message: str, expected: str | None = None, source: str = source) -> None:
            problems.append(InputError(message, source=source, field=where, expected=expected))

        def read(model: type[M], data: object, where: str) -> M | None:
            found, checked = model_problems(model, data)
            for p in checked:
                problem(f"{where} {p.field}", p.message, p.expected)
            return found

        by_kind: dict[str, dict[str, Any]] = {}
        for d in docs:
            if isinstance(d, dict) and isinstance(d.get("kind"), str):
                by_kind.setdefault(d["kind"], {})[str(_get(d, "metadata", "name"))] = d
        clusters = list(by_kind.get(kinds.cluster_kind, {}).values())
        if len(clusters) != 1:
            problem("kind", f"found {len(clusters)} {kinds.cluster_kind} documents", "exactly one per file")
            continue
        raw = clusters[0]
        name = str(_get(raw, "metadata", "name") or "")
        where = f"{kinds.cluster_kind}/{name}"
        dc_name = _get(raw, "spec", "datacenterRef", "name")
        dc_raw = by_kind.get(kinds.datacenter_kind, {}).get(str(dc_name))
        if dc_raw is None:
            problem(f"{where} spec.datacenterRef", f"no {kinds.datacenter_kind} named {dc_name!r} in the file")
            continue
        dwhere = f"{kinds.datacenter_kind}/{dc_name}"
        cluster = read(ClusterDoc, raw, where)
        dc = read(DatacenterDoc, dc_raw, dwhere)
        datacenter = dc.spec.datacenter if dc else ""
        network = ""
        if dc is not None:
            host = grammar.host_port(dc.spec.server)[0]
            if grammar.is_ip(host) and not dc.spec.thumbprint and not dc.spec.insecure:
                problem(f"{dwhere} spec.thumbprint",
                        f"server {dc.spec.server} is an IP, so its certificate cannot be checked by name",
                        "thumbprint set, or insecure: true (spec 7.2)")  # fmt: skip
            shape = PATH_SHAPES["network"].format(dc=datacenter)
            if not dc.spec.network:
                problem(f"{dwhere} spec.network", "required field is missing", shape)
            elif (bad := path_problem("network", dc.spec.network, datacenter)) is not None:
                problem(f"{dwhere} spec.network", bad, shape)
            else:
                network = inventory.absolute(dc.spec.network, datacenter, "network")
        spec = ClusterSpec(
            source,
            name,
            cluster.spec.kubernetesVersion if cluster else "",
            cluster.spec.controlPlaneConfiguration.endpoint.host if cluster else "",
            datacenter,
            network,
            dc.spec.server if dc else "",
            dc.spec.insecure if dc else False,
            dc.spec.thumbprint if dc else None,
        )
        refs = [_get(raw, "spec", "controlPlaneConfiguration", "machineGroupRef", "name")]
        refs += [_get(w, "machineGroupRef", "name") for w in _get(raw, "spec", "workerNodeGroupConfigurations") or []]
        refs += [_get(raw, "spec", "externalEtcdConfiguration", "machineGroupRef", "name")]
        for ref in dict.fromkeys(r for r in refs if r):
            m_raw = by_kind.get(kinds.machine_kind, {}).get(str(ref))
            mwhere = f"{kinds.machine_kind}/{ref}"
            if m_raw is None:
                problem(where, f"refers to {mwhere}, which is not in the file")
                continue
            machine = read(MachineDoc, m_raw, mwhere)
            if machine is None:
                continue
            os_family = machine.spec.osFamily or "bottlerocket"  # the product's default
            placed: dict[str, str] = {}
            for key in ("datastore", "folder", "resourcePool", "template"):
                value = getattr(machine.spec, key) or ""
                if not value:
                    if key == "template" and os_family == "bottlerocket":
                        continue  # the product imports its default Bottlerocket OVA when none is given
                    expected = "the template's inventory path (required for ubuntu and redhat)"
                    problem(f"{mwhere} spec.{key}", "required field is missing", expected if key == "template" else
                            PATH_SHAPES[key].format(dc=datacenter or "<datacenter>"))  # fmt: skip
                    continue
                shape_problem = path_problem(key, value, datacenter)
                if shape_problem:
                    problem(f"{mwhere} spec.{key}", shape_problem, PATH_SHAPES[key].format(dc=datacenter or "<dc>"))
                placed[key] = inventory.absolute(value, datacenter, key) if datacenter else value
            where_placed = (placed.get("datastore", ""), placed.get("folder", ""), placed.get("resourcePool", ""))
            spec.machines.append(Machine(str(ref), *where_placed, placed.get("template"), os_family))
        folders = sorted({m.folder for m in spec.machines})
        if len(folders) > 1:
            problem(
                f"{where}",
                f"its machines use {len(folders)} folders: {', '.join(folders)}",
                "one folder per cluster (spec 2.5)",
            )
        specs.append(spec)
    kind = kinds.cluster_kind
    problems += _shared(specs, lambda s: [s.endpoint] if s.endpoint else [], "control-plane endpoint", kind,
                        "endpoint.host", "endpoint IP")  # fmt: skip
    problems += _shared(specs, lambda s: [m.folder for m in s.machines], "folder", kind, "folder", "folder")
    if problems:
        raise InputErrors(problems)
    return specs


def _shared(
    specs: list[ClusterSpec], values: Callable[[ClusterSpec], list[str]], label: str, kind: str, field: str, one: str
) -> list[InputError]:
    """A value (endpoint IP, folder) that two clusters of the files given both use (spec 2.5: one per cluster)."""
    seen: dict[str, str] = {}
    problems = []
    for s in specs:
        for v in sorted(set(values(s))):
            if v in seen:
                problems.append(
                    InputError(
                        f"{label} {v} is also used by {seen[v]}",
                        source=s.source,
                        field=f"{kind}/{s.name} {field}",
                        expected=f"one {one} per cluster (spec 2.5)",
                    )
                )
            seen.setdefault(v, f"{s.name} ({s.source})")
    return problems


def _matched(matches: list[str]) -> str:
    if not matches:
        return "does not exist"
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    return f"matches {len(matches)} objects ({shown}); it must name exactly one"


def _find_template(vs: VSphere, path: str, datacenter: str) -> str | None:
    """The inventory path of the template ``path`` names. A bare name (``/<dc>/vm/<name>`` once made absolute) is
    also found in any folder below the datacenter's VM folder, as the product finds it; it must be unique."""
    obj, matches = inventory.resolve(vs, path)
    if obj is not None:
        return matches[0]
    parts = inventory.split_path(path)
    if len(parts) != 3 or inventory.is_pattern(path):
        return None
    from pyVmomi import vim

    root = inventory.find(vs, f"/{datacenter}/vm")
    if root is None:
        return None
    view = vs.content.viewManager.CreateContainerView(root, [vim.VirtualMachine], True)
    try:
        found = [vm for vm in view.view if vm.name == parts[2]]
    finally:
        view.Destroy()
    if len(found) != 1:
        return None
    names = []
    obj = found[0]
    while obj is not None and obj != root:
        names.append(obj.name)
        obj = obj.parent
    return f"/{datacenter}/vm/" + "/".join(reversed(names))


def check_online(vs: VSphere, spec: ClusterSpec) -> list[str]:
    """What only vCenter knows; all problems of the spec in one error (exit 1)."""
    from imagebuilder.vsphere.templates import fix_command, validate_template

    catalog = load_catalog()
    problems: list[str] = []
    hints: list[str] = []
    notes: list[str] = []
    if spec.thumbprint:
        actual = server_thumbprint(vs.target)
        if actual != spec.thumbprint:
            problems.append(f"thumbprint {spec.thumbprint} does not match the server's {actual}")
    paths = [(f"/{spec.datacenter}", "datacenter"), (spec.network, "network")]
    for m in spec.machines:
        paths += [(m.datastore, "datastore"), (m.resource_pool, "resource pool"), (m.folder, "folder")]
    for path, what in dict.fromkeys(paths):
        obj, matches = inventory.resolve(vs, path)
        if obj is None:
            problems.append(f"{what} {path} " + _matched(matches))
    templates = {m.template: m for m in spec.machines if m.template}
    for m in spec.machines:
        if not m.template:
            notes.append(f"{m.name}: no template: the product imports its default {m.os_family} OVA")
    for written, m in templates.items():
        template = _find_template(vs, written, spec.datacenter)
        if template is None:
            problems.append(f"template {written} does not exist")
            hints.append("image-builder template.import --ova ... (spec 3)")
            continue
        os_ = catalog.os(m.os_family, "osFamily")
        channel = catalog.channel_for_kubernetes(spec.kubernetes, "kubernetesVersion")
        bad = validate_template(vs, template, os_, channel)
        problems += [f"template {template}: {p}" for p in bad]
        if bad:
            hints.append(fix_command(template, os_, channel))
    if problems:
        raise ExternalError(
            f"{spec.source} ({spec.name}) does not match vCenter {vs.target.server}:\n  " + "\n  ".join(problems),
            hint="; ".join(dict.fromkeys(hints)) or "fix the paths in the cluster spec",
        )
    return notes


def check_all_online(specs: list[ClusterSpec]) -> list[str]:
    """Each spec checked against the vCenter it names (its server, insecure flag and thumbprint, never the
    environment's); the notes of all of them, or the first spec's problems as an error (exit 1)."""
    notes: list[str] = []
    for spec in specs:
        target = target_from(spec.server, spec.insecure, spec.thumbprint, {})
        with connect(target, f"checking {spec.source} against {target.server}") as vs:
            notes += check_online(vs, spec)
    return notes
