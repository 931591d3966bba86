"""The flag harness of issue 60: every flag of every task, read from the tasks themselves, attacked with the hostile
values of its kind, each run checked against one set of guarantees.

What a run is held to (:func:`attack`):

- an answer, never a crash: exit 0, 1 or 2, no traceback, no "internal error";
- bad input answered as such: a refusal (exit 2) names the flag it refuses, and creates nothing;
- no secret shown: the marker, put in every credential position of every reference form, is in no output and no
  file the run wrote;
- nothing written outside the run's own folder, and under it only where its destination flag points;
- no hang: a run that blocks for :data:`HANG_SECONDS` fails the test where it blocked;
- quick refusal: a flag refused by exit 2 is answered within :data:`ANSWER_CPU` seconds of CPU (in this process,
  where the imports are paid already: what is measured is the work done before the flag was looked at).

Every task runs with ``--dry-run`` where it has one, its network pointed at 127.0.0.1:1 (proxies, vCenter, AWS, the
Go module proxy). The baselines below give a task's other required flags valid values so that the attacked flag is
reached; a task without one is attacked alone (its own checks come in its own order).
"""

from __future__ import annotations

import atexit
import copy
import functools
import gc
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.cli import namespace
from imagebuilder.cli.flags import flag_kind
from tests.support.common import ROOT
from tests.support.inproc import Outcome, cli

if TYPE_CHECKING:
    from imagebuilder.plan.model import BuildRequest

#: in every credential position of every hostile value; in no output and no file
MARKER = "S3CRET-harness-7f3a"
#: a run blocked this long has hung
HANG_SECONDS = 30
#: the CPU a refusal of a bad flag may take, in this process
ANSWER_CPU = 0.3

#: developer tasks: they run the whole suite or the static checks of the checkout, so no value can be tried cheaply
#: (their flags' kinds are attacked through the user tasks that share them: --packer, --packer-plugins)
NOT_RUN = {"test": "runs the whole suite", "lint": "runs ruff, mypy and ansible-lint over the checkout"}

#: every flag gets these: empty, another script's digit, a look-alike letter, 10,000 characters with escapes, a NUL,
#: a line break with a terminal title sequence, and the marker in each credential position
GENERIC: dict[str, str] = {
    "empty": "",
    "arabic-digit": "٣",
    "look-alike": "ubunтu",
    "long-escapes": "\x1b[2J" + "x" * 10_000,
    "nul": "a\x00b",
    "newline-osc": "a\n\x1b]0;pwned\x07b",
    "url-password": f"https://user:{MARKER}@127.0.0.1:1/x.yaml",
    "url-query": f"http://127.0.0.1:1/x?X-Amz-Signature={MARKER}",
    "pkcs11-pin": f"pkcs11:token=a;id=%01;PIN-VALUE={MARKER}",
    "hsm-pin": f"hsm:2?label=x&pin={MARKER}",
    "awskms-token": f"awskms:alias/x?X-Amz-Security-Token={MARKER}",
}
#: what a path of any kind also gets ({tmp} is the run's own folder)
PATHS: dict[str, str] = {
    "long-component": "{tmp}/" + "n" * 300,
    "proc-environ": "/proc/self/environ",
    "device": "/dev/zero",
    "fifo": "{tmp}/fifo",
    "directory": "{tmp}/dir",
    "symlink-to-secret": "{tmp}/link-to-secret",
    "proc": "/proc",
}
NUMBERS: dict[str, str] = {"negative": "-1", "huge": "9" * 40, "underscore": "1_0", "superscript": "²"}
EXTRA: dict[str, dict[str, str]] = {
    "path-in": PATHS, "path-out": PATHS, "document": PATHS, "key": PATHS, "number": NUMBERS, "duration": NUMBERS,
}  # fmt: skip

#: valid values of a task's other required flags ({tmp}: the run's folder, {out}: its destination there)
BASELINES: dict[str, list[str]] = {
    "ami.export": ["--manifest", "{tmp}/cfg/packer-manifest.json", "--bucket", "bucket-a"],
    "attest.public-key": ["--key", "hsm:2", "--dest", "{out}/k.pem"],
    "attest.sign": ["--provenance", "{tmp}/cfg/p.intoto.json", "--signing-key", "{tmp}/cfg/key.pem", "--image",
                    "{tmp}/cfg/i.gz"],
    "build.build": ["--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--offline",
                    "--baremetal-config", "{tmp}/cfg/bm.json", "--output-dir", "{out}"],
    "build.matrix": ["--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--offline",
                     "--baremetal-config", "{tmp}/cfg/bm.json", "--output-dir", "{out}"],
    "cloudstack.template-register": ["--url", "http://127.0.0.1:1/x.qcow2", "--name", "t", "--zone", "z",
                                     "--os-type", "t"],
    "cluster.validate": ["--file", "{tmp}/cfg/cluster.yaml", "--offline"],
    "config.schema": ["--provider", "baremetal"],
    "dhcp.install": ["--config", "{tmp}/cfg/dhcp.yaml", "--prefix", "{out}"],
    "dhcp.leases": ["--prefix", "{out}"],
    "dhcp.render": ["--config", "{tmp}/cfg/dhcp.yaml", "--dest", "{out}"],
    "download.bottlerocket": ["--variant", "baremetal", "--release-channel", "1-24", "--dest", "{out}",
                              "--metadata-url", "http://127.0.0.1:1/m", "--targets-url", "http://127.0.0.1:1/t",
                              "--root", "http://127.0.0.1:1/r"],
    "download.hook": ["--dest", "{out}", "--manifest", "http://127.0.0.1:1/manifest.yaml"],
    "download.image": ["--repo", "http://127.0.0.1:1/r", "--root", "{tmp}/cfg/root.json", "--target", "x",
                       "--dest", "{out}"],
    "host.prepare": ["--hypervisor", "baremetal", "--root", "{out}"],
    "preflight": ["--os", "ubuntu", "--hypervisor", "baremetal"],
    "image.base": ["--dest", "{out}/base.img"],
    "image.customize": ["--image", "{tmp}/cfg/i.gz", "--customize", "{tmp}/cfg/customize.yaml", "--dest", "{out}/c.gz"],
    "image.publish": ["--image", "{tmp}/cfg/i.gz", "--repo", "{out}/repo", "--keys", "{tmp}/cfg/keys"],
    "image.rebuild": ["--provenance", "{tmp}/cfg/p.intoto.json"],
    "mirror.create": ["--release-channel", "1-24", "--dest", "{out}"],
    "nutanix.image-upload": ["--config", "{tmp}/cfg/nutanix.json", "--file", "{tmp}/cfg/i.gz"],
    "release.build": ["--kubernetes", "v1.36.3", "--dest", "{out}"],
    "repo.init": ["--repo", "{out}/repo", "--keys", "{tmp}/cfg/keys"],
    "repo.keygen": ["--dest", "{out}/keys"],
    "repo.refresh": ["--repo", "{out}/repo", "--keys", "{tmp}/cfg/keys"],
    "repo.rotate": ["--repo", "{out}/repo", "--keys", "{tmp}/cfg/keys", "--role", "targets", "--new-key",
                    "{tmp}/cfg/new-key.pem"],
    "serve": ["--dir", "{tmp}/cfg", "--port", "18999"],
    "template.customize": ["--template", "/DC0/vm/t", "--customize", "{tmp}/cfg/customize.yaml", "--os", "ubuntu",
                           "--release-channel", "1-24"],
    "template.import": ["--ova", "{tmp}/cfg/x.ova", "--os", "ubuntu", "--release-channel", "1-24"],
    "template.tag": ["--template", "/DC0/vm/t", "--os", "ubuntu", "--release-channel", "1-24"],
    "template.validate": ["--template", "/DC0/vm/t", "--os", "ubuntu", "--release-channel", "1-24"],
    "vsphere.setup-user": ["--file", "{tmp}/cfg/user.yaml", "--force"],
    "vsphere.thumbprint": ["--server", "127.0.0.1:1"],
}  # fmt: skip

#: the network, pointed at a closed port; the secret of the environment is the marker too (a task that echoes
#: /proc/self/environ or a variable shows it)
ENV = {
    "http_proxy": "http://127.0.0.1:1", "https_proxy": "http://127.0.0.1:1", "HTTP_PROXY": "http://127.0.0.1:1",
    "HTTPS_PROXY": "http://127.0.0.1:1", "no_proxy": "", "NO_PROXY": "", "GOPROXY": "http://127.0.0.1:1",
    "GOFLAGS": "-mod=mod", "GOVC_URL": "https://127.0.0.1:1/sdk", "GOVC_USERNAME": "u", "GOVC_PASSWORD": MARKER,
    "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "AKIAHARNESS", "AWS_SECRET_ACCESS_KEY": MARKER,
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "IMAGE_BUILDER_HSM_PIN": MARKER,
    "NUTANIX_PASSWORD": MARKER, "CLOUDSTACK_ENDPOINT": "http://127.0.0.1:1/client/api", "CLOUDSTACK_KEY": "k",
    "CLOUDSTACK_SECRET": MARKER,
}  # fmt: skip


@dataclass(frozen=True)
class Flag:
    task: str
    name: str  # as typed: --disk-gb
    kind: str


def tasks() -> list[str]:
    return sorted(name for name in namespace.task_names if name not in NOT_RUN)


def flags_of(task: str) -> list[Flag]:
    """Every flag of ``task`` that takes a value, read from its Invoke signature (on a copy: Invoke pops a task's help
    texts when it builds its arguments), with its kind from the flag registry."""
    arguments = copy.deepcopy(namespace[task]).get_arguments()
    return [Flag(task, "--" + a.name.replace("_", "-"), flag_kind(a.name)) for a in arguments if a.kind is not bool]


def has_dry_run(task: str) -> bool:
    return any(a.name == "dry_run" for a in copy.deepcopy(namespace[task]).get_arguments())


def values_for(kind: str) -> dict[str, str]:
    return {**GENERIC, **EXTRA.get(kind, {})}


def cases() -> list[tuple[Flag, str]]:
    """Every (flag, hostile value name) pair of every task."""
    return [(flag, value) for task in tasks() for flag in flags_of(task) for value in values_for(flag.kind)]


def prepare(tmp: Path) -> None:
    """The run's folder: valid inputs for the baselines, and the hostile files the path values name."""
    cfg = tmp / "cfg"
    cfg.mkdir(parents=True)
    examples = ROOT / "config" / "examples"
    for name, target in (("baremetal-ubuntu.json", "bm.json"), ("dhcp.yaml", "dhcp.yaml"), ("vsphere-user.yaml",
                         "user.yaml"), ("vsphere-cluster.yaml", "cluster.yaml"), ("nutanix-ubuntu.json",
                         "nutanix.json")):  # fmt: skip
        (cfg / target).write_bytes((examples / name).read_bytes())
    nutanix = json.loads((cfg / "nutanix.json").read_text())  # Prism at a closed port, not the example's host name
    (cfg / "nutanix.json").write_text(json.dumps({**nutanix, "hci_endpoint": "127.0.0.1", "hci_port": "1"}))
    (cfg / "customize.yaml").write_text("user: {name: image-builder}\n")
    (cfg / "root.json").write_text("{}")
    run_id = "4b7d0c9e-0000-4000-8000-000000000001"
    build = {"name": "node", "builder_type": "amazon-ebs", "build_time": 1732500000, "files": None,
             "artifact_id": "us-east-1:ami-0123456789abcdef0", "packer_run_uuid": run_id,
             "custom_data": None}  # fmt: skip
    (cfg / "packer-manifest.json").write_text(json.dumps({"builds": [build], "last_run_uuid": run_id}))
    (cfg / "i.gz").write_bytes(b"")
    (cfg / "i.gz.sha256").write_text(f"{hashlib.sha256(b'').hexdigest()}  i.gz\n")
    (cfg / "p.intoto.json").write_text(json.dumps(_statement()))
    (cfg / "x.ova").write_bytes(b"")
    shutil.copytree(_keys(), cfg / "keys")
    shutil.copy2(_keys() / "targets.pem", cfg / "key.pem")
    shutil.copy2(_keys() / "root.pem", cfg / "new-key.pem")  # a key the targets role does not have yet
    (tmp / "out" / "etc").mkdir(parents=True)  # a root host.prepare --root takes
    (tmp / "out" / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp / "out" / "etc" / "group").write_text("root:x:0:\n")
    shutil.copytree(_repository(), tmp / "out" / "repo")
    (tmp / "dir").mkdir()
    os.mkfifo(tmp / "fifo")
    secret = tmp / "secret.txt"
    secret.write_text(f"password={MARKER}\n")
    (tmp / "link-to-secret").symlink_to(secret)
    (tmp / "tmp").mkdir()
    (tmp / "home").mkdir()


def offline_chroot_request(tmp: Path) -> BuildRequest:
    """A build request that plans without the network: offline, the chroot engine, a bare-metal config whose source
    image is named by digest (the CI-emit tests plan their pipelines from it)."""
    from imagebuilder.plan.model import BuildRequest

    config = tmp / "bm.json"
    config.write_text(json.dumps({"source_image_url": "http://images.example/base.qcow2",
                                  "source_image_checksum": "sha256:" + "a" * 64}))  # fmt: skip
    return BuildRequest(os=None, hypervisor=None, release_channel=None, offline=True, engine="chroot",
                        configs={"baremetal": str(config)})  # fmt: skip


@functools.cache
def _keys() -> Path:
    """A repository's four keys, made once for the session (repo.keygen's own code) and copied into each run."""
    top = Path(tempfile.mkdtemp(prefix="harness-keys-"))
    atexit.register(shutil.rmtree, top, True)  # private keys, even test ones, are not left in /tmp
    folder = top / "keys"
    outcome = cli("repo.keygen", "--dest", str(folder))
    assert outcome.code == 0, outcome.text
    return folder


@functools.cache
def _repository() -> Path:
    """A repository repo.init made with :func:`_keys`, once for the session, copied into each run."""
    folder = _keys().parent / "repo"
    outcome = cli("repo.init", "--repo", str(folder), "--keys", str(_keys()))
    assert outcome.code == 0, outcome.text
    return folder


@functools.cache
def _statement() -> dict[str, object]:
    """An unsigned provenance of the empty image ``i.gz``, as a build without a key writes it."""
    from imagebuilder.attest import provenance

    return provenance.unsigned({"_type": provenance.STATEMENT_TYPE, "predicateType": provenance.PREDICATE_TYPE,
                                "subject": [{"name": "i.gz", "digest": {"sha256": hashlib.sha256(b"").hexdigest()}}],
                                "predicate": {}})  # fmt: skip


class Hang(BaseException):
    """Raised in a run that blocked for :data:`HANG_SECONDS`: the test fails where it blocked."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise :class:`Hang` in a block that blocks for ``seconds`` (a FIFO opened without ``O_NONBLOCK`` would wait for
    a writer forever): the test fails where it blocked instead of hanging."""

    def late(signum: int, frame: object) -> None:
        raise Hang(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _tree(root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(top) / name
            with suppress(OSError):
                out[str(path)] = path.lstat().st_mtime
    return out


@dataclass
class Attack:
    flag: Flag
    value_name: str
    value: str
    args: list[str]
    outcome: Outcome
    cpu: float
    created: list[str]


def _run(args: list[str], tmp: Path) -> tuple[Outcome, float]:
    env = {**ENV, "HOME": str(tmp / "home"), "XDG_CACHE_HOME": str(tmp / "home" / ".cache"), "TMPDIR": str(tmp / "tmp")}
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(tmp / "tmp")
    # a collection of this process's heap (thousands of runs' garbage beside the SDKs) is not the task's work: it
    # happens before or after the measured run, never inside it
    gc.collect(0)
    gc.disable()
    start = time.process_time()
    try:
        with deadline(HANG_SECONDS):
            outcome = cli(*args, env=env, cwd=tmp / "out")
    finally:
        cpu = time.process_time() - start
        gc.enable()
        tempfile.tempdir = saved_tempdir
    return outcome, cpu


def baseline_args(task: str, tmp: Path, without: str | None = None) -> list[str]:
    """``task``'s baseline in the run's folder ``tmp``, less the flag ``without``; ``--dry-run`` where it has one."""
    baseline = [a.replace("{tmp}", str(tmp)).replace("{out}", str(tmp / "out")) for a in BASELINES.get(task, [])]
    if without in baseline:  # the attacked flag replaces the baseline's value
        at = baseline.index(without)
        del baseline[at : at + 2]
    return [task, *baseline, *(["--dry-run"] if has_dry_run(task) else [])]


def warm(task: str, tmp: Path) -> Outcome:
    """``task``'s baseline run once, unmeasured: the modules it loads are then loaded, so what :func:`attack`
    measures is the work done before a flag is refused, not this process's first imports."""
    return _run(baseline_args(task, tmp), tmp)[0]


def attack(flag: Flag, value_name: str, tmp: Path) -> Attack:
    """Run ``flag``'s task with the hostile value ``value_name`` (in the task's baseline, with --dry-run where it has
    one) inside ``tmp`` (made by :func:`prepare`), and hold the run to the guarantees of the module."""
    value = values_for(flag.kind)[value_name].replace("{tmp}", str(tmp))
    args = [*baseline_args(flag.task, tmp, without=flag.name), flag.name, value]
    before = _tree(tmp)
    outcome, cpu = _run(args, tmp)
    after = _tree(tmp)
    created = sorted(p for p in after if p not in before)
    return Attack(flag, value_name, value, args, outcome, cpu, created)


#: a flag as a message names it
_NAMED_FLAG = re.compile(r"(?<![\w./-])--([a-z][a-z0-9-]*[a-z0-9])")


def _flag_names(task: str) -> set[str]:
    names = {n for a in copy.deepcopy(namespace[task]).get_arguments() for n in a.names}
    return {"--help", *(("-" if len(n) == 1 else "--") + n.replace("_", "-") for n in names)}


def foreign_flags(task: str, text: str) -> list[str]:
    """The flags ``text`` (what ``task`` printed) names that the task they belong to lacks: a flag belongs to the
    last task named before it on its line (``would run: build --os ...``, ``download.image --root``), else to
    ``task``. A hint that sends the user to a flag the task lacks is a wrong hint (issue 61)."""
    names = {n: k for k, v in namespace.task_names.items() for n in (k, *v)}
    names |= {space: f"{space}.{sub.default}" for space, sub in namespace.collections.items() if sub.default}
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    task_word = re.compile(rf"(?<![\w./-])({alternatives})(?![\w/-]|\.\w)")
    found = set()
    for line in text.splitlines():
        for m in _NAMED_FLAG.finditer(line):
            named = [w.group(1) for w in task_word.finditer(line[: m.start()])]
            owner = names[named[-1]] if named else task
            if "--" + m.group(1) not in _flag_names(owner):
                found.add(f"{owner} --{m.group(1)}")
    return sorted(found)


def problems(run: Attack, tmp: Path) -> list[str]:
    """What ``run`` broke of the guarantees (empty when it held them all)."""
    found: list[str] = []
    res, text = run.outcome, run.outcome.text
    if res.code not in (0, 1, 2):
        found.append(f"exit {res.code}")
    if "internal error" in text or "Traceback" in text:
        found.append("a crash: " + text[-300:])
    if MARKER in text:
        found.append("the secret is shown: " + text[max(0, text.find(MARKER) - 120) : text.find(MARKER) + 40])
    if "\x1b" in text or "\x07" in text:
        found.append("a terminal escape is printed")
    # (a value with a line break splits the command a message quotes: the flags after it are the value's doing)
    foreign = (
        [] if "\n" in run.value else foreign_flags(run.flag.task, text.replace(run.value, "") if run.value else text)
    )
    if foreign:
        found.append(f"names flags {run.flag.task} lacks: {foreign}")
    if res.code == 2:
        if run.created:
            found.append(f"a refusal created {run.created[:3]}")
        if run.cpu > ANSWER_CPU:
            found.append(f"the refusal took {run.cpu:.2f} s of CPU")
    # where a run may write: its destination, the temporary and home folders it was given, and a path the user
    # named with the attacked flag (a folder given as --dest or --repo is where the user asked for the output)
    allowed = [str(tmp / "out"), str(tmp / "tmp"), str(tmp / "home")]
    if run.value.startswith(str(tmp)):
        allowed.append(str(Path(run.value).resolve()) if "\0" not in run.value else run.value)
    outside = [p for p in run.created if not any(p == a or p.startswith(a + "/") for a in allowed)]
    if outside:
        found.append(f"wrote outside its destination: {outside[:3]}")
    for path in run.created:
        p = Path(path)
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 50_000_000 and MARKER.encode() in p.read_bytes():
            found.append(f"the secret is in the file {path}")
    return found
