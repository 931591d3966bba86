"""SSH into a machine this tool started: a key pair per run, waiting for the login, Ansible over it.

Why one module: a build (Packer's key), ``template.customize`` and ``image.customize`` all log in to a machine that
cloud-init has just given a user and a key, and they must do it the same careful way. The key pair is made for the
run in a 0700 folder and deleted with it, so no login outlives the run. The machine is new and its host key unknown,
so it is not checked (nothing is recorded either); what protects the session is that the machine is ours and
short-lived, and that no secret crosses this connection except through Ansible's ``no_log`` tasks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.disk import run_tempdir
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import atomic_write
from imagebuilder.core.hostinfo import require_tools, tool_search_path
from imagebuilder.core.paths import BUNDLE
from imagebuilder.core.progress import Say
from imagebuilder.core.runs import RUN_ENV
from imagebuilder.core.untrusted import Redactor


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: str  # the OpenSSH public key line


def keypair(directory: Path, comment: str = "image-builder build key") -> KeyPair:
    """An ed25519 key pair in ``directory`` (made 0700), reused when it exists."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    if not key.exists():
        keygen = require_tools("ssh-keygen")["ssh-keygen"]
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)], check=True, timeout=60)
    return KeyPair(key, (directory / "id_ed25519.pub").read_text().strip())


@contextlib.contextmanager
def run_key(comment: str) -> Iterator[KeyPair]:
    """A key pair that exists for the ``with`` block only (private key 0600 in a 0700 folder, deleted after)."""
    with run_tempdir("ssh") as tmp:
        yield keypair(Path(tmp) / "ssh", comment)


@dataclass(frozen=True)
class Login:
    """Where and as whom to log in."""

    host: str
    port: int
    user: str
    key: Path

    def options(self) -> list[str]:
        return [
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes",
        ]  # fmt: skip

    def ssh(self, *command: str) -> list[str]:
        return ["ssh", *self.options(), "-i", str(self.key), "-p", str(self.port), f"{self.user}@{self.host}", *command]


def wait_for_login(login: Login, *, timeout: float, say: Say, gone: Callable[[], str | None] = lambda: None) -> float:
    """Wait until ``login`` can run a command (sshd is up *and* cloud-init has made the user and key).

    ``gone`` says why the machine cannot come up any more (powered off, QEMU exited), so a dead machine fails at
    once instead of at the timeout. Returns the seconds waited.
    """
    start = time.monotonic()
    last = ""
    while (waited := time.monotonic() - start) < timeout:
        if reason := gone():
            raise ExternalError(f"the machine stopped before {login.user} could log in: {reason}")
        try:
            proc = subprocess.run(login.ssh("true"), capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            last = "ssh timed out"
        else:
            if proc.returncode == 0:
                return waited
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        say(f"waiting for SSH as {login.user}@{login.host}:{login.port} ({waited:.0f} s): {last[:80]}")
        time.sleep(3)
    raise ExternalError(
        f"could not log in as {login.user}@{login.host}:{login.port} within {timeout:.0f} s (last: {last})",
        hint="the guest may lack cloud-init's VMware/NoCloud datasource or a DHCP server; raise --timeout on "
        "slow hosts (no KVM)",
    )


def run_playbook(
    login: Login,
    playbook: str,
    variables: dict[str, object],
    *,
    secret_env: dict[str, str],
    log: Path,
    redact: Redactor,
    say: Say,
    timeout: float = 3600,
) -> None:
    """Run one of our playbooks against ``login``; secrets reach Ansible through its environment only.

    The variables file holds no secret (0600 all the same, deleted after); Ansible's output goes to ``log``
    through ``redact``, and the failing task's lines are in the error.
    """
    import json

    ansible = require_tools("ansible-playbook")["ansible-playbook"]
    with run_tempdir("vars") as tmp:
        env = {
            "PATH": tool_search_path(),
            "HOME": str(tmp),
            RUN_ENV: os.environ.get(RUN_ENV, ""),  # Ansible and its ssh carry the run (disk.stale_processes)
            "LANG": "C.UTF-8",
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_ROLES_PATH": str(BUNDLE / "ansible" / "roles"),
            "ANSIBLE_LOCAL_TEMP": f"{tmp}/t",
            # a Unix socket path must stay under 108 bytes: the control sockets go in this short /tmp folder
            "ANSIBLE_SSH_CONTROL_PATH_DIR": f"{tmp}/cp",
            "ANSIBLE_SSH_ARGS": " ".join([*login.options(), "-o", "ControlMaster=auto", "-o", "ControlPersist=120s"]),
            **secret_env,
        }
        vars_file = Path(tmp) / "vars.json"
        with atomic_write(vars_file, perm=0o600) as fh:
            json.dump(variables, fh)
        args = [
            ansible, "-i", f"{login.host},", "-u", login.user, "--private-key", str(login.key),
            "-e", f"ansible_port={login.port}", "-e", f"@{vars_file}", str(BUNDLE / "ansible" / playbook),
        ]  # fmt: skip
        say(f"ansible-playbook {playbook} on {login.host}")
        with log.open("a") as out:
            # not the caller's stdin: ansible-playbook refuses a non-blocking one ("Ansible requires blocking IO"),
            # as a CI runner's or a test harness's pipe may be, and it prompts for nothing here
            proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)  # fmt: skip
            assert proc.stdout is not None
            tail: list[str] = []
            deadline = time.monotonic() + timeout
            for line in proc.stdout:
                clean = redact(line)
                out.write(clean)
                tail = [*tail[-19:], clean.rstrip()]
                if clean.startswith("TASK ["):
                    say(clean.strip(" *\n"))
                if time.monotonic() > deadline:
                    proc.kill()
            code = proc.wait()
    if code != 0:
        failed = [ln for ln in tail if "fatal:" in ln or "FAILED" in ln or "msg" in ln] or tail[-6:]
        raise ExternalError(
            f"ansible-playbook {playbook} failed (exit {code}): " + " | ".join(failed[-4:])[:600],
            hint=f"the whole run is in {log}",
        )
