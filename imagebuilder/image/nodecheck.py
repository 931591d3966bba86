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

import contextlib
import datetime as dt
import hashlib
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from imagebuilder.core.arch import recorded
from imagebuilder.core.disk import copy_sparse, mounted_root, run_tempdir
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import sha256_file
from imagebuilder.core.hostinfo import kvm_status
from imagebuilder.core.progress import Say, silent
from imagebuilder.image import qemu
from imagebuilder.release.catalog import Firmware

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

    Key = EllipticCurvePrivateKey | RSAPrivateKey

#: what the guest says on its serial console, one line each: ``NODE-CHECK <event> [detail]``
MARK = "NODE-CHECK"
POD_SUBNET = "10.244.0.0/16"
#: each node's part of the pod range (the bridge plugin's host-local addresses)
NODE_SUBNETS = ("10.244.0.0/24", "10.244.1.0/24")
NODE_NAME = "node-check"
WORKER_NAME = "node-check-2"
#: the private wire between the two guests of a join: RFC 2544's benchmarking range, inside the guests only
WIRE_IPS = ("198.18.0.10", "198.18.0.11")
#: the guests' NICs: on QEMU's user network, and on the wire
MACS = (("52:54:00:6e:63:01", "52:54:00:6e:63:11"), ("52:54:00:6e:63:02", "52:54:00:6e:63:12"))
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


def _ca_and_admin(work: Path, *, ecdsa: bool) -> dict[str, bytes]:
    """A cluster CA for kubeadm to use, and an admin client certificate of it (``system:masters``) for the host;
    ``ecdsa``: P-256 keys (the cluster's algorithm, :func:`kubeadm_config`), else RSA 2048 as kubeadm's default."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    def new_key() -> Key:
        return ec.generate_private_key(ec.SECP256R1()) if ecdsa else rsa.generate_private_key(65537, 2048)

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])

    def issue(subject: x509.Name, key: Key, extension: x509.ExtensionType, critical: bool) -> Any:
        """A certificate of ``key`` for ``subject``, signed by the CA's key, valid for the day of the check."""
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(extension, critical=critical)
        )
        if key is ca_key:
            builder = builder.add_extension(
                x509.KeyUsage(True, False, True, False, False, True, True, False, False), critical=True
            )
        return builder.sign(ca_key, hashes.SHA256())

    ca = issue(ca_name, ca_key, x509.BasicConstraints(ca=True, path_length=None), True)
    admin_key = new_key()
    admin_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "image-builder-node-check"),
        ]
    )
    admin = issue(admin_name, admin_key, x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), False)

    def pem_key(key: Key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())  # fmt: skip

    spki = ca.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.hash": hashlib.sha256(spki).hexdigest().encode(),
        "ca.key": pem_key(ca_key),
        "admin.crt": admin.public_bytes(serialization.Encoding.PEM),
        "admin.key": pem_key(admin_key),
    }


def _split(ref: str) -> tuple[str, str]:
    """``registry.k8s.io/coredns/coredns:v1.12.1`` -> (``registry.k8s.io/coredns``, ``v1.12.1``)."""
    name, tag = ref.rsplit(":", 1)
    return name.rsplit("/", 1)[0], tag


@dataclass(frozen=True)
class Join:
    """A second node joining the first over a private wire between the two guests: the bootstrap token kubeadm
    init creates and the join presents, and the CA's public-key hash the join pins."""

    token: str
    ca_hash: str


def _api(kubernetes_version: str) -> tuple[str, int]:
    minor = int(kubernetes_version.lstrip("v").split(".")[1])
    return ("kubeadm.k8s.io/v1beta4" if minor >= 31 else "kubeadm.k8s.io/v1beta3"), minor


#: kubeadm's waits on a node check: its defaults (4-5 minutes) are tight for a guest emulated on a shared host (TCG);
#: the node check's own deadline still bounds the whole check
SLOW_HOST_WAIT = "20m0s"
#: the key algorithm of the node check's cluster from kubeadm 1.31 on (v1beta4's ``encryptionAlgorithm``; older
#: releases keep RSA 2048). Why: every TLS handshake with the API server is a signature by its serving key, and under
#: TCG an RSA 2048 signature costs tens of milliseconds of the emulated CPUs where P-256 costs a fraction of one. The
#: 1.36 control plane's clients (the kubelet, the controller manager, the scheduler, the API server's own loopback,
#: the probes) gave up on handshakes after 10 s and tried again, and the retries kept the two vCPUs busy until the
#: API server never answered one (seen on 2026-11-29, kubeadm init unfinished after 15 minutes)
CLUSTER_KEYS = "ECDSA-P256"
#: where the first guest's kubeadm finds its patches of the control plane's static pods (:func:`probe_patches`)
PATCHES_DIR = "/root/node-check/patches"


def probe_patches() -> dict[str, str]:
    """kubeadm's patches (strategic merge, one file per static pod) that give the control plane's probes the time an
    emulated guest needs: kubeadm's defaults kill a component whose health endpoint has not answered within 15 s,
    8 times running (24 times from its start). Under TCG on a busy or slower host, the 1.36 API server and etcd
    answered later than that, the kubelet restarted them (7 restarts in 10 minutes of one check, seen here), and
    every restart began the slow start again: kubeadm init never finished, where on a faster host it took 100 s.
    Only the probes kubeadm writes for every component are patched (a probe the patch added would have no handler,
    and the kubelet would refuse the pod): liveness and startup, and the API server's readiness."""
    patient = {"timeoutSeconds": 60, "periodSeconds": 20}
    patches = {}
    for component in CONTROL_PLANE:
        probes: dict[str, Any] = {
            "livenessProbe": {**patient, "failureThreshold": 30},
            "startupProbe": {**patient, "failureThreshold": 90},
        }
        if component == "kube-apiserver":
            probes["readinessProbe"] = {"timeoutSeconds": 60}
        patches[f"{component}.yaml"] = yaml.safe_dump({"spec": {"containers": [{"name": component, **probes}]}},
                                                      sort_keys=False)  # fmt: skip
    return patches


def _timeouts(minor: int) -> dict[str, Any]:
    """The fields that lengthen kubeadm's waits (v1beta4's ``timeouts``, kubeadm 1.31+); older releases take
    ``apiServer.timeoutForControlPlane`` and ``discovery.timeout`` instead, set where those documents are built."""
    if minor < 31:
        return {}
    # kubernetesAPICall and etcdAPICall bound kubeadm's retries of one call (1 and 2 minutes by default): kubeadm
    # 1.36 creates the admin's ClusterRoleBinding while the API server under TCG still answers in more than that
    return {"timeouts": {"controlPlaneComponentHealthCheck": SLOW_HOST_WAIT, "kubeletHealthCheck": SLOW_HOST_WAIT,
                         "kubernetesAPICall": SLOW_HOST_WAIT, "etcdAPICall": SLOW_HOST_WAIT,
                         "tlsBootstrap": SLOW_HOST_WAIT, "discovery": SLOW_HOST_WAIT}}  # fmt: skip


def _args(args: dict[str, str], minor: int) -> list[dict[str, str]] | dict[str, str]:
    """Extra arguments as kubeadm's API of that release takes them: v1beta4 (1.31+) a list of name/value pairs,
    v1beta3 a map."""
    return [{"name": k, "value": v} for k, v in args.items()] if minor >= 31 else dict(args)


def _node_registration(name: str, ip: str | None, minor: int) -> dict[str, Any]:
    registration: dict[str, Any] = {"name": name, "criSocket": "unix:///run/containerd/containerd.sock"}
    if ip is not None:  # the kubelet's address on the wire, not QEMU's user network (the same 10.0.2.15 on both)
        # v1beta4 takes a list of name/value pairs where v1beta3 took a map
        registration["kubeletExtraArgs"] = _args({"node-ip": ip}, minor)
    return registration


def kubeadm_config(images: dict[str, str], kubernetes_version: str, join: Join | None = None) -> str:
    """kubeadm's configuration for a node of these images: the repository and tags the manifest names, so kubeadm
    asks for exactly what the image preloaded (a distro's ``v1.24.8-eks-1-24-5`` tags included); with ``join``,
    the API server advertised on the wire and a bootstrap token for the second node."""
    repo, tag = _split(images["kube-apiserver"])
    etcd_repo, etcd_tag = _split(images["etcd"])
    dns_repo, dns_tag = _split(images["coredns"])
    api, minor = _api(kubernetes_version)
    init: dict[str, Any] = {
        "apiVersion": api,
        "kind": "InitConfiguration",
        "nodeRegistration": _node_registration(NODE_NAME, WIRE_IPS[0] if join else None, minor),
        **_timeouts(minor),
        "patches": {"directory": PATCHES_DIR},
    }
    if join is not None:
        init["localAPIEndpoint"] = {"advertiseAddress": WIRE_IPS[0], "bindPort": 6443}
        init["bootstrapTokens"] = [{"token": join.token, "ttl": "2h", "usages": ["signing", "authentication"],
                                    "groups": ["system:bootstrappers:kubeadm:default-node-token"]}]  # fmt: skip
    docs: list[dict[str, Any]] = [
        init,
        {
            "apiVersion": api,
            "kind": "ClusterConfiguration",
            "kubernetesVersion": tag,
            "imageRepository": repo,
            **({"encryptionAlgorithm": CLUSTER_KEYS} if minor >= 31 else {}),
            "apiServer": {
                "certSANs": ["127.0.0.1"],
                # the API server's own checks of etcd (in its /livez and /readyz) give up after 2 s by default;
                # under TCG etcd answered reads in up to 2 s, so the API server was not ready while it served
                **(
                    {"extraArgs": _args({"etcd-healthcheck-timeout": "30s", "etcd-readycheck-timeout": "30s"}, minor)}
                    if minor >= 31
                    else {"timeoutForControlPlane": SLOW_HOST_WAIT}
                ),
            },
            # one control plane: no leader to elect. Under TCG the API server of 1.36 answers the leases' renewals
            # late, and a controller manager that loses its lease restarts (six times in one check) and holds up
            # kube-proxy's and CoreDNS's pods
            "controllerManager": {"extraArgs": _args({"leader-elect": "false"}, minor)},
            "scheduler": {"extraArgs": _args({"leader-elect": "false"}, minor)},
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


def join_config(kubernetes_version: str, join: Join) -> str:
    """The second node's ``kubeadm join`` configuration: the first node's API server on the wire, the token, the
    CA pinned by its public-key hash."""
    api, minor = _api(kubernetes_version)
    discovery: dict[str, Any] = {"bootstrapToken": {"apiServerEndpoint": f"{WIRE_IPS[0]}:6443", "token": join.token,
                                                    "caCertHashes": [f"sha256:{join.ca_hash}"]}}  # fmt: skip
    if minor < 31:
        discovery["timeout"] = SLOW_HOST_WAIT
    return yaml.safe_dump({
        "apiVersion": api,
        "kind": "JoinConfiguration",
        "discovery": discovery,
        "nodeRegistration": _node_registration(WORKER_NAME, WIRE_IPS[1], minor),
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


#: how both guests' scripts begin: ``say`` reports a step on the serial console the host reads, ``journal`` shows
#: the kubelet's and containerd's
SCRIPT_HEAD = f"""#!/bin/sh
out=/dev/ttyS0
say() {{ echo "{MARK} $*" > $out; }}
journal() {{
  say journal-begin
  journalctl -u containerd -u kubelet --no-pager -n 120 -o cat > $out 2>&1
  say journal-end
}}
cd /root/node-check || exit 1
"""

#: what the first guest says of its runtime (``say runtime ...``, read by :func:`runtime_ok`): the cgroup
#: hierarchy's file system type, the ``SystemdCgroup`` that ``crictl info`` reports containerd's runc runs with, and
#: the version containerd's server states
RUNTIME_REPORT = """cgroup=$(stat -fc %T /sys/fs/cgroup)
crictl --runtime-endpoint unix:///run/containerd/containerd.sock info > crictl-info.json 2>&1
systemd=$(grep -o '"SystemdCgroup": *[a-z]*' crictl-info.json | head -n 1 | grep -o '[a-z]*$')
server=$(ctr version 2>/dev/null | awk '/Version:/ {v = $2} END {print v}')
say runtime "cgroup=$cgroup" "systemd=${systemd:-unknown}" "containerd=$server"
"""

#: the first guest's side, run once by cloud-init: preloaded images, kubeadm init, the node Ready
GUEST_SCRIPT = (
    SCRIPT_HEAD
    + """export KUBECONFIG=/etc/kubernetes/admin.conf
say started
i=0
until ctr version >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 120 ] || { say containerd-down; journal; exit 1; }; sleep 1
done
"""
    + RUNTIME_REPORT
    + f"""wanted=$(kubeadm config images list --config kubeadm.yaml 2>kubeadm-images.log) || {{
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
)


#: the second node's side: wait for the first node's API server on the wire, then kubeadm join
WORKER_SCRIPT = (
    SCRIPT_HEAD
    + f"""say started
i=0
until curl -ks --max-time 5 https://{WIRE_IPS[0]}:6443/healthz | grep -qx ok; do
  i=$((i + 1)); [ $i -lt 400 ] || {{ say api-unreachable; ip addr > $out; exit 1; }}; sleep 5
done
say api-reachable
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


def _network_config(index: int) -> str:
    """netplan for guest ``index``: DHCP on QEMU's user network, its fixed address on the wire (NICs by MAC)."""
    uplink, wire = MACS[index]
    return yaml.safe_dump({"version": 2, "ethernets": {
        "uplink": {"match": {"macaddress": uplink}, "dhcp4": True},
        "wire": {"match": {"macaddress": wire}, "dhcp4": False, "addresses": [f"{WIRE_IPS[index]}/24"]},
    }}, sort_keys=False)  # fmt: skip


def _seed(files: dict[str, bytes], kubeadm: str, *, index: int = 0, joined: bool = False) -> dict[str, str]:
    """The NoCloud seed of guest ``index``: 0 runs kubeadm init (with the CA), 1 joins it."""
    write = [
        {"path": "/etc/cni/net.d/10-node-check.conflist", "content": json.dumps(_cni_config(NODE_SUBNETS[index]),
                                                                                indent=2), "permissions": "0644"},
        {"path": f"/root/node-check/{'kubeadm' if index == 0 else 'join'}.yaml", "content": kubeadm,
         "permissions": "0600"},
        {"path": "/root/node-check/run.sh", "content": GUEST_SCRIPT if index == 0 else WORKER_SCRIPT,
         "permissions": "0700"},
    ]  # fmt: skip
    if index == 0:
        write += [
            {"path": "/etc/kubernetes/pki/ca.crt", "content": files["ca.crt"].decode(), "permissions": "0644"},
            {"path": "/etc/kubernetes/pki/ca.key", "content": files["ca.key"].decode(), "permissions": "0600"},
        ]
        write += [{"path": f"{PATCHES_DIR}/{name}", "content": patch, "permissions": "0600"}
                  for name, patch in probe_patches().items()]  # fmt: skip
    user_data = {"write_files": write, "runcmd": [["/root/node-check/run.sh"]]}
    seed = {
        "meta-data": yaml.safe_dump(
            {"instance-id": f"node-check-{index + 1}", "local-hostname": NODE_NAME if index == 0 else WORKER_NAME}
        ),
        "user-data": "#cloud-config\n" + yaml.safe_dump(user_data, sort_keys=False),
    }
    if joined:
        seed["network-config"] = _network_config(index)
    return seed


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


def _pod_phases(kubectl: _Kubectl) -> dict[str, str]:
    """kube-system's pods: name -> ``Running, ready`` (its phase, and whether every container passed its probes)."""
    pods = kubectl.json("get", "pods", "-n", "kube-system")
    out = {}
    for pod in pods["items"]:
        status = pod["status"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        out[pod["metadata"]["name"]] = f"{status.get('phase', '?')}, {'ready' if ready else 'not ready'}"
    return out


def _node_ready(kubectl: _Kubectl, name: str = NODE_NAME) -> tuple[bool, str]:
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
    # a Pending pod without container statuses is unscheduled or waits for its sandbox: its conditions say which
    unmet = [
        f"{c['type']}={c['status']}" + (f" {c['reason']}: {c.get('message', '')[:200]}" if c.get("reason") else "")
        for c in pod["status"].get("conditions", [])
        if c.get("status") != "True"
    ]
    detail = f"phase {phase}" + "".join(f" ({'; '.join(part)})" for part in (waiting, unmet) if part)
    return phase == "Running", detail


def _pod_events(kubectl: _Kubectl, name: str) -> str:
    """The newest events of a pod (why it is not Running: scheduling, sandbox creation, the image), for a failure's
    detail."""
    proc = kubectl.run("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}",
                       "--sort-by=.lastTimestamp", "-o", "custom-columns=AGE:.lastTimestamp,REASON:.reason,"
                       "FROM:.source.component,MESSAGE:.message", "--no-headers")  # fmt: skip
    lines = proc.stdout.strip().splitlines()[-12:] if proc.returncode == 0 else [proc.stderr.strip()[-300:]]
    return "events: " + ("\n  ".join(["", *lines]) if lines else "none")


#: the kernel parameter the node check's throwaway copy boots with under TCG (:func:`_emulated_clock_copy`)
TCG_CLOCK = "tsc=reliable"


def with_kernel_parameter(text: str, parameter: str, *, bls: bool = False) -> tuple[str, int]:
    """``text`` (a GRUB configuration, or with ``bls`` a Boot Loader Specification entry) with ``parameter`` added
    to every kernel command line it holds (GRUB's ``linux``/``linuxefi`` lines, a BLS entry's ``options``), and how
    many lines that was. A line that has it already is left as it is."""
    keys = ("options",) if bls else ("linux", "linuxefi", "linux16")
    lines, changed = text.splitlines(keepends=True), 0
    for i, line in enumerate(lines):
        words = line.split()
        if words and words[0] in keys and parameter not in words[1:]:
            body = line.rstrip("\r\n")
            lines[i] = f"{body} {parameter}{line[len(body) :]}"
            changed += 1
    return "".join(lines), changed


def _emulated_clock_copy(raw: Path, work: Path) -> tuple[Path, str]:
    """A sparse copy of ``raw`` in ``work`` whose kernel command lines add :data:`TCG_CLOCK`, and what was done.

    Why: under TCG the guest's kernel finds its emulated CPUs' TSCs unsynchronized (QEMU's vCPUs are host threads
    that read the host's TSC at different moments) and falls back to the HPET, so every clock read is an emulated
    device access served under QEMU's global lock. kubeadm's control plane is Go, whose runtime reads the clock
    constantly: with two vCPUs on HPET the 1.36 API server did not finish a TLS handshake for 10 minutes on an idle
    host (seen on 2026-11-29). Real hardware and KVM give the kernel synchronized TSCs, so the copy is told what
    they would have told it; the image itself is not changed, and its own boot check boots it as it is."""
    copy = work / "node.raw"
    copy_sparse(raw, copy)
    patched = 0
    with mounted_root(copy, writable=True) as root:
        configs = [(root / c, False) for c in ("boot/grub/grub.cfg", "boot/grub2/grub.cfg")]
        configs += [(c, True) for c in sorted((root / "boot/loader/entries").glob("*.conf"))]
        for config, bls in configs:
            if config.is_file() and not config.is_symlink():
                text, n = with_kernel_parameter(config.read_text(), TCG_CLOCK, bls=bls)
                if n:
                    config.write_text(text)
                    patched += n
    if not patched:
        return copy, f"no kernel command line found to add {TCG_CLOCK} to (the guest keeps the HPET)"
    return copy, f"booted with {TCG_CLOCK} (TCG: the emulated TSCs fail the kernel's sync check)"


def node_check(
    raw: Path,
    expected: dict[str, Any],
    *,
    firmware: Firmware = "bios",
    timeout: float = 2400,
    join: bool = False,
    say: Say = silent,
) -> list[Step]:
    """Boot ``raw`` (left untouched), bring a single-node cluster up on it and check it; ``join``: a second copy
    joins it as a worker over a private wire between the two guests, and the test pod runs there. One
    :class:`Step` each, timed; steps after a failed one are not run (its detail carries the guest's journal)."""
    steps: list[Step] = []
    machine = recorded(expected["plan"], "the build manifest")  # an arm64 node boots under qemu-system-aarch64
    images = _images(expected)
    version = expected["plan"].get("kubernetes_version") or _split(images["kube-apiserver"])[1]
    began = time.monotonic()

    def step(name: str, ok: bool, detail: str, since: float) -> None:
        done = Step(name, ok, detail, time.monotonic() - since)
        steps.append(done)
        say(f"node check: {name}: {'ok' if ok else 'FAILED'} ({done.seconds:.0f} s) {detail[:100]}")
        if not ok:
            raise _Failed(done)

    def left() -> float:
        return max(60.0, timeout - (time.monotonic() - began))

    with run_tempdir("node-check") as tmp, contextlib.ExitStack() as guests:
        work = Path(tmp)
        work.chmod(0o700)
        with mounted_root(raw) as root:
            kubectl_binary = _image_kubectl(root, work, expected)
        clock = ""
        if machine.name == "amd64" and not kvm_status().usable:
            raw, clock = _emulated_clock_copy(raw, work)
            say(f"node check: {clock}")
        files = _ca_and_admin(work, ecdsa=_api(version)[1] >= 31)
        token = f"{secrets.token_hex(3)}.{secrets.token_hex(8)}"
        joining = Join(token, files["ca.hash"].decode()) if join else None
        (work / "first").mkdir()
        seed = qemu.seed_iso(_seed(files, kubeadm_config(images, version, joining), joined=join), work / "first")
        port = qemu.free_port()
        wire = qemu.free_port() if join else 0
        kubectl = _Kubectl(kubectl_binary, _kubeconfig(files, work, port))
        say(f"node check: booting the image under QEMU with kubeadm's seed (API server on 127.0.0.1:{port})")
        guest = guests.enter_context(qemu.running(
            raw, serial=work / "serial.log", snapshot=True, cdrom=seed, memory_mb=3072, firmware=firmware,
            machine=machine, forwards=((port, 6443),), mac=MACS[0][0] if join else None,
            link=qemu.Link(wire, MACS[0][1], listen=True) if join else None))  # fmt: skip
        console = _Console(guest)
        try:
            t = time.monotonic()
            event, detail = console.wait(("started",), (), min(900.0, timeout))
            step("boot and cloud-init", event == "started",
                 f"the seed's script started ({guest.how}{', ' + TCG_CLOCK if clock.startswith('booted') else ''})"
                 if event == "started" else
                 f"{detail}; console ends: {guest.console(600)}", t)  # fmt: skip
            t = time.monotonic()
            event, detail = console.wait(("runtime",), ("containerd-down",), 300)
            step("runtime: systemd cgroups on cgroup v2", runtime_ok(event, detail),
                 f"crictl info and the guest's /sys/fs/cgroup: {detail}", t)  # fmt: skip
            t = time.monotonic()
            event, detail = console.wait(("images-ok",), ("images-missing", "images-failed", "containerd-down"),
                                         300)  # fmt: skip
            step("preloaded images", event == "images-ok",
                 f"every image kubeadm {version} asks for is in containerd: {detail}" if event == "images-ok"
                 else f"{event}: {detail}", t)  # fmt: skip
            t = time.monotonic()
            event, detail = console.wait(("init-ok",), ("init-failed",), left())
            step("kubeadm init", event == "init-ok",
                 "control plane, offline, from the preloaded images" if event == "init-ok"
                 else f"{event}: {detail}\n{console.journal(since=event, wait=90)}", t)  # fmt: skip
            # the second guest boots once the first's control plane is up (beside kubeadm init, its vCPU slowed
            # 1.36's init past 11 minutes under TCG) and joins while kube-proxy and CoreDNS come up; one vCPU is
            # enough for a worker (kubeadm asks for two on a control plane only), and under TCG the two guests' vCPUs
            # are host threads that share the host's cores: a third thread instead of a fourth leaves the control
            # plane more of them
            if joining is not None:
                (work / "second").mkdir()
                second_seed = qemu.seed_iso(_seed(files, join_config(version, joining), index=1, joined=True),
                                            work / "second")  # fmt: skip
                worker = guests.enter_context(qemu.running(
                    raw, serial=work / "serial-2.log", snapshot=True, cdrom=second_seed, memory_mb=2048, cpus=1,
                    firmware=firmware, mac=MACS[1][0], link=qemu.Link(wire, MACS[1][1], listen=False),
                    machine=machine))  # fmt: skip
            t = time.monotonic()
            ok, detail = _poll("node Ready", lambda: _node_ready(kubectl), 600)
            step("node Ready", ok, detail if ok else f"{detail}\n{console.journal()}", t)
            t = time.monotonic()
            ok, detail = _poll("control-plane pods", lambda: _pods_running(kubectl, CONTROL_PLANE), 600)
            step("control-plane pods Running", ok, detail, t)
            pod_node = NODE_NAME
            if joining is not None:
                second = _Console(worker)
                t = time.monotonic()
                event, detail = second.wait(("join-ok",), ("join-failed", "api-unreachable"), left())
                joined = event == "join-ok"
                step("second node joined", joined,
                     f"kubeadm join over the wire ({WIRE_IPS[1]} -> {WIRE_IPS[0]}:6443), token and pinned CA" if joined
                     else f"{event}: {detail}\n{second.journal(since=event, wait=90)}", t)  # fmt: skip
                t = time.monotonic()
                ok, detail = _poll("second node Ready", lambda: _node_ready(kubectl, WORKER_NAME), 900)
                step("second node Ready", ok, detail if ok else f"{detail}\n{second.journal()}", t)
                pod_node = WORKER_NAME
            t = time.monotonic()
            # under TCG a 1.36 kube-proxy takes minutes from its start to its first rules, and CoreDNS is not
            # ready until it reaches the API through them (557 s of this wait, measured alone)
            ok, detail = _poll("kube-proxy and CoreDNS", lambda: _pods_running(kubectl, ADDONS), min(1200.0, left()))
            step("kube-proxy and CoreDNS Running", ok, detail, t)
            t = time.monotonic()
            pod = json.dumps(_test_pod(images["pause"], pod_node))

            def create() -> tuple[bool, str]:  # the default service account appears a little after init
                proc = kubectl.run("apply", "-f", "-", stdin=pod)
                return proc.returncode == 0, proc.stderr.strip()[-200:]

            # (both waits as long as the check has left, up to 10 and 20 minutes: under TCG a 1.36 control plane's
            # controllers and a kubelet's sandbox take minutes)
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
