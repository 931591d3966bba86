"""``template.customize`` (spec 4.8): a customized, tagged template made from an imported OS-2/OS-3 template.

The steps, each named in the error when it fails:

    clone (powered off) -> guestinfo (the four properties) -> power on -> wait for an IP -> customize (SSH, the
    customize role, the step-6 clean-up, seal) -> powered off -> guestinfo cleared -> snapshot 'root' (optional)
    -> mark as template -> the two tags

Beyond the spec, as security defaults: the SSH key pair exists for this run only, the customization user and its key
are removed by the seal (``keep_user`` keeps them, with a warning), and the guestinfo user data is cleared before the
VM becomes a template, so no clone inherits a way in. A template already at the target path is left alone
(``force`` replaces it); a failure at any step removes the half-made VM unless ``keep_on_error``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.paths import workspace_root
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.runs import gone, run_tag, tag_owner
from imagebuilder.customization import roles
from imagebuilder.customization.model import GUESTINFO_KEYS, Customization
from imagebuilder.release.catalog import OperatingSystem, ReleaseChannel
from imagebuilder.vsphere import inventory
from imagebuilder.vsphere.session import VSphere
from imagebuilder.vsphere.templates import (
    SNAPSHOT,
    SNAPSHOT_WARNING,
    Outcome,
    check_name,
    ensure_tags,
    need_vm,
)

#: the OS families whose templates run cloud-init and SSH (Bottlerocket has neither: its settings API configures it)
CUSTOMIZABLE = ("ubuntu", "redhat")
STEPS = (
    "clone", "guestinfo", "power on", "wait for an IP", "customize", "power off", "clear guestinfo", "snapshot",
    "mark as template", "tag",
)  # fmt: skip


#: the clone's advanced setting that names the run customizing it, ``<host>:<pid>-s<start>`` (not a guestinfo key:
#: the guest never sees it); cleared when the VM becomes a template, or when a failed run keeps it for the user
RUN_KEY = "imagebuilder.run"


def _run_marker() -> str:
    return f"{socket.gethostname()}:{run_tag()}"


def _unfinished_by(vs: VSphere, vm: Any) -> tuple[str, bool] | None:
    """The run that left ``vm`` unfinished, and whether that run is gone; None when no run of this tool claims it (a
    VM someone made, or one kept with --keep-on-error). A run on another host cannot be checked: taken as live."""
    options = vs.properties(vm, "config.extraConfig").get("config.extraConfig") or []
    marker = next((str(o.value) for o in options if o.key == RUN_KEY and o.value), None)
    if marker is None:
        return None
    host, _, tag = marker.rpartition(":")
    owner = tag_owner(tag)
    return marker, host == socket.gethostname() and owner is not None and gone(*owner)


@dataclass(frozen=True)
class CustomizeRequest:
    template: str
    os: OperatingSystem
    channel: ReleaseChannel
    name: str
    folder: str
    resource_pool: str
    snapshot: bool = True
    keep_user: bool = False
    keep_on_error: bool = False
    force: bool = False
    timeout: float = 1800

    @property
    def path(self) -> str:
        return f"{self.folder.rstrip('/')}/{self.name}"


@dataclass(frozen=True)
class CustomizeOptions:
    """How ``template.customize`` makes its template: the new name (default ``<source>-custom``), the clone's pool
    (default: the datacenter's only cluster), and what is kept, replaced and waited for."""

    name: str | None = None
    resource_pool: str | None = None
    snapshot: bool = True
    keep_user: bool = False
    keep_on_error: bool = False
    force: bool = False
    timeout: float = 1800


def plan_customize(
    vs: VSphere, *, template: str, os: OperatingSystem, channel: ReleaseChannel, options: CustomizeOptions
) -> CustomizeRequest:
    """Everything checked before anything is created: the OS, the source template, the name, the pool."""
    from pyVmomi import vim

    if os.name not in CUSTOMIZABLE:
        raise InputError(
            f"{os.name} templates cannot be customized this way (no cloud-init, no SSH)",
            field="--os",
            expected=" or ".join(CUSTOMIZABLE),
        )
    need_vm(vs, template)
    parts = inventory.split_path(template)
    if len(parts) < 3 or parts[1] != "vm":
        raise InputError(f"'{template}' is not a VM path", field="--template", expected="/<dc>/vm/[<folder>/]<name>")
    dc, folder = parts[0], "/" + "/".join(parts[:-1])
    name, resource_pool = options.name, options.resource_pool
    new_name = check_name(name) if name else f"{parts[-1]}-custom"
    if new_name == parts[-1]:
        raise InputError("the customized template needs a name of its own", field="--name", expected="a new name")
    if resource_pool:
        if inventory.datacenter_of(resource_pool, "--resource-pool") != dc or inventory.find(vs, resource_pool) is None:
            raise InputError(
                f"{resource_pool} is not a resource pool of /{dc}", field="--resource-pool", expected=f"/{dc}/host/..."
            )
        pool = resource_pool
    else:
        pool = inventory.only_child(vs, f"/{dc}/host", vim.ClusterComputeResource, "cluster", "--resource-pool")
    o = options
    return CustomizeRequest(template, os, channel, new_name, folder, pool, o.snapshot, o.keep_user, o.keep_on_error,
                            o.force, o.timeout)  # fmt: skip


def plan_text(req: CustomizeRequest, c: Customization) -> list[str]:
    user = f"user {c.user.name}: {'KEPT (--keep-user)' if req.keep_user else 'removed before templating'}"
    return [
        f"clone {req.template} to {req.path} (powered off, in {req.resource_pool})",
        "set guestinfo.metadata/userdata (gzip+base64): instance-id, DHCP on ens*, " + user,
        f"power on, wait for an IP (up to {req.timeout:.0f} s), SSH in with a key made for this run",
        f"apply: CA certificates {[n for n, _ in c.ca_certificates] or 'none'}, registries "
        f"{[r.host for r in c.registries] or 'none'}, packages {c.packages or 'none'}",
        "clean up (spec 4.8 step 6), seal, wait for power off, clear the guestinfo user data",
        *([f"snapshot '{SNAPSHOT}'"] if req.snapshot else []),
        f"mark as template, tag {req.os.name} / Kubernetes {req.channel.minor}",
    ]


def _extra_config(values: dict[str, str]) -> Any:
    from pyVmomi import vim

    return vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in values.items()])


def _guest_ip(vs: VSphere, vm: Any, timeout: float, say: Say) -> str:
    """The guest's first routable address as VMware Tools reports it (IPv6 link-local and loopback skipped)."""
    start = time.monotonic()
    while (waited := time.monotonic() - start) < timeout:
        state = vs.properties(vm, "guest.ipAddress", "runtime.powerState")
        if state["runtime.powerState"] != "poweredOn":
            raise ExternalError(f"the VM is {state['runtime.powerState']} while waiting for its IP")
        text = state["guest.ipAddress"]
        if text:
            with contextlib.suppress(ValueError):
                ip = ipaddress.ip_address(text)
                if not ip.is_link_local:
                    return str(ip)
        say(f"waiting for the VM's IP ({waited:.0f} s)")
        time.sleep(2)
    raise ExternalError(
        f"the VM reported no IP within {timeout:.0f} s",
        hint="the template needs VMware Tools and DHCP on its network; raise --timeout",
    )


def _power_state(vs: VSphere, vm: Any) -> str:
    return str(vs.properties(vm, "runtime.powerState")["runtime.powerState"])


def _wait_powered_off(vs: VSphere, vm: Any, out: Outcome, timeout: float, say: Say) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if _power_state(vs, vm) == "poweredOff":
            out.did("powered off by its seal")
            return
        say(f"waiting for the VM to power itself off ({time.monotonic() - start:.0f} s)")
        time.sleep(2)
    vs.wait(vm.PowerOffVM_Task(), "power off")
    out.did("powered off")
    out.warnings.append(f"the VM did not power itself off within {timeout:.0f} s after its seal; it was powered off")


def _remove(vs: VSphere, vm: Any) -> None:
    if _power_state(vs, vm) != "poweredOff":
        vs.wait(vm.PowerOffVM_Task(), "power off")
    vs.wait(vm.Destroy_Task(), "delete")


@contextlib.contextmanager
def _steps(vs: VSphere, req: CustomizeRequest, made: list[Any]) -> Iterator[list[str]]:
    """Names the failing step; removes the VM this run made (unless keep_on_error), however the run ends."""
    current = [STEPS[0]]
    try:
        yield current
    except BaseException as exc:
        kept = ""
        if made:
            if req.keep_on_error:
                with contextlib.suppress(Exception):  # the user's now: no later run may take it for a dead run's
                    vs.wait(made[0].ReconfigVM_Task(spec=_extra_config({RUN_KEY: ""})), "release the VM")
                kept = f"; the VM is kept at {req.path} (--keep-on-error)"
            else:
                with contextlib.suppress(Exception):
                    _remove(vs, made[0])
                kept = f"; the half-made VM {req.path} was removed"
        if isinstance(exc, ExternalError):
            raise ExternalError(f"step '{current[0]}' failed: {exc.message}{kept}", hint=exc.hint) from None
        raise


def customize_template(vs: VSphere, req: CustomizeRequest, customization: Customization, say: Say = silent) -> Outcome:
    from pyVmomi import vim

    out = Outcome(req.path)
    folder = inventory.need(vs, req.folder, "folder")
    existing = inventory.vms_in(vs, folder).get(req.name)
    if existing is not None:
        is_template = bool(vs.properties(existing, "config.template")["config.template"])
        left = None if is_template else _unfinished_by(vs, existing)
        if left is not None and not left[1] and not req.force:
            raise ExternalError(
                f"{req.path} is being customized by run {left[0]}",
                hint="wait for that run to finish; if it is gone (another build host's run), rerun with --force",
            )
        if left is not None and left[1]:
            # a run killed before it could clean up (no handler runs on SIGKILL): its VM, guestinfo user data included
            _remove(vs, existing)
            out.did(f"removed the VM {req.path} that run {left[0]}, now gone, left unfinished")
        elif not req.force:
            if is_template:
                out.kept.append(f"template {req.path} exists; left alone (--force replaces it)")
                return out
            raise ExternalError(
                f"{req.path} exists and is a VM, not a template (kept by a failed run?)",
                hint="delete it (govc vm.destroy) or rerun with --force",
            )
        else:
            _remove(vs, existing)
            out.did(f"removed the existing {'template' if is_template else 'VM'} {req.path} (--force)")
    source = need_vm(vs, req.template)
    pool = inventory.resource_pool(vs, req.resource_pool)
    if req.keep_user:
        out.warnings.append(roles.KEEP_USER_WARNING)
    made: list[Any] = []
    log = roles.log_path(workspace_root(), req.name)
    with roles.run(customization, keep_user=req.keep_user) as run, _steps(vs, req, made) as step:
        # the clone names this run from its first moment: killed at any later step, the next run knows it as a dead
        # run's and removes it (guestinfo and all) instead of asking for --force
        config = _extra_config({RUN_KEY: _run_marker()})
        spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(pool=pool), powerOn=False, template=False, config=config)
        say(f"cloning {req.template}")
        vm = vs.wait(source.CloneVM_Task(folder=folder, name=req.name, spec=spec), f"clone to {req.path}")
        made.append(vm)
        out.did(f"cloned {req.template}")
        step[0] = "guestinfo"
        # the mark again with the user data (a server that drops a clone spec's settings still gets it before them)
        marked = {**run.documents.guestinfo(), RUN_KEY: _run_marker()}
        vs.wait(vm.ReconfigVM_Task(spec=_extra_config(marked)), "set guestinfo")
        out.did("set the four guestinfo properties")
        step[0] = "power on"
        vs.wait(vm.PowerOnVM_Task(), "power on")
        step[0] = "wait for an IP"
        ip = _guest_ip(vs, vm, req.timeout, say)
        out.did(f"powered on; IP {ip}")
        step[0] = "customize"

        def gone() -> str | None:
            state = _power_state(vs, vm)
            return None if state == "poweredOn" else f"the VM is {state}"

        roles.apply(run, ip, log=log, timeout=req.timeout, say=say, gone=gone)
        out.did(f"Ansible log: {log}")
        out.did("customized, cleaned up and sealed" + ("" if req.keep_user else f" ({run.user} removed)"))
        step[0] = "power off"
        _wait_powered_off(vs, vm, out, 600, say)
        step[0] = "clear guestinfo"
        vs.wait(
            vm.ReconfigVM_Task(spec=_extra_config(dict.fromkeys((*GUESTINFO_KEYS, RUN_KEY), ""))), "clear guestinfo"
        )
        out.did("cleared the guestinfo user data")
        if req.snapshot:
            step[0] = "snapshot"
            task = vm.CreateSnapshot_Task(name=SNAPSHOT, description="image-builder", memory=False, quiesce=False)
            vs.wait(task, f"snapshot of {req.path}")
            out.did(f"snapshot '{SNAPSHOT}'")
            out.warnings.append(SNAPSHOT_WARNING)
        step[0] = "mark as template"
        vm.MarkAsTemplate()
        out.did("marked as template")
        step[0] = "tag"
        ensure_tags(vs, vm, req.os, req.channel, out, attached=[])
    return out
