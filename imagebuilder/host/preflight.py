"""Preflight: check the build host before anything boots (spec 4.3, 8).

A 40-minute build that dies on a missing tool or a full disk is the failure this prevents. Facts are gathered
once from the real host (:meth:`HostFacts.gather`); the checks are pure functions of the facts, so each failure
and its fix is testable, and every failure names the fix. ``--skip-check NAME`` skips named checks only.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from imagebuilder.builder.disk_need import GIB, DiskNeed
from imagebuilder.builder.packer_plugins import PackerInfo, PluginCheck, check_plugins, requirements_for
from imagebuilder.core.arch import ARCH_NAMES
from imagebuilder.core.arch import ARCHES as MACHINES
from imagebuilder.core.errors import ExternalError, ImageBuilderError
from imagebuilder.core.hostinfo import KvmStatus, check_skips, kvm_status, machine, os_release, tool_version
from imagebuilder.core.paths import existing_parent, workspace_root
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.untrusted import redact_url
from imagebuilder.host.config import load_host_config
from imagebuilder.providers import registry
from imagebuilder.release.catalog import BuildPair, load_catalog

Status = Literal["ok", "warn", "fail", "skipped"]
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: how each tool prints its version (empty: the tool has none; its path is shown)
VERSION_ARGS: dict[str, tuple[str, ...]] = {"packer": ("version",), "ssh-keygen": ()}


@dataclass(frozen=True)
class HostFacts:
    os_release: dict[str, str]
    machine: str
    cpus: int
    memory_bytes: int
    disk_path: Path
    disk_free_bytes: int
    tools: dict[str, str | None]
    kvm: KvmStatus | None
    ssh_config: str
    env: dict[str, str] = field(default_factory=dict)
    #: the Packer a build runs and its plugins' states, or why they could not be read
    packer: PluginCheck | str | None = None
    #: what the build writes (None: no build is planned, as for the preflight command), and the free space of its
    #: output's filesystem when that is not the workspace's
    need: DiskNeed | None = None
    output_free_bytes: int | None = None

    @classmethod
    def gather(
        cls,
        pair: BuildPair,
        *,
        home: Path | None = None,
        workspace: Path | None = None,
        packer: str | None = None,
        plugins: Path | None = None,
        checked: PluginCheck | None = None,
        need: DiskNeed | None = None,
        target: str = ARCH_NAMES[0],
    ) -> HostFacts:
        cfg = load_host_config()
        qemu = pair.provider.name in cfg.qemu_providers
        # the system emulator of the image's architecture (a build VM of another one, the boot test) in place of
        # this host's
        emulator = MACHINES[target].qemu
        tools = cfg.tools.all + ([emulator if t.startswith("qemu-system-") else t for t in cfg.tools.qemu]
                                 if qemu else [])  # fmt: skip
        disk = existing_parent(workspace or workspace_root())
        ssh_config = (home or Path.home()) / ".ssh" / "config"
        return cls(
            os_release=os_release(),
            machine=machine(),
            cpus=os.cpu_count() or 0,
            memory_bytes=_mem_total(),
            disk_path=disk,
            disk_free_bytes=shutil.disk_usage(disk).free,
            tools={t: tool_version(t, VERSION_ARGS.get(t, ("--version",))) for t in tools},
            kvm=kvm_status() if qemu else None,
            ssh_config=ssh_config.read_text() if ssh_config.is_file() else "",
            env={k: v for k in PROXY_VARS for v in [os.environ.get(k) or os.environ.get(k.lower())] if v},
            packer=checked or _packer_facts(pair, packer, plugins),
            need=need,
            output_free_bytes=_output_free(need, disk),
        )


def _output_free(need: DiskNeed | None, workspace: Path) -> int | None:
    if need is None:
        return None
    output = existing_parent(need.output)
    if output.stat().st_dev == workspace.stat().st_dev:
        return None
    return shutil.disk_usage(output).free


def _packer_facts(pair: BuildPair, packer: str | None, plugins: Path | None) -> PluginCheck | str | None:
    """The Packer and plugin states of the pair's builds (None: no Packer to ask; a str: why it could not)."""
    if packer is None and shutil.which("packer") is None:
        return None  # the tools check names the missing Packer
    try:
        info = PackerInfo.detect(packer)
        return check_plugins(info, requirements_for(registry.get(pair.provider.name).builders()), binaries=plugins)
    except ImageBuilderError as exc:
        return str(exc).splitlines()[0]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


def _mem_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]{1,9}", text)[:3])


def check_host_os(pair: BuildPair, facts: HostFacts) -> Check:
    wanted = load_host_config().host_os.get(pair.os.name, {})
    os_id, version = facts.os_release.get("ID", "unknown"), facts.os_release.get("VERSION_ID", "")
    shown = facts.os_release.get("PRETTY_NAME", f"{os_id} {version}")
    need = ", ".join(f"{k} {v}+" for k, v in wanted.items())
    if os_id in wanted and _version_tuple(version) >= _version_tuple(wanted[os_id]):
        return Check("host-os", "ok", f"{shown} (needs {need} for {pair.os.name} images)")
    return Check(
        "host-os",
        "fail",
        f"{shown} is not a supported host for {pair.os.name} images (needs {need}, spec 8)",
        f"build on a {need} host, or --skip-check host-os to try anyway",
    )


def run_checks(
    pair: BuildPair,
    facts: HostFacts,
    *,
    skip: tuple[str, ...] = (),
    min_disk_gb: int | None = None,
    target: str = ARCH_NAMES[0],
) -> list[Check]:
    """Every check, in a fixed order; skipped ones are reported as skipped. ``target``: the image's architecture."""
    check_skips(skip)
    cfg = load_host_config()
    req = cfg.requirements
    checks: list[Check] = [check_host_os(pair, facts)]
    checks.append(host_arch_check(facts, target))

    checks.append(check_disk(facts, min_disk_gb, req.min_disk_gb))

    cpu_ok = facts.cpus >= req.min_cpus
    checks.append(
        Check(
            "cpus",
            "ok" if cpu_ok else "fail",
            f"{facts.cpus} (needs {req.min_cpus})",
            None if cpu_ok else f"give the host at least {req.min_cpus} vCPUs",
        )
    )

    mem_gb = facts.memory_bytes / GIB
    mem_ok = mem_gb >= req.min_memory_gb - req.memory_tolerance_gb
    checks.append(
        Check(
            "memory",
            "ok" if mem_ok else "fail",
            f"{mem_gb:.1f} GiB (needs {req.min_memory_gb:g} GB)",
            None if mem_ok else f"give the host at least {req.min_memory_gb:g} GB of memory",
        )
    )

    missing = [t for t, v in facts.tools.items() if v is None]
    found = ", ".join(f"{t} ({v})" if v else t for t, v in facts.tools.items() if v is not None)
    checks.append(
        Check(
            "tools",
            "fail" if missing else "ok",
            f"missing: {', '.join(missing)}" if missing else found,
            "run ./scripts/setup.sh (or image-builder host.prepare) to install them" if missing else None,
        )
    )

    checks.append(check_packer(facts))

    if facts.kvm is None:
        checks.append(Check("kvm", "ok", f"not needed for {pair.provider.name} builds"))
    elif not MACHINES[target].native:
        checks.append(Check("kvm", "ok", f"not used: {target} guests are emulated here (TCG)"))
    elif facts.kvm.usable:
        checks.append(Check("kvm", "ok", facts.kvm.reason))
    else:
        checks.append(
            Check(
                "kvm",
                "warn",
                f"{facts.kvm.reason}; QEMU falls back to TCG (software emulation, many times slower)",
                "enable hardware virtualization, then run image-builder host.prepare"
                " (adds the user to group kvm, sets /dev/kvm 0666 root:kvm)",
            )
        )

    # Spec 4.3 wants these lines because Packer's SSH proxy for Ansible offers only an ssh-rsa host key. Our
    # templates pass the same options to Ansible, so their absence warns (other tools need them) but never blocks.
    lines = [ln for ln in cfg.ssh_client_lines if ln not in facts.ssh_config.splitlines()]
    checks.append(
        Check(
            "ssh-rsa",
            "warn" if lines else "ok",
            f"~/.ssh/config lacks: {'; '.join(lines)} (image-builder's own builds pass them to Ansible)"
            if lines
            else "~/.ssh/config allows ssh-rsa (spec 4.3)",
            "run image-builder host.prepare (adds the lines once)" if lines else None,
        )
    )

    proxies = ", ".join(f"{k}={redact_url(v)}" for k, v in facts.env.items())
    checks.append(Check("proxy", "ok", proxies or "no proxy variables set (direct connections)"))

    return [Check(c.name, "skipped", c.detail) if c.name in skip else c for c in checks]


def host_arch_check(facts: HostFacts, target: str) -> Check:
    """An AMD64 host, and for an image of another architecture its programs run here: the chroot engine runs the
    image's package scripts, Ansible's modules and containerd through qemu-user (binfmt_misc, the F flag)."""
    if facts.machine not in ("x86_64", "amd64"):
        return Check("arch", "fail", facts.machine, "use an AMD64 (x86_64) host")
    image = MACHINES[target]
    if image.native:
        return Check("arch", "ok", facts.machine)
    problem = image.emulation_problem()
    if problem:
        return Check("arch", "fail", f"{facts.machine}; {target} images: {problem}",
                     f"install Debian's qemu-user-static and register {image.binfmt} with binfmt_misc"
                     f" (./scripts/setup.sh does both)")  # fmt: skip
    return Check("arch", "ok", f"{facts.machine}; {target} programs run by qemu-user (binfmt_misc {image.binfmt})")


def check_disk(facts: HostFacts, min_disk_gb: int | None, host_gb: int) -> Check:
    """Room for the build's work: what it writes (:func:`imagebuilder.builder.disk_need.disk_need`), or
    ``--min-disk-gb`` when given. Spec 8's size of a build host (``host_gb``) is advice: below it, with no build
    planned, a warning."""
    where = facts.disk_path
    free = facts.disk_free_bytes
    fix = (f"free space under {where}, point IMAGE_BUILDER_WORKSPACE at a larger disk, or a smaller --disk-gb"
           if min_disk_gb is None else f"free space under {where}, or lower --min-disk-gb")  # fmt: skip
    if min_disk_gb is not None or facts.need is None:
        gib = min_disk_gb if min_disk_gb is not None else host_gb
        ok = free >= gib * GIB
        detail = f"{free / GIB:.1f} GiB free under {where} (needs {gib} GiB"
        if min_disk_gb is None:  # no build planned: spec 8's figure, advice only
            detail += ": spec 8's build host; a build checks what it needs itself)"
            return Check("disk", "ok" if ok else "warn", detail, None if ok else "a build host of spec 8 size")
        return Check("disk", "ok" if ok else "fail", detail + ")", None if ok else fix)
    need = facts.need
    here = need.on(where) if facts.output_free_bytes is not None else need.total
    detail = f"{free / GIB:.1f} GiB free under {where}; this build {need.describe()}"
    if free < here:
        return Check("disk", "fail", detail + f": {here / GIB:.1f} GiB of it under {where}", fix)
    if facts.output_free_bytes is not None and facts.output_free_bytes < need.on(need.output):
        there = need.on(need.output)
        return Check(
            "disk",
            "fail",
            detail + f"; {facts.output_free_bytes / GIB:.1f} GiB free under {need.output},"
            f" which needs {there / GIB:.1f} GiB",
            f"free space under {need.output}, or another --output-dir",
        )
    return Check("disk", "ok", detail)


def check_packer(facts: HostFacts) -> Check:
    """Packer's version and each plugin its templates require: installed, to install, or missing (with the fix)."""
    if facts.packer is None:
        return Check("packer", "fail", "no packer on PATH", "run ./scripts/setup.sh, or pass --packer PATH")
    if isinstance(facts.packer, str):
        return Check("packer", "fail", facts.packer, "pass --packer PATH to a working Packer")
    lines = facts.packer.lines()
    detail = lines[0] + "".join(f"\n           {line.strip()}" for line in lines[1:])
    missing = facts.packer.missing
    if missing:
        names = ", ".join(s.requirement.name for s in missing)
        return Check("packer", "fail", detail, f"install {names} (packer init online, or --packer-plugins DIR offline)")
    todo = [s for s in facts.packer.states if s.action in ("install from folder", "packer init")]
    if todo:
        return Check("packer", "warn", detail, "the build installs them first (see above)")
    return Check("packer", "ok", detail)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skipped": "skip"}


def format_checks(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{MARK[c.status]}] {c.name:<8} {c.detail}")
        if c.fix and c.status in ("fail", "warn"):
            lines.append(f"           fix: {c.fix}")
    return "\n".join(lines)


def require(
    os_name: str,
    hypervisor: str,
    skip: list[str] | tuple[str, ...] = (),
    min_disk_gb: int | None = None,
    say: Say = silent,
    *,
    packer: str | None = None,
    plugins: Path | None = None,
    checked: PluginCheck | None = None,
    need: DiskNeed | None = None,
    arch: str = ARCH_NAMES[0],
) -> list[Check]:
    """The gate before a build: gather, check, report; :class:`ExternalError` when a check fails. ``checked`` is
    the build's own Packer check (:func:`imagebuilder.builder.packer.prepare_packer`), for the plugins its template
    needs; ``arch``: the image's architecture (a pair not built for it: exit 2, naming why)."""
    catalog = load_catalog()
    pair = catalog.build_pair(catalog.os(os_name), catalog.provider(hypervisor))
    pair.check_built_for(arch)
    facts = HostFacts.gather(pair, packer=packer, plugins=plugins, checked=checked, need=need, target=arch)
    checks = run_checks(pair, facts, skip=tuple(skip), min_disk_gb=min_disk_gb, target=arch)
    say(format_checks(checks))
    bad = failed(checks)
    if bad:
        raise ExternalError(
            f"preflight failed: {', '.join(c.name for c in bad)}",
            hint="apply the fixes above, or --skip-check NAME for a check you accept failing",
        )
    return checks
