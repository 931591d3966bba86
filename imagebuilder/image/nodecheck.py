"""The node check (``image.verify --node-check``): an image is proven by a node that becomes Ready on it.

The control plane runs on the build host from the image's own programs (:mod:`imagebuilder.image.controlplane`:
under TCG a control plane inside the guest was most of the guest's work, and collapsed on a busy host). A
throwaway copy of the image boots under QEMU (KVM when usable, else TCG) with a NoCloud seed, and cloud-init runs
one script there: it lists what this kubeadm would pull for a control plane (``kubeadm config images list``) against
containerd's preloaded images, then ``kubeadm join`` makes the guest a node of the host's control plane with the
bootstrap token and the pinned CA (no registry, no network beyond QEMU's user network), with a bridge CNI
configuration of the installed CNI plugins. The script reports each step on the serial console, and on a failure
the kubelet's and containerd's journal. With ``join``, a second copy joins as a second node, and the test pod runs
there.

The host then checks the node as a cluster's user would, with the image's own kubectl: the node Ready, kubeadm's
addons (kube-proxy, whose rules route the service network, and CoreDNS, which is ready only once it reaches the API
server through them) Running and ready on it, one pod of the preloaded pause image Running and then deleted. Keys
live in a 0700 work folder removed with the check.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imagebuilder.core.arch import recorded
from imagebuilder.core.disk import mounted_root, run_tempdir
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import sha256_file
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.safepath import safe_join
from imagebuilder.image import controlplane, emulation, qemu
from imagebuilder.image.controlplane import SERVICE_SUBNET, Kubectl
from imagebuilder.release.catalog import Firmware

#: what the guest says on its serial console, one line each: ``NODE-CHECK <event> [detail]``
MARK = "NODE-CHECK"
POD_SUBNET = "10.244.0.0/16"
#: each node's part of the pod range (the bridge plugin's host-local addresses)
NODE_SUBNETS = ("10.244.0.0/24", "10.244.1.0/24")
NODE_NAME = "node-check"
WORKER_NAME = "node-check-2"
NODE_NAMES = (NODE_NAME, WORKER_NAME)
ADDONS = ("kube-proxy", "coredns")


@dataclass(frozen=True)
class Step:
    name: str
    ok: bool
    detail: str
    seconds: float


class _Failed(Exception):
    def __init__(self, step: Step) -> None:
        self.step = step


def _split(ref: str) -> tuple[str, str]:
    """``registry.k8s.io/coredns/coredns:v1.12.1`` -> (``registry.k8s.io/coredns``, ``v1.12.1``)."""
    name, tag = ref.rsplit(":", 1)
    return name.rsplit("/", 1)[0], tag


@dataclass(frozen=True)
class Join:
    """How the guests join the host's control plane: the bootstrap token kubeadm's phase creates and each join
    presents, the CA's public-key hash the joins pin, and the API server's address as the guests reach it."""

    token: str
    ca_hash: str
    endpoint: str


def _api(kubernetes_version: str) -> tuple[str, int]:
    minor = int(kubernetes_version.lstrip("v").split(".")[1])
    return ("kubeadm.k8s.io/v1beta4" if minor >= 31 else "kubeadm.k8s.io/v1beta3"), minor


#: kubeadm's waits on a node check: its defaults (4-5 minutes) are tight for a guest emulated on a shared host (TCG);
#: the node check's own deadline still bounds the whole check
SLOW_HOST_WAIT = "20m0s"


def _timeouts(minor: int) -> dict[str, Any]:
    """The fields that lengthen kubeadm's waits (v1beta4's ``timeouts``, kubeadm 1.31+); older releases take
    ``discovery.timeout`` instead, set where the join's document is built."""
    if minor < 31:
        return {}
    return {"timeouts": {"kubeletHealthCheck": SLOW_HOST_WAIT, "kubernetesAPICall": SLOW_HOST_WAIT,
                         "tlsBootstrap": SLOW_HOST_WAIT, "discovery": SLOW_HOST_WAIT}}  # fmt: skip


def _node_registration(name: str) -> dict[str, Any]:
    return {"name": name, "criSocket": "unix:///run/containerd/containerd.sock"}


def kubeadm_config(images: dict[str, str], kubernetes_version: str, join: Join) -> str:
    """kubeadm's configuration of the check's cluster, for kubeadm's phases on the host and for the guest's list of
    a control plane's images: the repository and tags the manifest names, so kubeadm asks for exactly what the image
    preloaded (a distro's ``v1.24.8-eks-1-24-5`` tags included), the API server at the guests' address, and the
    bootstrap token the joins present."""
    repo, tag = _split(images["kube-apiserver"])
    etcd_repo, etcd_tag = _split(images["etcd"])
    dns_repo, dns_tag = _split(images["coredns"])
    api, _minor = _api(kubernetes_version)
    host, port = join.endpoint.rsplit(":", 1)
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": api,
            "kind": "InitConfiguration",
            "nodeRegistration": _node_registration(NODE_NAME),
            "localAPIEndpoint": {"advertiseAddress": host, "bindPort": int(port)},
            "bootstrapTokens": [
                {
                    "token": join.token,
                    "ttl": "2h",
                    "usages": ["signing", "authentication"],
                    "groups": ["system:bootstrappers:kubeadm:default-node-token"],
                }
            ],
        },
        {
            "apiVersion": api,
            "kind": "ClusterConfiguration",
            "kubernetesVersion": tag,
            "imageRepository": repo,
            "controlPlaneEndpoint": join.endpoint,
            "networking": {"podSubnet": POD_SUBNET, "serviceSubnet": SERVICE_SUBNET},
            "etcd": {"local": {"imageRepository": etcd_repo, "imageTag": etcd_tag}},
            "dns": {"imageRepository": dns_repo, "imageTag": dns_tag},
        },
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "systemd",
        },
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def join_config(kubernetes_version: str, join: Join, name: str) -> str:
    """A guest's ``kubeadm join`` configuration: the host's API server at the guests' address, the token, the CA
    pinned by its public-key hash, the node's name."""
    api, minor = _api(kubernetes_version)
    discovery: dict[str, Any] = {"bootstrapToken": {"apiServerEndpoint": join.endpoint, "token": join.token,
                                                    "caCertHashes": [f"sha256:{join.ca_hash}"]}}  # fmt: skip
    if minor < 31:
        discovery["timeout"] = SLOW_HOST_WAIT
    return yaml.safe_dump({
        "apiVersion": api,
        "kind": "JoinConfiguration",
        "discovery": discovery,
        "nodeRegistration": _node_registration(name),
        **_timeouts(minor),
    }, sort_keys=False)  # fmt: skip


def _cni_config(subnet: str) -> dict[str, Any]:
    """The bridge network of one node, from the installed CNI plugins (each node its own part of the pod range)."""
    return {
        "cniVersion": "1.0.0",
        "name": "node-check",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }  # fmt: skip


#: where the guest script's ``say`` writes in a script (:func:`guest_script` puts the machine's serial console there)
CONSOLE = "@CONSOLE@"
#: how both guests' scripts begin: ``say`` reports a step on the serial console the host reads (the machine's:
#: ``ttyS0`` on amd64, ``ttyAMA0`` on QEMU's arm64 ``virt``, where ``ttyS0`` has no UART and every write failed with
#: an I/O error), ``journal`` shows the kubelet's and containerd's
SCRIPT_HEAD = f"""#!/bin/sh
out=/dev/{CONSOLE}
say() {{ echo "{MARK} $*" > $out; }}
journal() {{
  say journal-begin
  journalctl -u containerd -u kubelet --no-pager -n 120 -o cat > $out 2>&1
  say journal-end
}}
cd /root/node-check || exit 1
"""

#: what a guest says of its runtime (``say runtime ...``, read by :func:`runtime_ok`): the cgroup
#: hierarchy's file system type, the ``SystemdCgroup`` that ``crictl info`` reports containerd's runc runs with, and
#: the version containerd's server states
RUNTIME_REPORT = """cgroup=$(stat -fc %T /sys/fs/cgroup)
crictl --runtime-endpoint unix:///run/containerd/containerd.sock info > crictl-info.json 2>&1
systemd=$(grep -o '"SystemdCgroup": *[a-z]*' crictl-info.json | head -n 1 | grep -o '[a-z]*$')
server=$(ctr version 2>/dev/null | awk '/Version:/ {v = $2} END {print v}')
say runtime "cgroup=$cgroup" "systemd=${systemd:-unknown}" "containerd=$server"
"""

#: each guest's side, run once by cloud-init: its runtime, the preloaded images, the host's API server reached,
#: ``kubeadm join``
GUEST_SCRIPT = (
    SCRIPT_HEAD
    + """say started
i=0
until ctr version >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 120 ] || { say containerd-down; journal; exit 1; }; sleep 1
done
"""
    + RUNTIME_REPORT
    + """wanted=$(kubeadm config images list --config kubeadm.yaml 2>kubeadm-images.log) || {
  say images-failed "$(tail -n 3 kubeadm-images.log | tr '\\n' ' ')"; exit 1; }
have=$(ctr -n k8s.io images ls -q)
missing=""
for ref in $wanted; do
  echo "$have" | grep -qxF "$ref" || missing="$missing $ref"
done
if [ -n "$missing" ]; then say images-missing$missing; else say images-ok $(echo $wanted); fi
server=$(awk '/apiServerEndpoint:/ {print $2}' join.yaml)
i=0
until curl -ks --max-time 10 "https://$server/healthz" | grep -qx ok; do
  i=$((i + 1)); [ $i -lt 60 ] || { say api-unreachable "$server"; ip addr > $out; ip route > $out; exit 1; }; sleep 5
done
say join-begin
if kubeadm join --config join.yaml > join.log 2>&1; then
  say join-ok
else
  say join-failed
  tail -n 40 join.log > $out
  journal
  exit 1
fi
"""
)


def runtime_ok(event: str, detail: str) -> bool:
    """Whether the guest's ``runtime`` line says what the kubelet needs from 1.36 on: the unified cgroup hierarchy
    (``cgroup2fs``) and containerd's runc driving it through systemd (``crictl info``: ``SystemdCgroup`` true),
    the driver the kubelet's configuration names."""
    words = dict(w.split("=", 1) for w in detail.split() if "=" in w)
    return event == "runtime" and words.get("cgroup") == "cgroup2fs" and words.get("systemd") == "true"


def guest_script(console: str) -> str:
    """The guests' script, saying its steps on ``console`` (a device name under /dev, of the architecture table)."""
    return GUEST_SCRIPT.replace(CONSOLE, console)


def _seed(cluster: str, join: str, index: int, console: str = "ttyS0") -> dict[str, str]:
    """The NoCloud seed of guest ``index`` (0 or 1): its pod range's CNI configuration, the cluster's kubeadm
    configuration (for the list of a control plane's images), its join configuration and the script. No key of the
    cluster's: a join needs the token and the CA's hash only."""
    write = [
        {"path": "/etc/cni/net.d/10-node-check.conflist", "content": json.dumps(_cni_config(NODE_SUBNETS[index]),
                                                                                indent=2), "permissions": "0644"},
        {"path": "/root/node-check/kubeadm.yaml", "content": cluster, "permissions": "0600"},
        {"path": "/root/node-check/join.yaml", "content": join, "permissions": "0600"},
        {"path": "/root/node-check/run.sh", "content": guest_script(console), "permissions": "0700"},
    ]  # fmt: skip
    user_data = {"write_files": write, "runcmd": [["/root/node-check/run.sh"]]}
    return {
        "meta-data": yaml.safe_dump({"instance-id": f"node-check-{index + 1}", "local-hostname": NODE_NAMES[index]}),
        "user-data": "#cloud-config\n" + yaml.safe_dump(user_data, sort_keys=False),
    }


def _image_program(root: Path, work: Path, expected: dict[str, Any], name: str) -> Path:
    """The image's own ``/usr/bin/<name>`` (kubectl, kubeadm), copied out, after checking it is the release
    manifest's (and a real program)."""
    source = safe_join(root, f"usr/bin/{name}", what=f"the image's {name}")  # its links stay in the image
    if not source.is_file():
        raise InputError(f"the image has no /usr/bin/{name}", expected="an image built with a Kubernetes release")
    with source.open("rb") as fh:
        if fh.read(4) != b"\x7fELF":
            raise InputError(
                f"the image's {name} is not a program (a stand-in release's script?)",
                expected="an image of a real release: image-builder release.build, or the distro's",
            )
    want = next((a.get("sha256") for a in expected["plan"]["artifacts"] if a["name"] == name), None)
    copy = work / name
    shutil.copyfile(source, copy)
    copy.chmod(0o700)
    if want and sha256_file(copy) != want:
        raise InputError(f"the image's {name} differs from the release manifest's", expected=f"sha256 {want}")
    return copy


def _images(expected: dict[str, Any]) -> dict[str, str]:
    images = {a["name"]: a["uri"] for a in expected["plan"]["artifacts"] if a["kind"] == "image"}
    missing = {"kube-apiserver", "etcd", "coredns", "pause"} - set(images)
    if missing:
        raise InputError(f"the build manifest names no {', '.join(sorted(missing))} image")
    return images


class _Console:
    """The guest's ``NODE-CHECK`` lines, read from its serial console as they come."""

    def __init__(self, guest: qemu.Guest) -> None:
        self.guest = guest

    def events(self) -> list[tuple[str, str]]:
        out = []
        for line in self.guest.console(0).splitlines():
            if line.startswith(MARK + " "):
                event, _, detail = line[len(MARK) + 1 :].strip().partition(" ")
                out.append((event, detail))
        return out

    def wait(self, wanted: tuple[str, ...], failures: tuple[str, ...], timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event, detail in self.events():
                if event in wanted or event in failures:
                    return event, detail
            if reason := self.guest.exited():
                raise ExternalError(f"the guest stopped: {reason}")
            time.sleep(2)
        return "timeout", f"none of {', '.join(wanted)} within {timeout:.0f} s"

    def journal(self, since: str | None = None, wait: float = 0) -> str:
        """What the guest printed of a failure: from its ``since`` line (the failed command's output follows it),
        else from ``journal-begin``, to ``journal-end`` (the kubelet's and containerd's journal). ``wait``: how long
        the guest may take to print it all (it writes the journal after it reports the failure); without any
        marker, the console's tail."""
        deadline = time.monotonic() + wait
        while True:
            text = self.guest.console(0)
            start = text.rfind(f"{MARK} {since}" if since else f"{MARK} journal-begin")
            end = text.find(f"{MARK} journal-end", max(start, 0))
            if (start >= 0 and end >= 0) or time.monotonic() >= deadline or self.guest.exited():
                break
            time.sleep(1)
        if start < 0:
            return self.guest.console(3000)
        return text[start : end + len(f"{MARK} journal-end") if end >= 0 else None]


def _poll(what: str, check: Callable[[], tuple[bool, str]], timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    ok, detail = check()
    while not ok and time.monotonic() < deadline:
        time.sleep(5)
        ok, detail = check()
    return ok, detail if ok else f"{what}: {detail} (after {timeout:.0f} s)"


def _pod_phases(kubectl: Kubectl) -> dict[str, str]:
    """kube-system's pods: name -> ``Running, ready`` (its phase, and whether every container passed its probes)."""
    pods = kubectl.json("get", "pods", "-n", "kube-system")
    out = {}
    for pod in pods["items"]:
        status = pod["status"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        out[pod["metadata"]["name"]] = f"{status.get('phase', '?')}, {'ready' if ready else 'not ready'}"
    return out


def _node_ready(kubectl: Kubectl, name: str = NODE_NAME) -> tuple[bool, str]:
    try:
        node = kubectl.json("get", "node", name)
    except ExternalError as exc:
        return False, str(exc)
    conditions = {c["type"]: c for c in node["status"].get("conditions", [])}
    ready = conditions.get("Ready", {})
    info = node["status"].get("nodeInfo", {})
    detail = (f"Ready={ready.get('status', '?')} ({ready.get('reason', '')}); kubelet {info.get('kubeletVersion')}, "
              f"{info.get('containerRuntimeVersion')}, {info.get('osImage')}")  # fmt: skip
    return ready.get("status") == "True", detail


def _pods_running(kubectl: Kubectl, prefixes: tuple[str, ...]) -> tuple[bool, str]:
    """Every kube-system pod of each prefix Running and ready (and at least one of each)."""
    try:
        phases = _pod_phases(kubectl)
    except ExternalError as exc:
        return False, str(exc)
    found = {c: {n: p for n, p in phases.items() if n.startswith(f"{c}-")} for c in prefixes}
    detail = ", ".join(f"{n} {p}" for pods in found.values() for n, p in sorted(pods.items()))
    absent = [c for c, pods in found.items() if not pods]
    if absent:
        detail += ("; " if detail else "") + "no pod of " + ", ".join(absent)
    states = [p for pods in found.values() for p in pods.values()]
    return not absent and all(p == "Running, ready" for p in states), detail


def _test_pod(pause: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "node-check", "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "pause", "image": pause, "imagePullPolicy": "Never"}],
        },
    }  # fmt: skip


def _pod_state(kubectl: Kubectl) -> tuple[bool, str]:
    try:
        pod = kubectl.json("get", "pod", "node-check", "-n", "default")
    except ExternalError as exc:
        return False, str(exc)
    phase = pod["status"].get("phase", "?")
    waiting = [
        f"{s['state']['waiting'].get('reason')}: {s['state']['waiting'].get('message', '')[:200]}"
        for s in pod["status"].get("containerStatuses", [])
        if "waiting" in s.get("state", {})
    ]
    # a Pending pod without container statuses is unscheduled or waits for its sandbox: its conditions say which
    unmet = [
        f"{c['type']}={c['status']}" + (f" {c['reason']}: {c.get('message', '')[:200]}" if c.get("reason") else "")
        for c in pod["status"].get("conditions", [])
        if c.get("status") != "True"
    ]
    detail = f"phase {phase}" + "".join(f" ({'; '.join(part)})" for part in (waiting, unmet) if part)
    return phase == "Running", detail


def _pod_events(kubectl: Kubectl, name: str) -> str:
    """The newest events of a pod (why it is not Running: scheduling, sandbox creation, the image), for a failure's
    detail."""
    proc = kubectl.run("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}",
                       "--sort-by=.lastTimestamp", "-o", "custom-columns=AGE:.lastTimestamp,REASON:.reason,"
                       "FROM:.source.component,MESSAGE:.message", "--no-headers")  # fmt: skip
    lines = proc.stdout.strip().splitlines()[-12:] if proc.returncode == 0 else [proc.stderr.strip()[-300:]]
    return "events: " + ("\n  ".join(["", *lines]) if lines else "none")


def node_check(
    raw: Path,
    expected: dict[str, Any],
    *,
    firmware: Firmware = "bios",
    timeout: float = 2400,
    join: bool = False,
    say: Say = silent,
) -> list[Step]:
    """Boot ``raw`` (left untouched) as a node of a control plane the host runs from the image's own programs, and
    check it; ``join``: a second copy joins as a second node, and the test pod runs there. One :class:`Step` each,
    timed; steps after a failed one are not run (its detail carries the guest's journal, or the component's log)."""
    steps: list[Step] = []
    machine = recorded(expected["plan"], "the build manifest")  # an arm64 node boots under qemu-system-aarch64
    images = _images(expected)
    version = expected["plan"].get("kubernetes_version") or _split(images["kube-apiserver"])[1]
    tags = {name: _split(images[name])[1] for name in controlplane.PROGRAMS if name in images}
    tags.update({name: version for name in controlplane.PROGRAMS if name not in images})
    began = time.monotonic()

    def step(name: str, ok: bool, detail: str, since: float) -> None:
        done = Step(name, ok, detail, time.monotonic() - since)
        steps.append(done)
        say(f"node check: {name}: {'ok' if ok else 'FAILED'} ({done.seconds:.0f} s) {detail[:100]}")
        if not ok:
            raise _Failed(done)

    def left() -> float:
        return max(60.0, timeout - (time.monotonic() - began))

    with run_tempdir("node-check") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        work.chmod(0o700)
        try:
            t = time.monotonic()
            (work / "bin").mkdir(mode=0o700)
            with mounted_root(raw) as root:
                kubectl_binary = _image_program(root, work, expected, "kubectl")
                kubeadm_binary = _image_program(root, work, expected, "kubeadm")
                try:
                    programs = controlplane.image_programs(root, tags, work / "bin")
                except ExternalError as exc:
                    step("control plane on the host", False, str(exc), t)
            if problem := machine.emulation_problem():
                step("control plane on the host", False, f"the image's programs are {machine.name}: {problem}", t)
            pki = controlplane.pki(work)
            port = qemu.free_port()
            joining = Join(f"{secrets.token_hex(3)}.{secrets.token_hex(8)}", pki.ca_hash,
                           controlplane.Endpoint(port).guest)  # fmt: skip
            cluster = kubeadm_config(images, version, joining)
            try:
                endpoint = stack.enter_context(
                    controlplane.running(programs, kubeadm_binary, kubectl_binary, cluster, work, port)
                )
            except ExternalError as exc:
                step("control plane on the host", False, str(exc), t)
            kubectl = Kubectl(kubectl_binary, work / "admin.conf")
            step("control plane on the host", True,
                 f"the image's etcd, API server, controller manager and scheduler on {endpoint.host} "
                 f"({endpoint.guest} from the guests), kubeadm's phases", t)  # fmt: skip
            added = ""
            if emulation.emulated(machine):  # what hardware would have given the guest (its clock, devices on time)
                raw, added = emulation.patched_copy(raw, work, machine, clock=True)
                say(f"node check: {added}")

            def boot(index: int, cpus: int, memory_mb: int) -> _Console:
                folder = work / f"guest-{index + 1}"
                folder.mkdir()
                node_join = join_config(version, joining, NODE_NAMES[index])
                seed = qemu.seed_iso(_seed(cluster, node_join, index, machine.console), folder)
                guest = stack.enter_context(qemu.running(
                    raw, serial=folder / "serial.log", snapshot=True, cdrom=seed, memory_mb=memory_mb, cpus=cpus,
                    firmware=firmware, machine=machine))  # fmt: skip
                return _Console(guest)

            def joined(console: _Console, name: str, label: str) -> None:
                t = time.monotonic()
                event, detail = console.wait(("started",), (), min(900.0, left()))
                step(f"{label}boot and cloud-init", event == "started",
                     f"the seed's script started ({console.guest.how}{'; ' + added if added else ''})"
                     if event == "started" else f"{detail}; console ends: {console.guest.console(600)}", t)  # fmt: skip
                t = time.monotonic()
                event, detail = console.wait(("runtime",), ("containerd-down",), 300)
                step(f"{label}runtime: systemd cgroups on cgroup v2", runtime_ok(event, detail),
                     f"crictl info and the guest's /sys/fs/cgroup: {detail}", t)  # fmt: skip
                t = time.monotonic()
                event, detail = console.wait(("images-ok",), ("images-missing", "images-failed", "containerd-down"),
                                             300)  # fmt: skip
                step(f"{label}preloaded images", event == "images-ok",
                     f"every image kubeadm {version} asks for is in containerd: {detail}" if event == "images-ok"
                     else f"{event}: {detail}", t)  # fmt: skip
                t = time.monotonic()
                event, detail = console.wait(("join-ok",), ("join-failed", "api-unreachable"), left())
                step(f"{label}kubeadm join", event == "join-ok",
                     f"to {joining.endpoint} with the bootstrap token and the pinned CA" if event == "join-ok"
                     else f"{event}: {detail}\n{console.journal(since=event, wait=90)}", t)  # fmt: skip
                t = time.monotonic()
                ok, detail = _poll("node Ready", lambda: _node_ready(kubectl, name), min(900.0, left()))
                step(f"{label}node Ready", ok, detail if ok else f"{detail}\n{console.journal()}", t)

            say(f"node check: booting the image under QEMU to join the control plane on {endpoint.host}")
            # the node's vCPUs by the rule every guest of this tool follows: two under KVM, and emulated one per two
            # host cores (two vCPU threads take both cores of a 2-core host from the control plane beside them, and
            # wait for each other's next slice: emulation.vcpus)
            joined(boot(0, emulation.vcpus(machine), 2048), NODE_NAME, "")
            pod_node = NODE_NAME
            if join:  # the second guest boots once the first is a node: one guest's vCPUs at a time on the cores
                joined(boot(1, 1, 2048), WORKER_NAME, "second node: ")
                pod_node = WORKER_NAME
            t = time.monotonic()
            # under TCG kube-proxy takes minutes from its start to its first rules, and CoreDNS is not ready until
            # it reaches the API server through them
            ok, detail = _poll("kube-proxy and CoreDNS", lambda: _pods_running(kubectl, ADDONS), min(1200.0, left()))
            step("kube-proxy and CoreDNS Running", ok, detail, t)
            t = time.monotonic()
            pod = json.dumps(_test_pod(images["pause"], pod_node))

            def create() -> tuple[bool, str]:  # the default service account appears a little after the phases
                proc = kubectl.run("apply", "-f", "-", stdin=pod)
                return proc.returncode == 0, proc.stderr.strip()[-200:]

            ok, detail = _poll("test pod created", create, min(600.0, left()))
            if ok:
                ok, detail = _poll("test pod Running", lambda: _pod_state(kubectl), min(1200.0, left()))
                if not ok:
                    detail += f"\n{_pod_events(kubectl, 'node-check')}\n{_node_ready(kubectl, pod_node)[1]}"
            step("test pod Running", ok, f"{images['pause']} on {pod_node} (preloaded, never pulled): {detail}", t)
            t = time.monotonic()
            gone = kubectl.run("delete", "pod", "node-check", "-n", "default", "--wait=true", "--timeout=300s")
            ok = gone.returncode == 0 and kubectl.run("get", "pod", "node-check", "-n", "default").returncode != 0
            step("test pod deleted", ok, "deleted and gone" if ok else gone.stderr.strip()[-300:], t)
        except _Failed:
            pass
    total = time.monotonic() - began
    steps.append(Step("node check", all(s.ok for s in steps), f"{len(steps)} steps in {total:.0f} s", total))
    return steps


__all__ = ["Join", "Step", "join_config", "kubeadm_config", "node_check", "runtime_ok"]
