"""Templates (spec 3, 4.6, 7): import an OVA as a tagged template, tag a self-built one, validate the tags.

``import_template`` walks the preparation order of spec 3 and converges at every step, so a rerun after an
interruption picks up where the last run stopped and never creates anything twice:

    folder -> library -> library item (+ upload) -> deployed VM -> disk resize (OS-1) -> snapshot ``root``
    -> mark as template -> the two tags

Template names are unique per folder (spec 8): a template already at the target path is checked (its tags are made
right) and otherwise left alone. The imported VM is never powered on (spec 7.4).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from imagebuilder.core import faults, grammar
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import parse_yaml_documents, read_text
from imagebuilder.core.progress import Transfers
from imagebuilder.core.validation import Problem, StrictModel, model_problems, raise_problems
from imagebuilder.release.catalog import OperatingSystem, ReleaseChannel, load_catalog
from imagebuilder.release.profile import load_profile
from imagebuilder.vsphere import inventory
from imagebuilder.vsphere.session import VSphere
from imagebuilder.vsphere.tags import ExpectedTag, expected_tags

SNAPSHOT = "root"
SNAPSHOT_WARNING = "a snapshotted template cannot have its cluster VM disk size customised (spec 3, 8)"

#: vSphere names a VM or template with at most 80 characters; '/' and '\\' separate paths, '%' escapes in them
TEMPLATE_NAME = re.compile(r"[^/\\%\x00-\x1f\x7f]{1,80}")


def default_name(os: OperatingSystem, channel: ReleaseChannel) -> str:
    """The template (and library item) name when ``--name`` is not given: ``ubuntu-kubernetes-1-24-eks-36``."""
    p = load_profile()
    return p.vsphere_templates.name.format(
        os=os.name, channel=channel.name, distro=p.distro.name, number=channel.release
    )


@dataclass(frozen=True)
class ImportRequest:
    source: str
    os: OperatingSystem
    channel: ReleaseChannel
    name: str
    library: str
    folder: str
    datastore: str
    resource_pool: str
    snapshot: bool = True

    @property
    def path(self) -> str:
        return f"{self.folder.rstrip('/')}/{self.name}"


@dataclass
class Outcome:
    path: str
    done: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def did(self, what: str) -> None:
        """Record a change made (a step of the task's progress: a failpoint, see :mod:`imagebuilder.core.faults`)."""
        self.done.append(faults.step(what))


@dataclass(frozen=True)
class ImportEntry:
    """One template of an import list: where its OVA is, which OS and Kubernetes it is for, its name."""

    source: str
    os: OperatingSystem
    channel: ReleaseChannel
    name: str | None = None


class ImportItem(StrictModel):
    """One entry of ``template.import --from-file``'s list, as the user writes it."""

    ova: str = Field(min_length=1, description="a local OVA path or an http(s) URL")
    os: str = Field(description="the template's OS: ubuntu, redhat or bottlerocket (os2, os3, os1)")
    kubernetes: str = Field(description="its Kubernetes version, as 1.24")
    name: str | None = None

    @field_validator("kubernetes", mode="before")
    @classmethod
    def _unquoted_version(cls, value: object) -> object:
        # YAML reads an unquoted 1.24 as a number; the list's users write it so
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def load_import_list(path: str) -> list[ImportEntry]:
    """``template.import --from-file``: a YAML list of ``{ova, os, kubernetes[, name]}``; every problem reported.

    Relative OVA paths are relative to the list file, so a mirror directory can carry its own list.
    """
    catalog = load_catalog()
    docs = parse_yaml_documents(read_text(path, "import list"), path)
    data = docs[0] if len(docs) == 1 else None
    if not isinstance(data, list) or not data:
        raise InputError(
            "must be a non-empty YAML list", source=path, expected="- {ova: PATH|URL, os: OS, kubernetes: 1.24}"
        )
    base = Path(path).resolve().parent
    problems: list[Problem] = []
    entries: list[ImportEntry] = []
    for i, raw in enumerate(data):
        item, found = model_problems(ImportItem, raw, prefix=f"[{i}]")
        problems += found
        if item is None:
            # what is there is still checked: every problem of the list is reported in one go
            fields = raw if isinstance(raw, dict) else {}
            ova = fields.get("ova")
            if isinstance(ova, str) and ova:
                try:
                    _ova_source(ova, base)
                except InputError as exc:
                    problems.append(Problem(f"[{i}].ova", exc.detail, exc.expected))
            continue
        try:
            entries.append(
                ImportEntry(
                    _ova_source(item.ova, base),
                    catalog.os(item.os, "os"),
                    catalog.channel_for_kubernetes(item.kubernetes, "kubernetes"),
                    check_name(item.name, "name") if item.name else None,
                )
            )
        except InputError as exc:
            problems.append(Problem(f"[{i}].{exc.field}", exc.detail, exc.expected))
    names = [default_name(e.os, e.channel) if e.name is None else e.name for e in entries]
    for n in {n for n in names if names.count(n) > 1}:
        problems.append(Problem("name", f"template name {n} appears twice", "names unique per folder (spec 8)"))
    raise_problems(problems, path)
    return entries


def _ova_source(ova: str, base: Path) -> str:
    """An entry's OVA: an http(s) URL as given, a local path resolved against the list's folder (it must exist)."""
    if "://" in ova:
        try:
            grammar.url(ova, ("http", "https"))
        except ValueError as exc:
            raise InputError(str(exc), field="ova", expected="a local OVA path or an http(s) URL") from None
        return ova
    local = (base / ova).resolve()
    if not local.is_file():
        raise InputError(f"{local} does not exist", field="ova", expected="a local OVA file or a URL")
    return str(local)


def plan_text(req: ImportRequest) -> list[str]:
    """What ``template.import`` does, step by step, for ``--dry-run``."""
    disk = req.os.template_disk(req.channel.minor)
    steps = [
        f"folder {req.folder} (created when missing)",
        f"content library {req.library} on {req.datastore} (created when missing)",
        f"library item {req.name} <- {'pull from ' if '://' in req.source else 'upload of '}{req.source}",
        f"deploy {req.path} (thin, pool {req.resource_pool}, not powered on)",
    ]
    if disk:
        steps.append(f"resize {disk.label} to {disk.size_gb}G ({req.os.name} on Kubernetes {req.channel.minor})")
    steps.append(f"snapshot '{SNAPSHOT}'" if req.snapshot else "no snapshot (--no-snapshot)")
    steps.append("mark as template")
    steps += [f"tag {t.name} (category {t.category})" for t in expected_tags(req.os, req.channel)]
    return steps


def _is_template(vm: Any) -> bool:
    return bool(vm.config and vm.config.template)


def _once(vs: VSphere, key: str, make: Any) -> Any:
    if key not in vs.cache:
        vs.cache[key] = make()
    return vs.cache[key]


@dataclass(frozen=True)
class _Place:
    """Where a template goes; looked up (and created) once per session however many templates share it."""

    folder: Any
    datastore: Any
    pool: Any
    library_id: str
    vms: dict[str, Any]  # the folder's VMs and templates by name, as they were when first listed


def _place(vs: VSphere, req: ImportRequest, out: Outcome) -> _Place:
    created: list[str] = []
    folder = _once(vs, f"folder:{req.folder}", lambda: inventory.ensure_folder(vs, req.folder, created))
    for p in created:
        out.did(f"created folder {p}")
    ds = _once(vs, f"ds:{req.datastore}", lambda: inventory.need(vs, req.datastore, "datastore", "--datastore"))
    pool = _once(vs, f"pool:{req.resource_pool}", lambda: inventory.resource_pool(vs, req.resource_pool))
    created = []
    library_id = vs.library.ensure(req.library, inventory.moid(ds), created)
    for c in created:
        out.did(f"created {c}")
    vms = _once(vs, f"vms:{req.folder}", lambda: inventory.vms_in(vs, folder))
    return _Place(folder, ds, pool, library_id, vms)


def import_template(vs: VSphere, req: ImportRequest, transfers: Transfers | None = None) -> Outcome:
    from pyVmomi import vim

    out = Outcome(req.path)
    place = _place(vs, req, out)
    vm = place.vms.get(req.name)  # names are unique in a folder, so the listing cannot be stale for this one
    if vm is not None and not isinstance(vm, vim.VirtualMachine):
        raise ExternalError(f"{req.path} exists and is not a virtual machine", hint="choose another --name or --folder")
    fresh = vm is None
    if vm is None:
        # a library made in this session holds no item by this name (template names are unique per folder)
        item = None if place.library_id in vs.library.new else vs.library.find_item(place.library_id, req.name)
        has_files = False
        if item is None:
            description = f"{req.os.name} Kubernetes {req.channel.minor}"
            item = vs.library.create_item(place.library_id, req.name, description)
            out.did(f"created library item {req.name}")
        else:
            # a run killed during its upload left the item's session open (nothing marked it failed), and the files
            # it had pushed may be in the item: cancelled, and the item is complete only if it holds every file
            for session in vs.library.open_sessions(item):
                vs.library.cancel(session)
                out.did(f"cancelled the upload a stopped run left open on {req.library}/{req.name}")
            held = {str(f.get("name", "")) for f in vs.library.item_files(item)}
            has_files = vs.library.files_of(req.source) <= held
        if has_files:
            out.kept.append(f"library item {req.name} already holds the OVA")
        else:  # new, or left empty or part-filled by an interrupted upload
            vs.library.upload(item, req.source, transfers)
            out.did(f"{'pulled' if '://' in req.source else 'uploaded'} {req.source} into {req.library}/{req.name}")
        moids = (inventory.moid(place.pool), inventory.moid(place.folder), inventory.moid(place.datastore))
        vm = vim.VirtualMachine(vs.library.deploy(item, req.name, *moids), vs.si._stub)
        out.did(f"deployed {req.path}")
    disk = req.os.template_disk(req.channel.minor)
    if fresh:  # just deployed by us: a VM, powered off, no snapshot; only its disks may be needed
        state = vs.properties(vm, "config.hardware.device") if disk else {}
        state.update({"config.template": False, "runtime.powerState": "poweredOff", "snapshot": None})
    else:
        state = vs.properties(vm, "config.template", "runtime.powerState", "config.hardware.device", "snapshot")
    if state["config.template"]:
        out.kept.append(f"template {req.path} exists; left alone (names are unique per folder)")
        ensure_tags(vs, vm, req.os, req.channel, out)
        return out
    if not fresh:
        out.kept.append(f"VM {req.path} exists (an earlier run stopped before it became a template); continuing")
    if state["runtime.powerState"] != "poweredOff":
        raise ExternalError(
            f"{req.path} is powered on; an imported OVA must not be powered on (spec 7.4)",
            hint="power it off, or delete it and rerun the import",
        )
    resize_disk(vs, vm, state.get("config.hardware.device") or [], req, out)
    if req.snapshot:
        if _has_snapshot(state["snapshot"], SNAPSHOT):
            out.kept.append(f"snapshot '{SNAPSHOT}' exists")
        else:
            task = vm.CreateSnapshot_Task(name=SNAPSHOT, description="image-builder", memory=False, quiesce=False)
            vs.wait(task, f"snapshot of {req.path}")
            out.did(f"snapshot '{SNAPSHOT}'")
        out.warnings.append(SNAPSHOT_WARNING)
    vm.MarkAsTemplate()
    out.did("marked as template")
    ensure_tags(vs, vm, req.os, req.channel, out, attached=[] if fresh else None)
    return out


def import_templates(
    vs: VSphere, reqs: list[ImportRequest], jobs: int = 4, transfers: Transfers | None = None
) -> list[Outcome]:
    """Import several templates in one session: what they share (folders, library, tag categories and tags) is
    made first, one at a time, so nothing is created twice; then the templates are imported ``jobs`` at a time.
    Outcomes come back in the order of ``reqs``; the first failure is raised after the others finish."""
    from concurrent.futures import ThreadPoolExecutor

    shared = Outcome("(shared)")
    for req in reqs:
        _place(vs, req, shared)
        for tag in expected_tags(req.os, req.channel):
            vs.tagging.ensure_tag(tag)
    shared.done += [f"created {c}" for c in vs.tagging.created]
    del vs.tagging.created[:]
    if len(reqs) == 1 or jobs <= 1:
        outcomes = [import_template(vs, r, transfers) for r in reqs]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(import_template, vs, r, transfers) for r in reqs]
            outcomes = [f.result() for f in futures]
    if shared.done:
        outcomes[0].done[:0] = shared.done
    return outcomes


def _has_snapshot(info: Any, name: str) -> bool:
    def walk(trees: Any) -> bool:
        return any(t.name == name or walk(t.childSnapshotList) for t in trees or [])

    return info is not None and walk(info.rootSnapshotList)


def resize_disk(vs: VSphere, vm: Any, devices: list[Any], req: ImportRequest, out: Outcome) -> None:
    from pyVmomi import vim

    disk = req.os.template_disk(req.channel.minor)
    if disk is None:
        return
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    found = next((d for d in disks if d.deviceInfo and d.deviceInfo.label == disk.label), None)
    if found is None:
        labels = ", ".join(d.deviceInfo.label for d in disks if d.deviceInfo) or "none"
        raise ExternalError(
            f"{req.path} has no '{disk.label}' to resize to {disk.size_gb}G (its disks: {labels})",
            hint=f"is this OVA really {req.os.name} for Kubernetes {req.channel.minor}?",
        )
    want_kb = disk.size_gb * 1024 * 1024
    if found.capacityInKB >= want_kb:
        out.kept.append(f"{disk.label} is already {found.capacityInKB // (1024 * 1024)}G")
        return
    found.capacityInKB = want_kb
    found.capacityInBytes = int(want_kb) * 1024
    change = vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.edit, device=found)
    vs.wait(vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(deviceChange=[change])), f"resizing {disk.label} of {req.path}")
    out.did(f"resized {disk.label} to {disk.size_gb}G")


def ensure_tags(
    vs: VSphere,
    vm: Any,
    os: OperatingSystem,
    channel: ReleaseChannel,
    out: Outcome,
    attached: list[ExpectedTag] | None = None,
) -> None:
    """Attach the two expected tags; a wrong tag in the same (single-cardinality) category is replaced.
    ``attached`` is what the VM carries when the caller knows it (a VM it just deployed carries none)."""
    tagging = vs.tagging
    before = len(tagging.created)
    moid = inventory.moid(vm)
    have = tagging.attached(moid) if attached is None else attached
    missing = []
    for want in expected_tags(os, channel):
        same_category = [t for t in have if t.category == want.category]
        if want in same_category:
            out.kept.append(f"tag {want.name}")
            continue
        for wrong in same_category:
            tagging.detach(wrong, moid)
            out.did(f"removed wrong tag {wrong.name}")
        missing.append(want)
    tagging.attach_all(missing, moid)
    for t in missing:
        out.did(f"tagged {t.name}")
    for c in tagging.created[before:]:
        out.did(f"created {c}")


def need_vm(vs: VSphere, path: str) -> Any:
    from pyVmomi import vim

    vm = inventory.find(vs, path)
    if vm is None or not isinstance(vm, vim.VirtualMachine):
        raise ExternalError(
            f"no template at {path} on {vs.target.server}",
            hint="give the inventory path /<datacenter>/vm/<folder>/<name> (govc ls shows it)",
        )
    return vm


def fix_command(path: str, os: OperatingSystem, channel: ReleaseChannel) -> str:
    return f"image-builder template.tag --template {path} --os {os.name} --kubernetes {channel.minor}"


def validate_template(vs: VSphere, path: str, os: OperatingSystem, channel: ReleaseChannel) -> list[str]:
    """Spec 7.1: the template carries exactly the two expected tags. Returns the problems (empty when valid)."""
    vm = need_vm(vs, path)
    problems = []
    if not _is_template(vm):
        problems.append(f"{path} is a virtual machine, not a template (mark it as template)")
    have = vs.tagging.attached(inventory.moid(vm))
    for want in expected_tags(os, channel):
        same = [t for t in have if t.category == want.category]
        if not same:
            problems.append(f"missing tag: category '{want.category}' needs '{want.name}'")
        for t in same:
            if t != want:
                problems.append(f"wrong tag: '{t.name}' in category '{want.category}', expected exactly '{want.name}'")
    return problems


def tag_template(vs: VSphere, path: str, os: OperatingSystem, channel: ReleaseChannel) -> Outcome:
    out = Outcome(path)
    vm = need_vm(vs, path)
    if not _is_template(vm):
        raise InputError(
            f"{path} is a virtual machine, not a template: its tags would make it look like one",
            field="--template",
            expected="a template (mark the VM as template first, e.g. govc vm.markastemplate)",
        )
    ensure_tags(vs, vm, os, channel, out)
    return out


def check_name(name: str, field: str = "--name") -> str:
    """A template (and library item) name: what vSphere takes as one inventory name, nothing that reads as a path."""
    if not TEMPLATE_NAME.fullmatch(name) or name in (".", ".."):
        raise InputError(
            f"{name[:60]!r} is not a template name",
            field=field,
            expected="1 to 80 characters without '/', '\\', '%' or control characters",
        )
    return name


def resolve_request(
    vs: VSphere,
    *,
    source: str,
    os: OperatingSystem,
    channel: ReleaseChannel,
    name: str | None,
    library: str | None,
    folder: str | None,
    datastore: str | None,
    resource_pool: str | None,
    datacenter: str | None,
    snapshot: bool,
) -> ImportRequest:
    """Fill defaults from the server where there is exactly one choice (one datacenter, datastore, cluster)."""
    from pyVmomi import vim

    dc = datacenter
    for given in (folder, datastore, resource_pool):
        if given and not dc:
            dc = inventory.datacenter_of(given, "--folder/--datastore/--resource-pool")
    if name is not None:
        check_name(name)
    if not dc:
        dc = inventory.only_child(vs, "/", vim.Datacenter, "datacenter", "--datacenter").strip("/")
    for flag, value, root in (
        ("--folder", folder, "vm"),
        ("--datastore", datastore, "datastore"),
        ("--resource-pool", resource_pool, "host"),
    ):
        if value:
            parts = inventory.split_path(value)
            if len(parts) < 2 or parts[0] != dc or parts[1] != root:
                raise InputError(f"'{value}' is not under /{dc}/{root}", field=flag, expected=f"/{dc}/{root}/...")
            # the folder is created when missing; a datastore or pool that does not exist fails the dry run too
            if flag != "--folder" and inventory.find(vs, value) is None:
                raise InputError(
                    f"{value} does not exist on {vs.target.server}", field=flag, expected="govc ls shows it"
                )
    profile = load_profile().vsphere_templates
    return ImportRequest(
        source=source,
        os=os,
        channel=channel,
        name=name or default_name(os, channel),
        library=library or profile.library,
        folder=folder or f"/{dc}/vm/{profile.folder}",
        datastore=datastore or inventory.only_child(vs, f"/{dc}/datastore", vim.Datastore, "datastore", "--datastore"),
        resource_pool=resource_pool
        or inventory.only_child(vs, f"/{dc}/host", vim.ClusterComputeResource, "cluster", "--resource-pool"),
        snapshot=snapshot,
    )


@dataclass(frozen=True)
class Placement:
    """Where imported templates go: each left None is the profile's default or the datacenter's only one."""

    library: str | None = None
    folder: str | None = None
    datastore: str | None = None
    resource_pool: str | None = None
    datacenter: str | None = None
    snapshot: bool = True


def plan_imports(vs: VSphere, entries: list[ImportEntry], where: Placement) -> list[ImportRequest]:
    """One request per entry: the placement (library, folder, datastore, pool) is resolved once, from the first
    entry, and shared by all, so a list of OVAs lands in one place; each keeps its own OVA, OS, channel and name."""
    first = entries[0]
    shared = resolve_request(vs, source=first.source, os=first.os, channel=first.channel, name=first.name,
                             **dataclasses.asdict(where))  # fmt: skip
    return [
        replace(shared, source=e.source, os=e.os, channel=e.channel, name=e.name or default_name(e.os, e.channel))
        for e in entries
    ]
