"""The node check's control plane: etcd, the API server, the controller manager and the scheduler of the image
itself, run on the build host for the image's guests to join as nodes.

Why on the host: under TCG a 1.36 control plane inside the guest is most of the guest's work. Alone on an idle
2-core host, ``kubeadm init`` took 365 s before the node's own work began; beside another guest its components missed
their probes, restarted, and never finished (seen on 2026-11-29). Run natively from the same programs (the image's
containerd keeps its preloaded images unpacked: :func:`image_programs` takes them from there, so the check runs what
the image ships), the control plane is up in seconds and the guest does what every node of a cluster does: its
containerd and kubelet, ``kubeadm join`` with a bootstrap token and the pinned CA, kube-proxy, CoreDNS and a pod.

The host's side is kubeadm's own where kubeadm has a phase for it (``init phase upload-config``, ``bootstrap-token``,
``addon``: the ConfigMaps, the RBAC rules and the addons a join needs, from the image's kubeadm), and the four
components' command lines, which kubeadm writes into static pods, here. The guests reach the host's loopback as
``10.0.2.2``, QEMU's user network's address of the host, so the API server listens on 127.0.0.1 only and is
advertised as 10.0.2.2 (the ``kubernetes`` service's endpoint, the address the joins discover).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.safepath import safe_join

#: the host as the guests see it on QEMU's user network (its loopback)
HOST_FROM_GUEST = "10.0.2.2"
SERVICE_SUBNET = "10.96.0.0/12"
#: the ``kubernetes`` service's address (the first of :data:`SERVICE_SUBNET`), a name on the API server's certificate
SERVICE_IP = "10.96.0.1"
#: where containerd keeps the unpacked layers of its images, in the image
SNAPSHOTS = "var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"
#: the programs the control plane runs, each from the image of the same name
PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: where those images keep their program
PROGRAM_DIRS = ("usr/local/bin", "usr/bin", "bin")


def _version_of(program: Path) -> str:
    try:
        proc = subprocess.run([str(program), "--version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(does not run: {exc})"
    return (proc.stdout + proc.stderr).strip().splitlines()[0] if (proc.stdout + proc.stderr).strip() else ""


def image_programs(root: Path, tags: dict[str, str], dest: Path) -> dict[str, Path]:
    """The control plane's programs from the image mounted at ``root``: each one found in the unpacked layers of
    containerd's preloaded images, the one whose ``--version`` names its image's tag (``tags``: program ->
    ``v1.36.3``, ``3.6.8-0``) where layers of several versions hold it, copied into ``dest`` (0700). Raises
    ExternalError naming the program the image does not hold (an image whose images were imported unpacked)."""
    out = {}
    refused: list[str] = []
    layers = []
    try:  # the image's links resolve inside the image (and each program's inside its layer), never on the host
        snapshots = safe_join(root, SNAPSHOTS, what="containerd's snapshots")
        for entry in sorted(snapshots.iterdir()) if snapshots.is_dir() else ():
            layers.append(safe_join(snapshots, f"{entry.name}/fs", what="a snapshot"))
    except InputError as exc:
        refused.append(str(exc))
    for name in PROGRAMS:
        found = []
        for layer in layers:
            for folder in PROGRAM_DIRS:
                try:
                    program = safe_join(layer, f"{folder}/{name}", what="a program")
                except InputError as exc:
                    refused.append(str(exc))
                    continue
                if program.is_file():
                    found.append(program)
        if not found:
            raise ExternalError(
                f"the image's containerd holds no unpacked {name} ({SNAPSHOTS}/*/fs/usr/local/bin/{name})"
                + (f": {refused[0]}" if refused else ""),
                hint="an image whose images containerd imported and unpacked (image-builder build does)",
            )
        copies = []
        for index, program in enumerate(found):
            copy = dest / (name if len(found) == 1 else f"{name}.{index}")
            shutil.copyfile(program, copy)
            copy.chmod(0o700)
            copies.append(copy)
        want = tags[name].lstrip("v").split("-")[0]
        chosen = copies[0] if len(copies) == 1 else next((c for c in copies if want in _version_of(c)), copies[0])
        out[name] = chosen
    return out


@dataclass(frozen=True)
class Endpoint:
    """Where the control plane answers: ``port`` on the host's 127.0.0.1, the guests' 10.0.2.2."""

    port: int

    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def guest(self) -> str:
        return f"{HOST_FROM_GUEST}:{self.port}"


def kubeconfig(server: str, ca: bytes, cert: Path | None = None, key: Path | None = None) -> str:
    """A kubeconfig of ``server`` (its CA inline), with a client certificate and key when given (without: the form
    of kubeadm's ``cluster-info``, which a join discovers)."""
    user = {"client-certificate": str(cert), "client-key": str(key)} if cert and key else {}
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {"certificate-authority-data": base64.b64encode(ca).decode(),
                                              "server": server}}],
        "users": [{"name": "admin", "user": user}] if user else [],
        "contexts": [{"name": "admin", "context": {"cluster": "", "user": "admin"}}] if user else [],
        "current-context": "admin" if user else "",
        "preferences": {},
    }, sort_keys=False)  # fmt: skip


def commands(
    programs: dict[str, Path], work: Path, port: int, etcd: tuple[int, int], serving: tuple[int, int]
) -> dict[str, list[str]]:
    """The four components' command lines: the API server on 127.0.0.1:``port`` (advertised as 10.0.2.2), etcd on
    the ``etcd`` (client, peer) ports of 127.0.0.1 only (plain HTTP: nothing but this API server reaches it), the
    controller manager and scheduler serving their health on the ``serving`` ports, all with the admin's kubeconfig.
    Every file named is in the 0700 ``work`` folder."""
    pki, admin = work / "pki", str(work / "admin.conf")
    client, peer = etcd
    return {
        "etcd": [str(programs["etcd"]), "--name", "node-check", "--data-dir", str(work / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"node-check=http://127.0.0.1:{peer}"],
        "kube-apiserver": [str(programs["kube-apiserver"]), "--bind-address=127.0.0.1", f"--secure-port={port}",
                           f"--advertise-address={HOST_FROM_GUEST}", f"--etcd-servers=http://127.0.0.1:{client}",
                           f"--service-cluster-ip-range={SERVICE_SUBNET}", f"--client-ca-file={pki}/ca.crt",
                           f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
                           "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                           f"--service-account-key-file={pki}/sa.pub",
                           f"--service-account-signing-key-file={pki}/sa.key",
                           "--authorization-mode=Node,RBAC", "--enable-bootstrap-token-auth=true",
                           "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true"],
        "kube-controller-manager": [str(programs["kube-controller-manager"]), f"--kubeconfig={admin}",
                                    f"--authentication-kubeconfig={admin}", f"--authorization-kubeconfig={admin}",
                                    "--bind-address=127.0.0.1", f"--secure-port={serving[0]}",
                                    "--controllers=*,bootstrapsigner,tokencleaner", "--leader-elect=false",
                                    f"--cluster-signing-cert-file={pki}/ca.crt",
                                    f"--cluster-signing-key-file={pki}/ca.key", f"--root-ca-file={pki}/ca.crt",
                                    f"--service-account-private-key-file={pki}/sa.key",
                                    "--use-service-account-credentials=true"],
        "kube-scheduler": [str(programs["kube-scheduler"]), f"--kubeconfig={admin}",
                           f"--authentication-kubeconfig={admin}", f"--authorization-kubeconfig={admin}",
                           "--bind-address=127.0.0.1", f"--secure-port={serving[1]}", "--leader-elect=false"],
    }  # fmt: skip


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def serving(cmds: dict[str, list[str]], work: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Run each command (its output in ``work``/<name>.log) for the block, then end them: SIGTERM, then SIGKILL
    after 15 s. Each inherits the run's tag (:mod:`imagebuilder.core.runs`), so a run killed outright leaves them
    to the next run's clean-up."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, cmd in cmds.items():
            with (work / f"{name}.log").open("wb") as log:
                procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                               cwd=work)  # fmt: skip
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def exited(procs: dict[str, subprocess.Popen[bytes]], work: Path) -> str:
    """The first component that is no longer running, with its log's end; empty while all run."""
    for name, proc in procs.items():
        if proc.poll() is not None:
            return f"{name} exited ({proc.returncode}):\n{tail(work / f'{name}.log')}"
    return ""


@dataclass(frozen=True)
class Pki:
    """The check's cluster PKI, in ``work``/pki (0700): the CA's certificate (inline in every kubeconfig) and the
    SHA-256 of its public key, which a join pins."""

    folder: Path
    ca: bytes
    ca_hash: str


def pki(work: Path) -> Pki:
    """A cluster CA, the API server's serving certificate (127.0.0.1 for the host, 10.0.2.2 for the guests, the
    ``kubernetes`` service's address and names for pods), an admin client certificate (``system:masters``: the
    host's kubectl, kubeadm's phases, the controller manager and the scheduler) and the service accounts' signing
    key. P-256 keys throughout (why: the guests' TLS handshakes run under TCG, where a P-256 signature costs a
    fraction of an RSA 2048 one); valid for the day of the check."""
    import datetime as dt
    import hashlib
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = work / "pki"
    folder.mkdir(mode=0o700)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])

    def write(name: str, data: bytes) -> None:
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o600)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())  # fmt: skip

    def issue(name: str, subject: x509.Name, key: ec.EllipticCurvePrivateKey,
              extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:  # fmt: skip
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + dt.timedelta(days=1)))  # fmt: skip
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        cert = builder.sign(ca_key, hashes.SHA256())
        write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        write(f"{name}.key", key_pem(key))
        return cert

    usage = x509.KeyUsage(True, False, True, False, False, False, False, False, False)
    ca = issue("ca", ca_name, ca_key, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (x509.KeyUsage(True, False, True, False, False, True, True, False, False), True)])  # fmt: skip
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    addresses = ["127.0.0.1", HOST_FROM_GUEST, SERVICE_IP]
    san = x509.SubjectAlternativeName([*map(x509.DNSName, names),
                                       *(x509.IPAddress(ipaddress.ip_address(a)) for a in addresses)])  # fmt: skip
    issue("apiserver", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
          ec.generate_private_key(ec.SECP256R1()),
          [(san, False), (usage, True), (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)])  # fmt: skip
    issue("admin", x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                              x509.NameAttribute(NameOID.COMMON_NAME, "image-builder-node-check")]),
          ec.generate_private_key(ec.SECP256R1()),
          [(usage, True), (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)])  # fmt: skip
    sa = ec.generate_private_key(ec.SECP256R1())
    write("sa.key", key_pem(sa))
    write("sa.pub", sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    spki = ca.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Pki(folder, ca.public_bytes(serialization.Encoding.PEM), hashlib.sha256(spki).hexdigest())


class Kubectl:
    """The image's kubectl with a kubeconfig: a command's result, or its JSON (ExternalError when it fails)."""

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


#: kubeadm's phases that give a cluster what ``kubeadm join`` and a node's addons need, run on the host against
#: the host's API server: the kubeadm and kubelet ConfigMaps, the bootstrap token with its RBAC rules (the join's
#: discovery, its CSR approved), and kube-proxy and CoreDNS
KUBEADM_PHASES = (("upload-config", "all"), ("bootstrap-token", "--skip-token-print"), ("addon", "all"))


def _ready(kubectl: Kubectl) -> tuple[bool, str]:
    proc = kubectl.run("get", "--raw=/readyz")
    return proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.stdout + proc.stderr).strip()[-300:]


@contextlib.contextmanager
def running(
    programs: dict[str, Path], kubeadm: Path, kubectl: Path, config: str, work: Path, port: int, timeout: float = 300
) -> Iterator[Endpoint]:
    """The control plane on 127.0.0.1:``port`` for the block (its components ended after it): etcd and the API
    server from ``programs``, then, the API server ready, the controller manager and the scheduler; kubeadm's phases
    (:data:`KUBEADM_PHASES`) with ``config`` (an InitConfiguration with the join's bootstrap token, and a
    ClusterConfiguration whose controlPlaneEndpoint is the guests' address), then ``cluster-info`` at the guests'
    address (kubeadm's phase writes the host's, from the admin's kubeconfig; the controller manager's bootstrap signer
    signs it again for the token). ``work`` holds :func:`pki`'s folder. Raises ExternalError with the failing
    component's log (or kubeadm's output)."""
    from imagebuilder.image.qemu import free_port

    ca = (work / "pki/ca.crt").read_bytes()
    admin = work / "admin.conf"
    admin.write_text(kubeconfig(f"https://127.0.0.1:{port}", ca, work / "pki/admin.crt", work / "pki/admin.key"))
    admin.chmod(0o600)
    (work / "etcd").mkdir(mode=0o700)
    (work / "kubeadm.yaml").write_text(config)
    (work / "kubeadm.yaml").chmod(0o600)
    cmds = commands(programs, work, port, (free_port(), free_port()), (free_port(), free_port()))
    ctl = Kubectl(kubectl, admin)
    # the controllers start once the API server is ready: their first requests time out and they exit on a slow one
    # (an arm64 image's control plane, emulated by qemu-user here, lost its controller manager to a TLS handshake
    # timeout while the API server started)
    store = {name: cmd for name, cmd in cmds.items() if name in ("etcd", "kube-apiserver")}
    controllers = {name: cmd for name, cmd in cmds.items() if name not in store}
    with serving(store, work) as procs, contextlib.ExitStack() as later:
        deadline = time.monotonic() + timeout
        ok, detail = _ready(ctl)
        while not ok:
            if gone := exited(procs, work):
                raise ExternalError(f"the control plane on the host: {gone}")
            if time.monotonic() > deadline:
                raise ExternalError(f"the control plane on the host: the API server not ready after {timeout:.0f} s: "
                                    f"{detail}\n{tail(work / 'kube-apiserver.log')}")  # fmt: skip
            time.sleep(1)
            ok, detail = _ready(ctl)
        procs.update(later.enter_context(serving(controllers, work)))
        patch = json.dumps({"data": {"kubeconfig": kubeconfig(f"https://{HOST_FROM_GUEST}:{port}", ca)}})
        steps: list[tuple[list[str], str]] = [
            ([str(kubeadm), "init", "phase", phase, arg, "--config", str(work / "kubeadm.yaml"), "--kubeconfig",
              str(admin)], f"kubeadm init phase {phase}") for phase, arg in KUBEADM_PHASES]  # fmt: skip
        steps.append(([*ctl.args, "patch", "configmap", "cluster-info", "-n", "kube-public", "--type", "merge", "-p",
                       patch], "cluster-info at the guests' address"))  # fmt: skip
        for argv, what in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
            if proc.returncode != 0:
                raise ExternalError(f"the control plane on the host: {what}: {(proc.stdout + proc.stderr)[-800:]}")
        yield Endpoint(port)


__all__ = ["HOST_FROM_GUEST", "Endpoint", "Kubectl", "Pki", "image_programs", "kubeconfig", "pki", "running"]
