"""``host.prepare``: make a machine an image-builder host (spec 4.3), idempotently.

Every action first looks at the current state and only changes what differs, so a rerun converges and
``--dry-run`` can list exactly what would change. ``root`` is the filesystem to prepare: ``/`` on a real host, or
a throwaway root (a debootstrapped chroot) in the tests; commands then run through ``chroot``.
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write
from imagebuilder.core.hostinfo import os_release
from imagebuilder.host.config import load_host_config
from imagebuilder.host.preflight import PROXY_VARS

POLICY_RC_D = "usr/sbin/policy-rc.d"


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Action:
    """One change: ``describe`` says what, ``apply`` does it.

    ``needed`` is asked again right before applying: an earlier action may already have done this one's work
    (installing packages creates group kvm, for instance).
    """

    describe: str
    apply: Callable[[], object]
    needed: Callable[[], bool] = _always


class HostPrep:
    def __init__(self, root: Path = Path("/"), *, user: str | None = None, providers: tuple[str, ...] = ()) -> None:
        self.root = root.resolve()
        if not (self.root / "etc").is_dir():
            raise InputError("is not a root filesystem (no etc/)", field="--root", source=str(root))
        for needed in ("passwd", "group"):  # read below to find the users, the groups and their members
            if not (self.root / "etc" / needed).is_file():
                raise InputError(f"is not a root filesystem (no etc/{needed})", field="--root", source=str(root))
        self.cfg = load_host_config()
        self.user = user or self.cfg.user
        self.providers = list(providers)
        self.os_id = os_release(self.root).get("ID", "")

    # --- helpers ---------------------------------------------------------------------------------------------
    @property
    def in_chroot(self) -> bool:
        return self.root != Path("/")

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["chroot", str(self.root), *args] if self.in_chroot else list(args)
        full_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", **(env or {})}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=3600, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            hint = "rerun after fixing the cause; completed steps are kept"
            if args[0] == "apt-get":
                hint = "check the network or proxy to the package archive, then rerun (completed steps are kept)"
            raise ExternalError(f"'{' '.join(args)}' failed (exit {proc.returncode}): " + " | ".join(tail), hint=hint)
        return proc

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def _passwd(self, name: str) -> list[str] | None:
        for line in self.path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return fields
        return None

    def _group_members(self, group: str) -> list[str] | None:
        for line in self.path("/etc/group").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == group:
                return [m for m in fields[3].split(",") if m]
        return None

    def _lacks_member(self, group: str) -> bool:
        return self.user not in (self._group_members(group) or [])

    def _installed(self, package: str) -> bool:
        status = self.path("/var/lib/dpkg/status")
        if not status.is_file():
            return False
        block = f"Package: {package}\n"
        text = status.read_text()
        start = text.find(block)
        while start != -1:
            end = text.find("\n\n", start)
            if "Status: install ok installed" in text[start:end]:
                return True
            start = text.find(block, start + 1)
        return False

    # --- the plan --------------------------------------------------------------------------------------------
    def actions(self, proxies: dict[str, str] | None = None) -> list[Action]:
        """What differs from the prepared state, in the order it must be applied."""
        acts: list[Action] = []
        packages = self.cfg.packages_for(self.providers, self.os_id)
        missing = [p for p in packages if not self._installed(p)]
        if missing:
            acts.append(Action(f"install packages: {' '.join(missing)}", lambda: self._install(missing)))
        if self._group_members("kvm") is None:
            acts.append(
                Action(
                    "create group kvm",
                    lambda: self.run("groupadd", "--system", "kvm"),
                    lambda: self._group_members("kvm") is None,
                )
            )
        groups = [*self.cfg.user_groups, "kvm"]
        if self._passwd(self.user) is None:
            acts.append(
                Action(
                    f"create user {self.user} (groups {', '.join(groups)})",
                    lambda: self.run(
                        "useradd", "--create-home", "--shell", "/bin/bash", "--groups", ",".join(groups), self.user
                    ),
                    lambda: self._passwd(self.user) is None,
                )
            )
        else:
            for group in groups:
                if self.user not in (self._group_members(group) or []):
                    acts.append(
                        Action(
                            f"add {self.user} to group {group}",
                            partial(self.run, "usermod", "-aG", group, self.user),
                            partial(self._lacks_member, group),
                        )
                    )
        acts += self._kvm_actions()
        acts += self._ssh_actions()
        if proxies:
            acts += self._proxy_actions(proxies)
        return acts

    def _install(self, packages: list[str]) -> None:
        guard = self.path("/" + POLICY_RC_D)
        # in a throwaway root, packages must not start services (there is no init there)
        if self.in_chroot and not guard.exists():
            guard.write_text("#!/bin/sh\nexit 101\n")
            guard.chmod(0o755)
            added = True
        else:
            added = False
        try:
            self.run("apt-get", "update", "-qq")
            self.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages)
        finally:
            if added:
                guard.unlink()

    def _kvm_actions(self) -> list[Action]:
        acts: list[Action] = []
        rule = self.path("/etc/udev/rules.d/65-kvm.rules")
        wanted = self.cfg.kvm_udev_rule + "\n"
        if not rule.is_file() or rule.read_text() != wanted:
            what = f"write {rule.relative_to(self.root)} ({self.cfg.kvm_udev_rule})"
            acts.append(Action(what, lambda: self._write(rule, wanted)))
        dev = self.path("/dev/kvm")
        if dev.exists():
            st = dev.stat()
            try:
                kvm_gid = self._gid("kvm")
            except KeyError:
                kvm_gid = -1
            if st.st_mode & 0o777 != 0o666 or st.st_uid != 0 or st.st_gid != kvm_gid:
                acts.append(Action("set /dev/kvm to 0666 root:kvm", lambda: self._fix_kvm(dev)))
        return acts

    def _gid(self, group: str) -> int:
        if not self.in_chroot:
            return grp.getgrnam(group).gr_gid
        for line in self.path("/etc/group").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == group:
                return int(fields[2])
        raise KeyError(group)

    def _fix_kvm(self, dev: Path) -> None:
        os.chown(dev, 0, self._gid("kvm"))
        os.chmod(dev, 0o666)  # noqa: S103 - spec 4.3 asks for /dev/kvm mode 666 root:kvm

    def _home(self) -> Path:
        fields = self._passwd(self.user)
        home = fields[5] if fields else f"/home/{self.user}"
        return self.path(home)

    def _ssh_actions(self) -> list[Action]:
        config = self._home() / ".ssh" / "config"
        current = config.read_text().splitlines() if config.is_file() else []
        missing = [ln for ln in self.cfg.ssh_client_lines if ln not in current]
        if not missing:
            return []

        def apply() -> None:
            lines = (config.read_text().splitlines() if config.is_file() else []) + [
                ln for ln in self.cfg.ssh_client_lines if ln not in current
            ]
            config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._write(config, "\n".join(lines) + "\n", perm=0o600)
            uid, gid = int(self._passwd(self.user)[2]), int(self._passwd(self.user)[3])  # type: ignore[index]
            for p in (config.parent, config):
                os.chown(p, uid, gid)

        return [Action(f"add to {config.relative_to(self.root)}: {'; '.join(missing)}", apply)]

    def _proxy_actions(self, proxies: dict[str, str]) -> list[Action]:
        path = self.path("/etc/profile.d/image-builder-proxy.sh")
        body = "# Written by image-builder host.prepare (spec 4.3)\n" + "".join(
            f"export {k}={_sh_quote(v)}\nexport {k.lower()}={_sh_quote(v)}\n" for k, v in sorted(proxies.items())
        )
        if path.is_file() and path.read_text() == body:
            return []
        what = f"write {path.relative_to(self.root)} ({', '.join(sorted(proxies))})"
        return [Action(what, lambda: self._write(path, body))]

    @staticmethod
    def _write(path: Path, text: str, perm: int = 0o644) -> None:
        with atomic_write(path, perm=perm) as fh:
            fh.write(text)


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def proxies_from(http: str | None, https: str | None, no_proxy: str | None) -> dict[str, str]:
    given = dict(zip(PROXY_VARS, (http, https, no_proxy), strict=True))
    return {k: v for k, v in given.items() if v}


def require_root_privileges() -> None:
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        raise ExternalError("host.prepare changes users, packages and devices", hint="run it as root")


def apply(actions: list[Action]) -> Iterator[tuple[Action, bool]]:
    """Apply each action that is still needed, in order; yields each with whether it changed something (an action
    another one already took care of is skipped), so the caller reports as it goes."""
    require_root_privileges()
    for action in actions:
        if action.needed():
            action.apply()
            yield action, True
        else:
            yield action, False


def disk_advice(workspace: Path | None = None) -> str | None:
    """Spec 8's size of a build host's disk, as advice and never a refusal: a line when the filesystem that holds the
    build workspace is smaller (each build checks what its own work needs, in its plan and preflight)."""
    from imagebuilder.builder.disk_need import GIB
    from imagebuilder.core.paths import existing_parent, workspace_root

    want = load_host_config().requirements.min_disk_gb
    where = existing_parent(workspace or workspace_root())
    size = shutil.disk_usage(where).total
    if size >= want * 10**9:  # spec 8 says GB
        return None
    return (f"advice: spec 8 sizes a build host's disk at {want} GB; the one under {where} is {size / GIB:.1f} GiB "
            "(builds still run: each checks the space its own work needs)")  # fmt: skip
