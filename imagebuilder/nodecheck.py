"""The node check (``image.verify --kubernetes``): an image is proven by a node that becomes Ready on it.

A throwaway copy of the image boots under QEMU (KVM when usable, else TCG) with a NoCloud seed. cloud-init runs
one script there: it lists what this kubeadm will pull (``kubeadm config images list``) against containerd's
preloaded images, then ``kubeadm init`` brings up a single-node control plane from those images alone (no
registry, no network beyond QEMU's user network), with a bridge CNI configuration of the installed CNI plugins.
The script reports each step on the serial console, and on a failure the kubelet's and containerd's journal.

The host then checks the node as a cluster's user would, with the image's own kubectl over a forwarded port on
127.0.0.1: the node Ready, the control-plane pods Running and ready, kubeadm's addons (kube-proxy, whose rules route
the service network, and CoreDNS, which is ready only once it reaches the API server through them) Running and ready,
one pod of the preloaded pause
image Running and then deleted. The cluster's CA and an admin client certificate are made here (kubeadm uses a CA it
finds in place), so nothing has to be copied out of the guest; keys live in a 0700 work folder removed with the
check.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imagebuilder import qemu
from imagebuilder.catalog import Firmware
from imagebuilder.disk import mounted_root
from imagebuilder.errors import ExternalError, InputError
from imagebuilder.files import sha256_file
from imagebuilder.progress import Say, silent

#: what the guest says on its serial console, one line each: ``NODE-CHECK <event> [detail]``
MARK = "NODE-CHECK"
POD_SUBNET = "10.244.0.0/16"
NODE_NAME = "node-check"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
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


def _ca_and_admin(work: Path) -> dict[str, bytes]:
    """A cluster CA for kubeadm to use, and an admin client certificate of it (``system:masters``) for the host."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    admin_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    admin_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "image-builder-node-check"),
        ]
    )
    admin = (
        x509.CertificateBuilder()
        .subject_name(admin_name)
        .issuer_name(ca_name)
        .public_key(admin_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def pem_key(key: rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())  # fmt: skip

    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": pem_key(ca_key),
        "admin.crt": admin.public_bytes(serialization.Encoding.PEM),
        "admin.key": pem_key(admin_key),
    }


def _split(ref: str) -> tuple[str, str]:
    """``registry.k8s.io/coredns/coredns:v1.12.1`` -> (``registry.k8s.io/coredns``, ``v1.12.1``)."""
    name, tag = ref.rsplit(":", 1)
    return name.rsplit("/", 1)[0], tag


def kubeadm_config(images: dict[str, str], kubernetes_version: str) -> str:
    """kubeadm's configuration for a node of these images: the repository and tags the manifest names, so kubeadm
    asks for exactly what the image preloaded (a distro's ``v1.24.8-eks-1-24-5`` tags included)."""
    repo, tag = _split(images["kube-apiserver"])
    etcd_repo, etcd_tag = _split(images["etcd"])
    dns_repo, dns_tag = _split(images["coredns"])
    minor = int(kubernetes_version.lstrip("v").split(".")[1])
    api = "kubeadm.k8s.io/v1beta4" if minor >= 31 else "kubeadm.k8s.io/v1beta3"
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": api,
            "kind": "InitConfiguration",
            "nodeRegistration": {
                "name": NODE_NAME,
                "criSocket": "unix:///run/containerd/containerd.sock",
            },
        },
        {
            "apiVersion": api,
            "kind": "ClusterConfiguration",
            "kubernetesVersion": tag,
            "imageRepository": repo,
            "apiServer": {"certSANs": ["127.0.0.1"]},
            "networking": {"podSubnet": POD_SUBNET, "serviceSubnet": "10.96.0.0/12"},
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


CNI_CONFIG = {
    "cniVersion": "1.0.0",
    "name": "node-check",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}  # fmt: skip

#: the guest's side, run once by cloud-init; every line it says goes to the serial console the host reads
GUEST_SCRIPT = f"""#!/bin/sh
out=/dev/ttyS0
say() {{ echo "{MARK} $*" > $out; }}
journal() {{
  say journal-begin
  journalctl -u containerd -u kubelet --no-pager -n 120 -o cat > $out 2>&1
  say journal-end
}}
cd /root/node-check || exit 1
export KUBECONFIG=/etc/kubernetes/admin.conf
say started
i=0
until ctr version >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 120 ] || {{ say containerd-down; journal; exit 1; }}; sleep 1
done
wanted=$(kubeadm config images list --config kubeadm.yaml 2>kubeadm-images.log) || {{
  say images-failed "$(tail -n 3 kubeadm-images.log | tr '\\n' ' ')"; exit 1; }}
have=$(ctr -n k8s.io images ls -q)
missing=""
for ref in $wanted; do
  echo "$have" | grep -qxF "$ref" || missing="$missing $ref"
done
if [ -n "$missing" ]; then say images-missing$missing; else say images-ok $(echo $wanted); fi
say init-begin
if kubeadm init --config kubeadm.yaml > init.log 2>&1; then
  say init-ok
else
  say init-failed
  tail -n 40 init.log > $out
  journal
  exit 1
fi
i=0
ready='{{.status.conditions[?(@.type=="Ready")].status}}'
until kubectl get node {NODE_NAME} -o jsonpath="$ready" 2>/dev/null | grep -qx True; do
  i=$((i + 1)); [ $i -lt 180 ] || {{ say not-ready; kubectl describe node {NODE_NAME} > $out 2>&1; journal; exit 1; }}
  sleep 5
done
say ready
"""


def _seed(files: dict[str, bytes], kubeadm: str) -> dict[str, str]:
    write = [
        {"path": "/etc/kubernetes/pki/ca.crt", "content": files["ca.crt"].decode(), "permissions": "0644"},
        {"path": "/etc/kubernetes/pki/ca.key", "content": files["ca.key"].decode(), "permissions": "0600"},
        {"path": "/root/node-check/kubeadm.yaml", "content": kubeadm, "permissions": "0600"},
        {"path": "/etc/cni/net.d/10-node-check.conflist", "content": json.dumps(CNI_CONFIG, indent=2),
         "permissions": "0644"},
        {"path": "/root/node-check/run.sh", "content": GUEST_SCRIPT, "permissions": "0700"},
    ]  # fmt: skip
    user_data = {"write_files": write, "runcmd": [["/root/node-check/run.sh"]]}
    return {
        "meta-data": yaml.safe_dump({"instance-id": "node-check-1", "local-hostname": NODE_NAME}),
        "user-data": "#cloud-config\n" + yaml.safe_dump(user_data, sort_keys=False),
    }


def _kubeconfig(files: dict[str, bytes], work: Path, port: int) -> Path:
    for name in ("ca.crt", "admin.crt", "admin.key"):
        (work / name).write_bytes(files[name])
        (work / name).chmod(0o600)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "node-check", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                       "certificate-authority": str(work / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(work / "admin.crt"),
                                             "client-key": str(work / "admin.key")}}],
        "contexts": [{"name": "node-check", "context": {"cluster": "node-check", "user": "admin"}}],
        "current-context": "node-check",
    }  # fmt: skip
    path = work / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class _Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.args = [str(binary), "--kubeconfig", str(kubeconfig), "--request-timeout=30s"]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.args, *args], input=stdin, capture_output=True, text=True, timeout=90,
                              check=False)  # fmt: skip

    def json(self, *args: str) -> Any:
        proc = self.run(*args, "-o", "json")
        if proc.returncode != 0:
            raise ExternalError(f"kubectl {' '.join(args)}: {proc.stderr.strip()[-300:]}")
        return json.loads(proc.stdout)


def _image_kubectl(root: Path, work: Path, expected: dict[str, Any]) -> Path:
    """The image's own kubectl, copied out, after checking it is the release manifest's (and a real binary)."""
    source = root / "usr/bin/kubectl"
    if not source.is_file():
        raise InputError("the image has no /usr/bin/kubectl", expected="an image built with a Kubernetes release")
    with source.open("rb") as fh:
        if fh.read(4) != b"\x7fELF":
            raise InputError(
                "the image's kubectl is not a program (a stand-in release's script?)",
                expected="an image of a real release: image-builder release.build, or the distro's",
            )
    want = next((a.get("sha256") for a in expected["plan"]["artifacts"] if a["name"] == "kubectl"), None)
    copy = work / "kubectl"
    shutil.copyfile(source, copy)
    copy.chmod(0o700)
    if want and sha256_file(copy) != want:
        raise InputError("the image's kubectl differs from the release manifest's", expected=f"sha256 {want}")
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

    def journal(self) -> str:
        text = self.guest.console(0)
        start = text.rfind(f"{MARK} journal-begin")
        if start < 0:
            return self.guest.console(3000)
        return text[start : text.find(f"{MARK} journal-end", start) + 1 or None]


def _poll(what: str, check: Callable[[], tuple[bool, str]], timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    ok, detail = check()
    while not ok and time.monotonic() < deadline:
        time.sleep(5)
        ok, detail = check()
    return ok, detail if ok else f"{what}: {detail} (after {timeout:.0f} s)"


def _pod_phases(kubectl: _Kubectl) -> dict[str, str]:
    """kube-system's pods: name -> ``Running, ready`` (its phase, and whether every container passed its probes)."""
    pods = kubectl.json("get", "pods", "-n", "kube-system")
    out = {}
    for pod in pods["items"]:
        status = pod["status"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        out[pod["metadata"]["name"]] = f"{status.get('phase', '?')}, {'ready' if ready else 'not ready'}"
    return out


def _node_ready(kubectl: _Kubectl) -> tuple[bool, str]:
    try:
        node = kubectl.json("get", "node", NODE_NAME)
    except ExternalError as exc:
        return False, str(exc)
    conditions = {c["type"]: c for c in node["status"].get("conditions", [])}
    ready = conditions.get("Ready", {})
    info = node["status"].get("nodeInfo", {})
    detail = (f"Ready={ready.get('status', '?')} ({ready.get('reason', '')}); kubelet {info.get('kubeletVersion')}, "
              f"{info.get('containerRuntimeVersion')}, {info.get('osImage')}")  # fmt: skip
    return ready.get("status") == "True", detail


def _pods_running(kubectl: _Kubectl, prefixes: tuple[str, ...]) -> tuple[bool, str]:
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


def _test_pod(pause: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "node-check", "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "pause", "image": pause, "imagePullPolicy": "Never"}],
        },
    }  # fmt: skip


def _pod_state(kubectl: _Kubectl) -> tuple[bool, str]:
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
    return phase == "Running", f"phase {phase}" + (f" ({'; '.join(waiting)})" if waiting else "")


def node_check(
    raw: Path,
    expected: dict[str, Any],
    *,
    firmware: Firmware = "bios",
    timeout: float = 2400,
    say: Say = silent,
) -> list[Step]:
    """Boot ``raw`` (left untouched), bring a single-node cluster up on it and check it; one :class:`Step` each,
    timed. Steps after a failed one are not run (the failure's detail carries the guest's journal)."""
    steps: list[Step] = []
    images = _images(expected)
    version = expected["plan"].get("kubernetes_version") or _split(images["kube-apiserver"])[1]
    began = time.monotonic()

    def step(name: str, ok: bool, detail: str, since: float) -> None:
        done = Step(name, ok, detail, time.monotonic() - since)
        steps.append(done)
        say(f"node check: {name}: {'ok' if ok else 'FAILED'} ({done.seconds:.0f} s) {detail[:100]}")
        if not ok:
            raise _Failed(done)

    with tempfile.TemporaryDirectory(prefix="node-check-") as tmp:
        work = Path(tmp)
        work.chmod(0o700)
        with mounted_root(raw) as root:
            kubectl_binary = _image_kubectl(root, work, expected)
        files = _ca_and_admin(work)
        seed = qemu.seed_iso(_seed(files, kubeadm_config(images, version)), work)
        port = qemu.free_port()
        kubectl = _Kubectl(kubectl_binary, _kubeconfig(files, work, port))
        say(f"node check: booting the image under QEMU with kubeadm's seed (API server on 127.0.0.1:{port})")
        with qemu.running(raw, serial=work / "serial.log", snapshot=True, cdrom=seed, memory_mb=3072,
                          firmware=firmware, forwards=((port, 6443),)) as guest:  # fmt: skip
            console = _Console(guest)
            try:
                t = time.monotonic()
                event, detail = console.wait(("started",), (), min(900.0, timeout))
                step("boot and cloud-init", event == "started",
                     f"the seed's script started ({guest.accelerator})" if event == "started" else
                     f"{detail}; console ends: {guest.console(600)}", t)  # fmt: skip
                t = time.monotonic()
                event, detail = console.wait(("images-ok",), ("images-missing", "images-failed", "containerd-down"),
                                             300)  # fmt: skip
                step("preloaded images", event == "images-ok",
                     f"every image kubeadm {version} asks for is in containerd: {detail}" if event == "images-ok"
                     else f"{event}: {detail}", t)  # fmt: skip
                t = time.monotonic()
                event, detail = console.wait(("init-ok",), ("init-failed",), timeout - (time.monotonic() - began))
                step("kubeadm init", event == "init-ok",
                     "single-node control plane, offline, from the preloaded images" if event == "init-ok"
                     else f"{event}: {detail}\n{console.journal()}", t)  # fmt: skip
                t = time.monotonic()
                ok, detail = _poll("node Ready", lambda: _node_ready(kubectl), 600)
                step("node Ready", ok, detail if ok else f"{detail}\n{console.journal()}", t)
                t = time.monotonic()
                ok, detail = _poll("control-plane pods", lambda: _pods_running(kubectl, CONTROL_PLANE), 600)
                step("control-plane pods Running", ok, detail, t)
                t = time.monotonic()
                ok, detail = _poll("kube-proxy and CoreDNS", lambda: _pods_running(kubectl, ADDONS), 600)
                step("kube-proxy and CoreDNS Running", ok, detail, t)
                t = time.monotonic()
                pod = json.dumps(_test_pod(images["pause"]))

                def create() -> tuple[bool, str]:  # the default service account appears a little after init
                    proc = kubectl.run("apply", "-f", "-", stdin=pod)
                    return proc.returncode == 0, proc.stderr.strip()[-200:]

                ok, detail = _poll("test pod created", create, 300)
                if ok:
                    ok, detail = _poll("test pod Running", lambda: _pod_state(kubectl), 600)
                step("test pod Running", ok, f"{images['pause']} (preloaded, never pulled): {detail}", t)
                t = time.monotonic()
                gone = kubectl.run("delete", "pod", "node-check", "-n", "default", "--wait=true", "--timeout=300s")
                ok = gone.returncode == 0 and kubectl.run("get", "pod", "node-check", "-n", "default").returncode != 0
                step("test pod deleted", ok, "deleted and gone" if ok else gone.stderr.strip()[-300:], t)
            except _Failed:
                pass
    total = time.monotonic() - began
    steps.append(Step("node check", all(s.ok for s in steps), f"{len(steps)} steps in {total:.0f} s", total))
    return steps


__all__ = ["Step", "kubeadm_config", "node_check"]
