"""``cluster.validate``: the vSphere fields of cluster specs (spec 2.5, 7.2), checked before any VM exists.

Static checks need only the files: endpoint IPs (valid, one per cluster, not shared across the files given), the
server/thumbprint/insecure rule, thumbprint and path shapes, one folder per cluster. Connected checks add what only
vCenter knows: the thumbprint matches, the objects exist, and the template exists and carries its two tags.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError, InputErrors
from imagebuilder.core.files import parse_yaml_documents, read_text
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


def load_cluster_specs(paths: list[str]) -> list[ClusterSpec]:
    """Parse and statically check every file; all problems of all files are reported together (exit 2)."""
    kinds = load_profile().cluster_spec
    catalog = load_catalog()
    problems: list[InputError] = []
    specs: list[ClusterSpec] = []
    for path in paths:
        source = str(path)
        docs = [d for d in parse_yaml_documents(read_text(path, "cluster spec"), source) if d]

        def problem(where: str, message: str, expected: str | None = None, source: str = source) -> None:
            problems.append(InputError(message, source=source, field=where, expected=expected))

        by_kind: dict[str, dict[str, Any]] = {}
        for d in docs:
            if isinstance(d, dict) and isinstance(d.get("kind"), str):
                by_kind.setdefault(d["kind"], {})[str(_get(d, "metadata", "name"))] = d
        clusters = list(by_kind.get(kinds.cluster_kind, {}).values())
        if len(clusters) != 1:
            problem("kind", f"found {len(clusters)} {kinds.cluster_kind} documents", "exactly one per file")
            continue
        cluster = clusters[0]
        name = str(_get(cluster, "metadata", "name") or "")
        where = f"{kinds.cluster_kind}/{name}"
        dc_name = _get(cluster, "spec", "datacenterRef", "name")
        dc = by_kind.get(kinds.datacenter_kind, {}).get(str(dc_name))
        if dc is None:
            problem(f"{where} spec.datacenterRef", f"no {kinds.datacenter_kind} named {dc_name!r} in the file")
            continue
        dwhere = f"{kinds.datacenter_kind}/{dc_name}"
        endpoint = str(_get(cluster, "spec", "controlPlaneConfiguration", "endpoint", "host") or "")
        if not grammar.is_ip(endpoint) or not _is_host_address(endpoint):
            problem(
                f"{where} spec.controlPlaneConfiguration.endpoint.host",
                f"{endpoint!r} is not "
                + ("an IP address" if not grammar.is_ip(endpoint) else "a unicast host address"),
                "the cluster's static control-plane IP, excluded from DHCP (spec 2.5, 8)",
            )
        kubernetes = str(_get(cluster, "spec", "kubernetesVersion") or "")
        try:
            catalog.channel_for_kubernetes(kubernetes, "kubernetesVersion")
        except InputError as exc:
            problem(f"{where} spec.kubernetesVersion", exc.detail, exc.expected)
        datacenter = str(_get(dc, "spec", "datacenter") or "")
        if not datacenter:
            problem(f"{dwhere} spec.datacenter", "required field is missing", "the datacenter name")
        server = str(_get(dc, "spec", "server") or "")
        insecure = _get(dc, "spec", "insecure")
        thumbprint = _get(dc, "spec", "thumbprint") or None
        host = ""
        try:
            host = grammar.host_port(server)[0]  # host[:port]
        except ValueError:
            problem(f"{dwhere} spec.server", f"{server!r} is not a host name or IP[:port]", "the vCenter FQDN or IP")
        if insecure is not None and not isinstance(insecure, bool):
            problem(f"{dwhere} spec.insecure", f"got {insecure!r}", "true or false")
        insecure = bool(insecure)
        if thumbprint is not None:
            thumbprint = str(thumbprint).strip().upper()
            if not THUMBPRINT_RE.match(thumbprint):
                problem(f"{dwhere} spec.thumbprint", f"{thumbprint!r} is not a SHA1 thumbprint", THUMBPRINT_EXPECTED)
        if host and grammar.is_ip(host) and not thumbprint and not insecure:
            problem(
                f"{dwhere} spec.thumbprint",
                f"server {server} is an IP, so its certificate cannot be checked by name",
                "thumbprint set, or insecure: true (spec 7.2)",
            )
        network = str(_get(dc, "spec", "network") or "")
        if not network:
            problem(f"{dwhere} spec.network", "required field is missing", PATH_SHAPES["network"].format(dc=datacenter))
        elif (bad := path_problem("network", network, datacenter)) is not None:
            problem(f"{dwhere} spec.network", bad, PATH_SHAPES["network"].format(dc=datacenter))
        elif datacenter:
            network = inventory.absolute(network, datacenter, "network")
        spec = ClusterSpec(
            source,
            name,
            str(_get(cluster, "spec", "kubernetesVersion") or ""),
            endpoint,
            datacenter,
            network,
            server,
            insecure,
            thumbprint,
        )
        refs = [_get(cluster, "spec", "controlPlaneConfiguration", "machineGroupRef", "name")]
        refs += [
            _get(w, "machineGroupRef", "name") for w in _get(cluster, "spec", "workerNodeGroupConfigurations") or []
        ]
        refs += [_get(cluster, "spec", "externalEtcdConfiguration", "machineGroupRef", "name")]
        for ref in dict.fromkeys(r for r in refs if r):
            m = by_kind.get(kinds.machine_kind, {}).get(str(ref))
            mwhere = f"{kinds.machine_kind}/{ref}"
            if m is None:
                problem(where, f"refers to {mwhere}, which is not in the file")
                continue
            raw = {k: _get(m, "spec", k) for k in ("datastore", "folder", "resourcePool", "template", "osFamily")}
            for key, value in raw.items():
                if value is not None and not isinstance(value, str):
                    problem(f"{mwhere} spec.{key}", f"got {value!r}", "text")
            text = {k: v.strip() if isinstance(v, str) else "" for k, v in raw.items()}
            os_family = text["osFamily"] or "bottlerocket"  # the product's default
            if text["osFamily"]:
                try:
                    catalog.os(text["osFamily"], "osFamily")
                except InputError as exc:
                    problem(f"{mwhere} spec.osFamily", exc.detail, "bottlerocket, ubuntu or redhat")
            placed: dict[str, str] = {}
            for key in ("datastore", "folder", "resourcePool", "template"):
                value = text[key]
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
            machine = Machine(
                str(ref),
                placed.get("datastore", ""),
                placed.get("folder", ""),
                placed.get("resourcePool", ""),
                placed.get("template"),
                os_family,
            )
            spec.machines.append(machine)
        folders = sorted({m.folder for m in spec.machines})
        if len(folders) > 1:
            problem(
                f"{where}",
                f"its machines use {len(folders)} folders: {', '.join(folders)}",
                "one folder per cluster (spec 2.5)",
            )
        specs.append(spec)
    kind = kinds.cluster_kind
    problems += _shared(specs, lambda s: [s.endpoint], "control-plane endpoint", kind, "endpoint.host", "endpoint IP")
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
