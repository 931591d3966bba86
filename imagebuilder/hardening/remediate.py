"""The profile's own remediation, as OpenSCAP generates it from the content and the node's tailoring (an Ansible
playbook), made fit to run against an image mounted on the build host.

A chroot build's image is not a running system: the kernel under it, its network stack and its service manager
are the build host's. Remediation written for a booted machine also applies what it configures to the running
system: ``sysctl -p``, ``nft add rule``, ``systemctl start``, ``mount -o remount``. Run as it is, it would harden,
or lock out, the build host. So before it runs (:func:`for_an_image`):

- ``sysctl`` tasks write their file and do not reload (the image applies it at boot);
- service tasks enable, disable and mask units and never start or stop them;
- ``mount`` tasks write ``/etc/fstab`` and never mount;
- a command or shell task whose program acts on the running kernel or its services (:data:`HOST_PROGRAMS`) is
  dropped, and named in the build log: what it applies at run time, the image applies at boot from the files the
  other tasks wrote.

The chroot build also runs the playbook with ``/proc/sys`` and ``/sys`` read-only (:mod:`.apply`), so a task this
misses fails rather than changes the host."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import atomic_write, parse_yaml_documents, sha256_file
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.render import ROOT
from imagebuilder.core.untrusted import read_bytes
from imagebuilder.hardening.content import DATASTREAM_LIMIT, Content
from imagebuilder.hardening.model import RULE_PREFIX, HardeningRequest
from imagebuilder.hardening.tailoring import Tailoring

#: programs that act on the running kernel, its network stack, its devices or its services, not on files
HOST_PROGRAMS = frozenset({
    "nft", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "ebtables", "ufw", "firewall-cmd",
    "sysctl", "modprobe", "rmmod", "insmod", "swapoff", "swapon", "mount", "umount", "nmcli", "auditctl",
    "augenrules", "apparmor_parser", "aa-enforce", "aa-complain", "aa-disable", "setenforce", "hostnamectl",
    "timedatectl", "loginctl", "service", "reboot", "shutdown", "ip", "tc", "udevadm", "rfkill", "echo_to_proc",
})  # fmt: skip
#: what ``systemctl`` may still be asked in an image: everything that reads or changes unit files only
SYSTEMCTL_SAFE = frozenset(
    {
        "enable",
        "disable",
        "mask",
        "unmask",
        "daemon-reload",
        "is-enabled",
        "list-unit-files",
        "list-units",
        "show",
        "cat",
        "status",
        "is-active",
        "preset",
        "set-default",
        "get-default",
    }
)
_SERVICE_MODULES = frozenset({"ansible.builtin.systemd", "ansible.builtin.systemd_service", "ansible.builtin.service",
                              "systemd", "systemd_service", "service"})  # fmt: skip
_SYSCTL_MODULES = frozenset({"ansible.posix.sysctl", "sysctl"})
_MOUNT_MODULES = frozenset({"ansible.posix.mount", "mount"})
_COMMAND_MODULES = frozenset({"ansible.builtin.command", "ansible.builtin.shell", "command", "shell",
                              "ansible.builtin.raw", "raw"})  # fmt: skip
#: a shell word that starts a command: the first word, and those after ``|``, ``;``, ``&&``, ``||``, ``$(``, `` ` ``
_COMMAND_STARTS = re.compile(r"(?:^|[|;&`(]|\$\(|\bthen\b|\bdo\b|\belse\b)\s*"
                             r"(?:(?:sudo|env|exec|nohup|xargs|time|command|nice)\s+(?:-\S+\s+)*)*"
                             r"(?:[A-Za-z_][A-Za-z0-9_]*=[^\s$`(]*\s+)*([^\s|;&()`'\"]+)")  # fmt: skip


#: the remediation's first task: the facts its conditions read
GATHER = {
    "name": "Gather the facts the remediation reads (virtualization, mounts), not the environment",
    "ansible.builtin.setup": {"gather_subset": ["min", "hardware", "virtual", "!env"]},
}
#: what ``sshd -t``, which validates each sshd_config change, needs and a node image lacks: a host key (they are
#: made at first boot) and its privilege separation folder. Both go to /run, a tmpfs in the chroot and in Packer's
#: running build VM alike (its /tmp is the image's disk), never into the image
SSHD_TEST_KEY = "/run/.image-builder-sshd-test-key"
SSHD_KEY_TASK = {"name": "Give sshd -t a throwaway host key and /run/sshd, in the tmpfs /run (not the image)",
                 "ansible.builtin.shell": {"cmd": "if [ -x /usr/bin/ssh-keygen ]; then\n"
                                                  f"  [ -e {SSHD_TEST_KEY} ] || ssh-keygen -q -t ed25519 -N '' -f"
                                                  f" {SSHD_TEST_KEY}\n"
                                                  "  mkdir -p /run/sshd && chown root:root /run/sshd"
                                                  " && chmod 0755 /run/sshd\nfi\n",
                                           "executable": "/bin/sh"},
                 "changed_when": False}  # fmt: skip
_SSHD_TEST = re.compile(r"\bsshd\s+-t\b")


@dataclass(frozen=True)
class Remediation:
    path: Path
    sha256: str
    tasks: int
    #: the tasks left out, each as ``name: why``
    dropped: tuple[str, ...] = field(default_factory=tuple)


#: the keys of a task that hold tasks of their own
_BLOCK_PARTS = ("block", "rescue", "always")


def _each_task(tasks: Any) -> Iterator[dict[str, Any]]:
    """Every task of ``tasks``, depth first: each block, then the tasks of its parts."""
    for task in tasks if isinstance(tasks, list) else ():
        if isinstance(task, dict):
            yield task
            for part in _BLOCK_PARTS:
                yield from _each_task(task.get(part))


def _programs(command: str) -> set[str]:
    """The programs a command line runs (the base names of the words that start its commands)."""
    return {Path(m.group(1)).name for m in _COMMAND_STARTS.finditer(command)}


def _command_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if isinstance(value.get("cmd"), str):
            return str(value["cmd"])
        if isinstance(value.get("argv"), list):
            return " ".join(str(a) for a in value["argv"])
    return str(value)


#: a systemd unit's name (``named.service``, ``getty@tty1.service``)
_UNIT = re.compile(r"[A-Za-z0-9@_.:\\-]{1,200}")
#: a Jinja expression standing for the whole name (``{{ item }}``)
_EXPRESSION = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.]*(?:\[[^\]{}]*\])?)\s*\}\}")


def _systemctl_offline(module: dict[str, Any]) -> dict[str, Any] | None:
    """A service module's ``enabled`` and ``masked`` as systemctl's offline verbs in a shell task (None: it asks
    for nothing but a running service manager's work). A unit to disable that is not there is already disabled."""
    name = module.get("name") or module.get("unit")
    verbs = []
    if module.get("enabled") is not None:
        verbs.append("enable" if _true(module["enabled"]) else "disable")
    if module.get("masked") is not None:
        verbs.append("mask" if _true(module["masked"]) else "unmask")
    if not verbs or not isinstance(name, str):
        return None
    expression = _EXPRESSION.fullmatch(name.strip())
    if expression:
        unit = "{{ (" + expression.group(1) + ") | quote }}"
    elif _UNIT.fullmatch(name):
        unit = shlex.quote(name)  # a unit name may hold a backslash escape (\x2d)
    else:
        return None
    lines = ["set -e", f"unit={unit}"]
    for verb in verbs:
        if verb in ("disable", "unmask"):  # nothing to do for a unit that is not there
            lines.append(f'if systemctl -q list-unit-files "$unit" >/dev/null 2>&1; then systemctl {verb} "$unit"; fi')
        else:
            lines.append(f'systemctl {verb} "$unit"')
    return {"cmd": "\n".join(lines) + "\n", "executable": "/bin/sh"}


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("yes", "true", "on", "1")


def _task_for_an_image(task: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """``task`` made safe for an image (None: left out), and why it changed (None: unchanged)."""
    for key in list(task):
        value = task[key]
        if isinstance(value, dict) and isinstance(value.get("validate"), str) and _SSHD_TEST.search(value["validate"]):
            return {
                **task,
                key: {**value, "validate": f"{value['validate']} -h {SSHD_TEST_KEY}"},
            }, "sshd -t: a test key"
        if key in _SYSCTL_MODULES and isinstance(value, dict):
            if value.get("reload") is False and not value.get("sysctl_set"):
                return task, None
            return {**task, key: {**value, "reload": False, "sysctl_set": False}}, "sysctl: the file only"
        if key in _SERVICE_MODULES and isinstance(value, dict):
            # no service manager runs in an image: nothing to start, stop or reload, and the modules ask the
            # (absent) manager about the unit first; systemctl's offline verbs change the unit files only
            offline = _systemctl_offline(value)
            if offline is None:
                return None, f"{key} {value.get('name', '')}: acts on the running service manager only"
            rest = {k: v for k, v in task.items() if k != key}
            return {**rest, "ansible.builtin.shell": offline, "changed_when": True}, "service: systemctl, offline"
        if key in _MOUNT_MODULES and isinstance(value, dict) and value.get("state") in ("mounted", "remounted"):
            return {**task, key: {**value, "state": "present"}}, "mount: /etc/fstab only"
        if key in _COMMAND_MODULES:
            text = _command_text(value)
            programs = _programs(text)
            host = sorted(programs & HOST_PROGRAMS)
            verbs = re.findall(r"\bsystemctl\s+(?:-\S+\s+)*([a-z-]+)", text)
            unsafe_verbs = sorted(set(verbs) - SYSTEMCTL_SAFE)
            if host or unsafe_verbs:
                what = ", ".join(host + [f"systemctl {v}" for v in unsafe_verbs])
                return None, f"runs {what} on the running system"
    return task, None


def for_an_image(plays: list[Any]) -> tuple[list[Any], list[str]]:
    """``plays`` with every task made safe for an image mounted on the build host, and what was left out."""
    dropped: list[str] = []

    def tasks(items: Any) -> Any:
        if not isinstance(items, list):
            return items
        out = []
        for task in items:
            if not isinstance(task, dict):
                out.append(task)
                continue
            task = {k: tasks(v) if k in _BLOCK_PARTS else v for k, v in task.items()}
            if "block" in task:
                out.append(task)
                continue
            kept, why = _task_for_an_image(task)
            if kept is None:
                dropped.append(f"{task.get('name', '(unnamed task)')}: {why}")
            else:
                out.append(kept)
        return out

    result = []
    for play in plays:
        if isinstance(play, dict):
            play = {k: tasks(v) if k in ("tasks", "pre_tasks", "post_tasks", "handlers") else v
                    for k, v in play.items()}  # fmt: skip
        result.append(play)
    return result, dropped


_PACKAGE_MODULES = frozenset({"ansible.builtin.package", "ansible.builtin.apt", "ansible.builtin.dnf",
                              "ansible.builtin.yum", "package", "apt", "dnf", "yum"})  # fmt: skip
_PACKAGE_FACTS = frozenset({"ansible.builtin.package_facts", "package_facts"})
_PACKAGE_PROGRAMS = frozenset({"apt", "apt-get", "aptitude", "dpkg", "dnf", "yum", "rpm"})


def _changes_packages(task: Any) -> bool:
    """Whether ``task`` (or a task of its block) may install or remove a package."""
    for one in _each_task([task]):
        if _PACKAGE_MODULES & set(one):
            return True
        if any(_programs(_command_text(one[k])) & _PACKAGE_PROGRAMS for k in _COMMAND_MODULES & set(one)):
            return True
    return False


def fewer_package_facts(tasks: list[Any]) -> tuple[list[Any], int]:
    """``tasks`` without the top-level, unconditional package-facts gatherings that follow another with no package
    task between them (the content gathers them before each rule: 190 times, a second each in a chroot), and how
    many were left out. What they would gather is what the last one gathered."""
    out, fresh, dropped = [], False, 0
    for task in tasks:
        is_facts = isinstance(task, dict) and bool(_PACKAGE_FACTS & set(task)) and "when" not in task
        if is_facts and fresh:
            dropped += 1
            continue
        out.append(task)
        if is_facts:
            fresh = True
        elif _changes_packages(task):
            fresh = False
    return out, dropped


_PROFILE_BLOCK = r"<(?:[\w.-]+:)?Profile\s[^>]*\bid=\"{id}\"[^>]*>(.*?)</(?:[\w.-]+:)?Profile>"
_SELECTED = re.compile(rb"<(?:[\w.-]+:)?select\s+idref=\"" + re.escape(RULE_PREFIX.encode())
                       + rb"([a-z0-9_.-]+)\"\s+selected=\"true\"")  # fmt: skip
#: a kernel module's name in a ``kernel_module_<name>_disabled`` rule
_MODULE_RULE = re.compile(r"kernel_module_([a-z0-9_-]{1,60})_disabled")


def selected_rules(content: Content, profile_id: str) -> set[str]:
    """The rules the data stream's profile ``profile_id`` selects (before any tailoring)."""
    data = read_bytes(content.datastream, "data stream", limit=DATASTREAM_LIMIT, field="--hardening-content")
    block = re.search(_PROFILE_BLOCK.format(id=re.escape(profile_id)).encode(), data, re.S)
    return {m.group(1).decode() for m in _SELECTED.finditer(block.group(1))} if block else set()


def _tagged(tasks: list[Any]) -> set[str]:
    """The rule names the tasks carry as tags (the content tags each task with its rule)."""
    return {t for task in _each_task(tasks) for t in task.get("tags") or [] if isinstance(t, str)}


def supplement(rules: set[str], tasks: list[Any]) -> list[dict[str, Any]]:
    """The remediation the content lacks in Ansible for the selected ``rules``: a ``kernel_module_<m>_disabled`` rule
    without a task of its own gets the file its check reads (``install <m> /bin/false``, and a blacklist line), as
    the content's Bash remediation writes it."""
    have = _tagged(tasks)
    out = []
    for rule in sorted(rules - have):
        module = _MODULE_RULE.fullmatch(rule)
        if module:
            name = module.group(1)
            out.append({"name": f"Disable the kernel module {name} ({rule}: image-builder's, the content has no"
                                " Ansible remediation for it)",
                        "ansible.builtin.copy": {"dest": f"/etc/modprobe.d/{name}.conf", "mode": "0644",
                                                 "content": f"install {name} /bin/false\nblacklist {name}\n"},
                        "tags": [rule]})  # fmt: skip
    return out


def remediation_playbook(request: HardeningRequest, content: Content, tailoring: Tailoring,
                         dest: Path) -> Remediation:  # fmt: skip
    """The tailored profile's remediation for ``content``, made safe for an image, written at ``dest``."""
    oscap = require_tools("oscap")["oscap"]
    proc = subprocess.run([oscap, "xccdf", "generate", "fix", "--fix-type", "ansible", "--profile",
                           tailoring.profile_id, "--tailoring-file", str(tailoring.path), str(content.datastream)],
                          capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ExternalError(f"OpenSCAP generated no remediation for {request.profile}: {proc.stderr.strip()[-400:]}",
                            hint=f"check that {content.datastream} is a ComplianceAsCode data stream")  # fmt: skip
    plays = parse_yaml_documents(proc.stdout, f"{request.profile} remediation (oscap xccdf generate fix)")
    if len(plays) != 1 or not isinstance(plays[0], list):
        raise ExternalError("OpenSCAP's remediation is not one Ansible playbook")
    safe, dropped = for_an_image(plays[0])
    wanted = selected_rules(content, request.profile_id) - set(tailoring.turned_off)
    for play in safe:
        if isinstance(play, dict):
            play["tasks"], _ = fewer_package_facts(play.get("tasks") or [])
            play["tasks"] += supplement(wanted, play["tasks"])
            play["hosts"] = "all"
            play["become"] = True  # Packer's Ansible logs in as the build user (the chroot's is root already)
            # the node playbook's cached facts are the minimal set; the remediation's conditions read the
            # virtualization type and the mounts too (never the environment: it may hold a proxy's credentials)
            play["gather_facts"] = False
            play["pre_tasks"] = [GATHER, SSHD_KEY_TASK, *(play.get("pre_tasks") or [])]
    text = yaml.safe_dump(safe, sort_keys=False, width=1_000_000, allow_unicode=True)
    with atomic_write(dest) as fh:
        fh.write(f"# {request.profile} ({content.origin}), tailored for a Kubernetes node, made safe for an image\n")
        fh.write(text)
    total = sum(1 for p in safe if isinstance(p, dict) for t in _each_task(p.get("tasks")) if "block" not in t)
    return Remediation(dest, sha256_file(dest), total, tuple(dropped))


def node_playbook(dest: Path, remediation: Path) -> Path:
    """The playbook a hardened Packer build runs instead of ``ansible/node.yml``: the node's provisioning, the
    remediation ``remediation``, the node's finish (as the chroot engine runs them), written at ``dest``."""
    ansible = ROOT / "ansible"
    plays = [
        {"name": "Provision the node", "ansible.builtin.import_playbook": str(ansible / "node-provision.yml")},
        {"name": "Harden the node", "ansible.builtin.import_playbook": str(remediation)},
        {"name": "Seal the node", "ansible.builtin.import_playbook": str(ansible / "node-finish.yml")},
    ]
    with atomic_write(dest) as fh:
        fh.write("---\n" + yaml.safe_dump(plays, sort_keys=False, width=1_000_000, allow_unicode=True))
    return dest
