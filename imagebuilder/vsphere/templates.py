"""Templates (spec 3, 4.6, 7): import an OVA as a tagged template, tag a self-built one, validate the tags.

``import_template`` walks the preparation order of spec 3 and converges at every step, so a rerun after an
interruption picks up where the last run stopped and never creates anything twice:

    folder -> library -> library item (+ upload) -> deployed VM -> disk resize (OS-1) -> snapshot ``root``
    -> mark as template -> the two tags

Template names are unique per folder (spec 8): a template already at the target path is checked (its tags are made
right) and otherwise left alone. The imported VM is never powered on (spec 7.4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imagebuilder.errors import ExternalError, InputError
from imagebuilder.model import OperatingSystem, ReleaseChannel
from imagebuilder.profile import load_profile
from imagebuilder.vsphere import inventory
from imagebuilder.vsphere.library import Library, ProgressFactory
from imagebuilder.vsphere.session import VSphere
from imagebuilder.vsphere.tags import Tagging, expected_tags

SNAPSHOT = "root"
SNAPSHOT_WARNING = "a snapshotted template cannot have its cluster VM disk size customised (spec 3, 8)"


def default_name(os: OperatingSystem, channel: ReleaseChannel) -> str:
    """The template (and library item) name when ``--name`` is not given: ``ubuntu-kubernetes-1-24-eks-5``."""
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


def _wait(task: Any, what: str) -> None:
    from pyVim.task import WaitForTask

    try:
        WaitForTask(task)
    except Exception as exc:  # a task fault: the vmodl fault is what the user needs to see
        raise ExternalError(f"{what} failed: {getattr(exc, 'msg', '') or exc}") from None


def _is_template(vm: Any) -> bool:
    return bool(vm.config and vm.config.template)


def import_template(vs: VSphere, req: ImportRequest, progress: ProgressFactory | None = None) -> Outcome:
    from pyVmomi import vim

    out = Outcome(req.path)
    created: list[str] = []
    folder = inventory.ensure_folder(vs, req.folder, created)
    out.done += [f"created folder {p}" for p in created]
    vm = inventory.find(vs, req.path)
    if vm is not None and not isinstance(vm, vim.VirtualMachine):
        raise ExternalError(f"{req.path} exists and is not a virtual machine", hint="choose another --name or --folder")
    if vm is not None and _is_template(vm):
        out.kept.append(f"template {req.path} exists; left alone (names are unique per folder)")
        ensure_tags(vs, vm, req.os, req.channel, out)
        return out
    if vm is None:
        ds = inventory.need(vs, req.datastore, "datastore", "--datastore")
        pool = inventory.resource_pool(vs, req.resource_pool)
        lib = Library(vs.rest)
        lib_created: list[str] = []
        library_id = lib.ensure(req.library, inventory.moid(ds), lib_created)
        out.done += [f"created {c}" for c in lib_created]
        item = lib.find_item(library_id, req.name)
        if item is None:
            item = lib.create_item(library_id, req.name, f"{req.os.name} Kubernetes {req.channel.minor}")
            out.done.append(f"created library item {req.name}")
        if lib.item_files(item):
            out.kept.append(f"library item {req.name} already holds the OVA")
        else:
            lib.upload(item, req.source, progress)
            out.done.append(
                f"{'pulled' if '://' in req.source else 'uploaded'} {req.source} into {req.library}/{req.name}"
            )
        moid = lib.deploy(item, req.name, inventory.moid(pool), inventory.moid(folder), inventory.moid(ds))
        vm = vim.VirtualMachine(moid, vs.si._stub)
        out.done.append(f"deployed {req.path}")
    else:
        out.kept.append(f"VM {req.path} exists (an earlier run stopped before it became a template); continuing")
    if vm.runtime.powerState != "poweredOff":
        raise ExternalError(
            f"{req.path} is powered on; an imported OVA must not be powered on (spec 7.4)",
            hint="power it off, or delete it and rerun the import",
        )
    resize_disk(vm, req, out)
    if req.snapshot:
        if _has_snapshot(vm, SNAPSHOT):
            out.kept.append(f"snapshot '{SNAPSHOT}' exists")
        else:
            _wait(
                vm.CreateSnapshot_Task(name=SNAPSHOT, description="image-builder", memory=False, quiesce=False),
                f"snapshot of {req.path}",
            )
            out.done.append(f"snapshot '{SNAPSHOT}'")
        out.warnings.append(SNAPSHOT_WARNING)
    vm.MarkAsTemplate()
    out.done.append("marked as template")
    ensure_tags(vs, vm, req.os, req.channel, out)
    return out


def _has_snapshot(vm: Any, name: str) -> bool:
    def walk(trees: Any) -> bool:
        return any(t.name == name or walk(t.childSnapshotList) for t in trees or [])

    # an unset property is absent from the answer, which pyvmomi reports as AttributeError
    info = getattr(vm, "snapshot", None)
    return info is not None and walk(info.rootSnapshotList)


def resize_disk(vm: Any, req: ImportRequest, out: Outcome) -> None:
    from pyVmomi import vim

    disk = req.os.template_disk(req.channel.minor)
    if disk is None:
        return
    devices = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)]
    found = next((d for d in devices if d.deviceInfo and d.deviceInfo.label == disk.label), None)
    if found is None:
        labels = ", ".join(d.deviceInfo.label for d in devices if d.deviceInfo) or "none"
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
    _wait(vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(deviceChange=[change])), f"resizing {disk.label} of {req.path}")
    out.done.append(f"resized {disk.label} to {disk.size_gb}G")


def ensure_tags(vs: VSphere, vm: Any, os: OperatingSystem, channel: ReleaseChannel, out: Outcome) -> None:
    """Attach the two expected tags; a wrong tag in the same (single-cardinality) category is replaced."""
    tagging = Tagging(vs.rest)
    moid = inventory.moid(vm)
    have = tagging.attached(moid)
    for want in expected_tags(os, channel):
        same_category = [t for t in have if t.category == want.category]
        if want in same_category:
            out.kept.append(f"tag {want.name}")
            continue
        for wrong in same_category:
            tagging.detach(wrong, moid)
            out.done.append(f"removed wrong tag {wrong.name}")
        tagging.attach(want, moid)
        out.done.append(f"tagged {want.name}")
    out.done += [f"created {c}" for c in tagging.created]


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
    have = Tagging(vs.rest).attached(inventory.moid(vm))
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
    ensure_tags(vs, need_vm(vs, path), os, channel, out)
    return out


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
