"""build --engine chroot, the shared OS layer and build.matrix (issue 18), for real.

The fast part: the engine choice and its errors, the emitted CI definitions checked against the official schemas
with check-jsonschema (its vendored GitHub workflow and GitLab CI schemas), hostile values in them, the chroot
mounts' promises (host kernel settings read-only, resolv.conf and policy-rc.d put back, a workspace with a mount
left never removed). The slow part, as root in a network namespace with only loopback: a 2-channel build.matrix
from the debootstrapped base image with a directory mirror: one OS layer built once and shared, both images pass
image.verify (testinfra; one boots), a rerun skips both. The Packer-vs-chroot parity test of the same inputs is in
tests/integration/test_e2e_offline.py, where the Packer build already runs."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from imagebuilder.core.files import sha256_file
from imagebuilder.release.source import RuntimeBuild
from imagebuilder.release.standin import ReleaseRuntime
from tests.support.common import (
    BIN,
    EXAMPLES,
    ROOT,
    group_alive,
    kill_at,
    leaked_scratch,
    loops_on,
    run,
    run_folders,
    tagged,
    vm_turn,
)

BASE = ["--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--offline"]


def write_config(tmp_path: Path, source: str = "http://images.example/base.qcow2") -> Path:
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": source, "source_image_checksum": "sha256:" + "a" * 64}))
    return config


def test_engine_flag_is_checked_and_explained(tmp_path: Path) -> None:
    res = run("build", *BASE, "--engine", "chrot", "--dry-run")
    assert res.code == 2 and "did you mean 'chroot'" in res.err and "--engine" in res.err
    # an ISO install needs a VM: chroot is refused, auto falls back to packer and says why
    res = run("build", *BASE, "--engine", "chroot", "--dry-run")
    assert res.code == 2 and "needs one" in res.err and "source_image_url" in res.err
    res = run("build", *BASE, "--engine", "auto", "--dry-run", "--output", "json")
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["engine"] == "packer" and "needs a VM" in plan["engine_reason"]


@pytest.mark.parametrize(("accel", "engine"), [("tcg", "chroot"), ("kvm", "packer")])
def test_auto_picks_chroot_for_an_image_based_build_only_without_kvm(
    tmp_path: Path, accel: str, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    monkeypatch.setenv("IMAGE_BUILDER_ACCEL", accel)  # what kvm_status reports, as a host without/with KVM
    config = write_config(tmp_path)
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                                  configs={"baremetal": str(config)}, engine="auto"))  # fmt: skip
    assert plan.engine == engine and accel in plan.engine_reason
    if engine == "chroot":
        assert any(s.startswith("chroot: ") for s in plan.steps)
        assert not any(s.startswith("packer: ") for s in plan.steps)


def emitted(tmp_path: Path, kind: str, *extra: str) -> Path:
    out = tmp_path / f"{kind}.yml"
    res = run("build.matrix", "--pairs", "ubuntu:baremetal,ubuntu:vsphere", "--release-channel", "1-23,1-24",
              "--offline", "--engine", "auto", "--emit", kind, "--emit-file", str(out), *extra)  # fmt: skip
    assert res.code == 0, res.err
    return out


@pytest.mark.parametrize(("kind", "schema"), [("github-actions", "vendor.github-workflows"),
                                              ("gitlab-ci", "vendor.gitlab-ci")])  # fmt: skip
def test_emitted_ci_definitions_follow_the_official_schemas(
    tmp_path: Path, kind: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMAGE_BUILDER_ACCEL", "tcg")
    # a hostile path: spaces, quotes, a command substitution; it must reach each job as one argument, inert
    hostile = tmp_path / "we ird'$(touch pwned)\"" / "bm.json"
    hostile.parent.mkdir()
    hostile.write_text(
        json.dumps(
            {"source_image_url": "http://images.example/base.qcow2", "source_image_checksum": "sha256:" + "a" * 64}
        )
    )
    vsphere = EXAMPLES / "vsphere-ubuntu.json"
    out = emitted(tmp_path, kind, "--baremetal-config", str(hostile), "--vsphere-config", str(vsphere),
                  "--ci-publish", "s3://node-images/repo", "--ci-sign")  # fmt: skip
    check = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", schema, str(out)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    doc = yaml.safe_load(out.read_text())
    graph = ci_graph(doc, kind)
    # the bare-metal builds (chroot: an image-based build without KVM) share one OS layer job, cached by the
    # layer's inputs digest; the vSphere builds (Packer) need none; one publish job needs every image job
    assert graph["build-ubuntu-baremetal-efi-chroot"][0] == ["os-layer-ubuntu-20-04"]
    assert graph["build-ubuntu-vsphere-bios-packer"][0] == []
    assert graph["publish"][0] == ["build-ubuntu-baremetal-efi-chroot", "build-ubuntu-vsphere-bios-packer"]
    commands = [c for _needs, lines in graph.values() for c in lines if " build.matrix " in c]
    assert len(commands) == 3  # the layer's, and one per pair fanned out over both lines
    for command in commands:
        argv = shlex.split(command)
        assert argv[:2] == [".venv/bin/image-builder", "build.matrix"]
        if "--baremetal-config" in argv:
            assert argv[argv.index("--baremetal-config") + 1] == str(hostile)
            assert argv[argv.index("--engine") + 1] == "chroot"
        if "--vsphere-config" in argv:  # its config holds a password: a secret file, never the path given
            assert argv[argv.index("--vsphere-config") + 1] == "$IMAGE_BUILDER_VSPHERE_CONFIG_FILE"
    assert "IMAGE_BUILDER_VSPHERE_CONFIG (a file)" in out.read_text() and str(vsphere) not in out.read_text()
    # the quoted command runs nothing: its substitution stays text
    subprocess.run(["sh", "-c", "printf '%s\\n' " + shlex.quote(str(hostile))], cwd=tmp_path, check=True,
                   capture_output=True)  # fmt: skip
    assert not (tmp_path / "pwned").exists()


def ci_graph(doc: dict[str, object], kind: str) -> dict[str, tuple[list[str], list[str]]]:
    """job -> (the jobs it needs, its command lines with the matrix's variable as the shell sees it), from either
    file: what the two CI systems would run."""
    graph: dict[str, tuple[list[str], list[str]]] = {}
    if kind == "github-actions":
        for job_id, job in doc["jobs"].items():  # type: ignore[attr-defined]
            lines = [ln for step in job["steps"] if "run" in step for ln in step["run"].split("\n")]
            graph[job_id] = (list(job.get("needs", [])), lines)
    else:
        for job_id, job in doc.items():
            if job_id != "stages":
                graph[job_id] = ([n["job"] for n in job["needs"]], list(job["script"]))  # type: ignore[index]
    return graph


def test_the_github_workflow_and_the_gitlab_pipeline_are_one_graph_running_the_same_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: the same jobs, the same needs, the same image-builder commands (the secret files' and the removal
    lines are each system's own), and the workflow passes actionlint (rhysd/actionlint, the real one)."""
    monkeypatch.setenv("IMAGE_BUILDER_ACCEL", "tcg")
    config = write_config(tmp_path)
    flags = ("--baremetal-config", str(config), "--vsphere-config", str(EXAMPLES / "vsphere-ubuntu.json"),
             "--ci-publish", "s3://node-images/repo", "--ci-sign", "--ci-concurrency", "3")  # fmt: skip
    graphs = {kind: ci_graph(yaml.safe_load(emitted(tmp_path, kind, *flags).read_text()), kind)
              for kind in ("github-actions", "gitlab-ci")}  # fmt: skip
    github, gitlab = graphs["github-actions"], graphs["gitlab-ci"]
    assert list(github) == list(gitlab) and len(github) == 4  # a layer, two image jobs, the publish

    def commands(lines: list[str]) -> list[str]:
        return [ln for ln in lines if ln.startswith((".venv/bin/image-builder ", "./scripts/setup.sh", "keys="))]

    for job in github:
        assert github[job][0] == gitlab[job][0], job
        assert commands(github[job][1]) == commands(gitlab[job][1]), job
    workflow = tmp_path / "github-actions.yml"
    lint = subprocess.run([str(ROOT / ".tools/bin/actionlint"), "-no-color", str(workflow)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    doc = yaml.safe_load(workflow.read_text())
    build = doc["jobs"]["build-ubuntu-baremetal-efi-chroot"]
    assert build["strategy"]["max-parallel"] == 3 and build["strategy"]["matrix"]["release-channel"] == ["1-23", "1-24"]
    layer = doc["jobs"]["os-layer-ubuntu-20-04"]
    (cache,) = [s for s in layer["steps"] if s.get("uses", "").startswith("actions/cache@")]
    assert (
        cache["with"]["key"].startswith("os-ubuntu-20.04-")
        and len(cache["with"]["key"]) == len("os-ubuntu-20.04-") + 32
    )


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (("--emit", "gitlab-ci", "--ci-concurrency", "0"), "--ci-concurrency"),
        (("--emit", "gitlab-ci", "--ci-concurrency", "²"), "--ci-concurrency"),
        (("--emit", "gitlab-ci", "--ci-publish", "/srv/repo"), "--ci-publish"),  # unsigned: image.publish refuses it
        (("--emit", "gitlab-ci", "--ci-publish", "s3://AKIA:s3cr3t@bucket/repo"), "--ci-publish"),
        (("--emit", "gitlab-ci", "--ci-publish", "s3://bucket/repo?X-Amz-Signature=s3cr3t"), "--ci-publish"),
        (("--emit", "gitlab-ci", "--ci-publish", "repo\nInjected: 1"), "--ci-publish"),
        (("--emit", "gitlab-ci", "--ci-sign", "--ci-publish", "r" * 10_000), "--ci-publish"),
        (("--emit", "gitlab-ci", "--ci-concurrency", "9" * 10_000), "--ci-concurrency"),
        (("--ci-publish", "/srv/repo"), "--ci-publish"),  # shapes an emitted pipeline only
        (("--emit", "jenkins"), "--emit"),
        (("--emit", "gitlab-ci", "--pairs", "bottlerocket:vsphere"), "--os"),  # no buildable pair: OS-1 is downloaded
    ],
)
def test_bad_pipeline_flags_exit_2_naming_the_flag_and_write_nothing(
    tmp_path: Path, flags: tuple[str, ...], field: str
) -> None:
    out = tmp_path / "ci.yml"
    pairs = () if "--pairs" in flags else ("--pairs", "ubuntu:baremetal")
    res = run("build.matrix", *pairs, "--release-channel", "1-24", "--offline", *flags, "--emit-file", str(out))
    assert res.code == 2 and field in res.err and "Traceback" not in res.err, res.err
    assert "s3cr3t" not in res.err and "\nInjected" not in res.err
    assert not out.exists()


def test_matrix_flags_are_checked(tmp_path: Path) -> None:
    res = run("build.matrix", "--pairs", "ubuntu", "--release-channel", "1-24", "--dry-run")
    assert res.code == 2 and "os:provider" in res.err
    res = run("build.matrix", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24,1-24")
    assert res.code == 2 and "twice" in res.err
    res = run("build.matrix", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24,1-99")
    assert res.code == 2 and "--release-channel" in res.err
    res = run("build.matrix", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
              "--emit", "jenkins")  # fmt: skip
    assert res.code == 2 and "github-actions" in res.err


def test_the_matrix_meets_builds_gate_before_anything_is_built(tmp_path: Path) -> None:
    """Issue 47: ``build.matrix`` runs the preflight ``build`` runs, once per OS and provider pair, before any layer
    or image is built, with build's --skip-check and --min-disk-gb; a preflight that fails leaves nothing behind."""
    config = write_config(tmp_path)
    out, layers = tmp_path / "out", tmp_path / "layers"
    args = ["build.matrix", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24,1-33",
            "--baremetal-config", str(config), "--offline", "--engine", "chroot", "--output-dir", str(out),
            "--layer-cache", str(layers)]  # fmt: skip
    res = run(*args, "--min-disk-gb", "9000000")
    assert res.code == 1 and "preflight failed: disk" in res.err, res.out + res.err
    assert res.out.count("[FAIL] disk") == 1, "one report for the one pair, as build prints it"
    assert "[skip] packer" in res.out, "a chroot matrix runs no Packer"
    assert not out.exists() and not layers.exists()
    single = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", *args[7:9],
                 "--offline", "--engine", "chroot", "--output-dir", str(out), "--min-disk-gb", "9000000")  # fmt: skip
    assert single.code == 1 and "preflight failed: disk" in single.err, single.err
    assert run(*args, "--skip-check", "nope", "--dry-run").code == 2  # a dry run refuses what the real run would


def test_inputs_digest_follows_the_inputs(tmp_path: Path) -> None:
    import dataclasses

    from imagebuilder.builder.inputs import inputs_digest, layer_inputs
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    config = write_config(tmp_path)
    request = BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                           configs={"baremetal": str(config)}, engine="chroot")  # fmt: skip
    a, b = make_plan(request), make_plan(request)
    assert inputs_digest(a, None) == inputs_digest(b, None)
    other = make_plan(dataclasses.replace(request, release_channel="1-23"))
    assert inputs_digest(other, None) != inputs_digest(a, None)
    # the OS layer does not depend on the channel, but on the base image
    assert layer_inputs(other) == layer_inputs(a)
    config.write_text(
        json.dumps(
            {"source_image_url": "http://images.example/base.qcow2", "source_image_checksum": "sha256:" + "b" * 64}
        )
    )
    assert layer_inputs(make_plan(request)) != layer_inputs(a)


def test_only_a_whole_output_is_trusted_as_built(tmp_path: Path) -> None:
    """The matrix's "same inputs, skipped" (issue 29): trusted only when the artifact, its .sha256 and its build
    manifest agree and the manifest was written after the artifact; a run killed between writing a new artifact and
    its manifest, or a missing or mismatched piece, means the output is built again."""
    import hashlib

    from imagebuilder.builder.matrix import recorded_inputs
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    out = tmp_path / "out"
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                                  configs={"baremetal": str(write_config(tmp_path))}, engine="chroot",
                                  output_dir=str(out)))  # fmt: skip
    assert plan.output_path is not None
    artifact = plan.output_path
    sidecar = artifact.with_name(artifact.name + ".sha256")
    manifest = out / f"{plan.output_stem}.build-manifest.json"

    def write_output(data: bytes) -> None:
        out.mkdir(exist_ok=True)
        artifact.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        sidecar.write_text(f"{sha}  {artifact.name}\n")
        manifest.write_text(
            json.dumps(
                {"inputs_sha256": "digest-1", "artifact": {"name": artifact.name, "sha256": sha, "size": len(data)}}
            )
        )
        os.utime(manifest, ns=(artifact.stat().st_mtime_ns + 1, artifact.stat().st_mtime_ns + 1))

    write_output(b"image one")
    assert recorded_inputs(plan) == "digest-1"
    # killed after the new artifact replaced the old, before its .sha256 and manifest: the same size, even
    artifact.write_bytes(b"image two")
    os.utime(artifact, ns=(manifest.stat().st_mtime_ns + 10**9, manifest.stat().st_mtime_ns + 10**9))
    assert recorded_inputs(plan) is None
    write_output(b"image two")
    assert recorded_inputs(plan) == "digest-1"
    sidecar.write_text(f"{'0' * 64}  {artifact.name}\n")  # a .sha256 that does not match the manifest
    assert recorded_inputs(plan) is None
    sidecar.unlink()
    assert recorded_inputs(plan) is None
    write_output(b"image two")
    manifest.write_text("{not json")
    assert recorded_inputs(plan) is None


def test_a_layer_is_saved_where_the_filesystem_has_no_direct_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layer's qcow2 is written with O_DIRECT (qemu-img -t none); a cache on a filesystem without it (tmpfs
    before Linux 6.6: EINVAL) gets it written through the page cache instead of failing the matrix."""
    from imagebuilder.builder import matrix
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.core.errors import ExternalError
    from imagebuilder.plan.model import BuildRequest

    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                                  configs={"baremetal": str(write_config(tmp_path))}, engine="chroot"))  # fmt: skip
    raw = tmp_path / "layer.raw"
    raw.write_bytes(os.urandom(65536))
    real, tried = matrix.run_checked, []

    def no_direct_io(*args: str, **kwargs: object) -> str:
        tried.append(args)
        if "none" in args:
            raise ExternalError("qemu-img: Could not open: Invalid argument")
        return real(*args)

    monkeypatch.setattr(matrix, "run_checked", no_direct_io)
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / "os-layer.qcow2"
    matrix.LayerBuilds(cache)._save(plan, raw, target)
    assert len(tried) == 2 and "none" in tried[0] and "none" not in tried[1]
    out = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "qcow2", str(raw), str(target)], check=False)
    assert out.returncode == 0 and not list(cache.glob(".*.tmp"))


@pytest.mark.root
def test_chroot_mounts_keep_the_host_out_and_put_everything_back(tmp_path: Path) -> None:
    from imagebuilder.core import disk

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "sbin").mkdir(parents=True)
    os.symlink("../run/systemd/resolve/stub-resolv.conf", root / "etc" / "resolv.conf")
    before = os.readlink(root / "etc" / "resolv.conf")
    host_hostname = Path("/proc/sys/kernel/hostname").read_text()
    with disk.chroot_mounts(root):
        assert (root / "usr/sbin/policy-rc.d").read_text().endswith("exit 101\n")
        assert not (root / "etc/resolv.conf").is_symlink()
        # the host's kernel settings cannot be changed from inside
        with pytest.raises(OSError):
            (root / "proc/sys/kernel/hostname").write_text("changed-from-the-chroot")
        with pytest.raises(OSError):
            (root / "sys/kernel/uevent_helper").write_text("/bin/evil")
        assert disk.mounts_under(tmp_path), "mounted"
        # a workspace with something still mounted is never removed (a bound /dev is the host's)
        assert disk.remove_tree(tmp_path) and (root / "dev" / "null").exists()
    assert Path("/proc/sys/kernel/hostname").read_text() == host_hostname
    assert os.readlink(root / "etc" / "resolv.conf") == before
    assert not (root / "usr/sbin/policy-rc.d").exists()
    assert not disk.mounts_under(tmp_path)
    assert not list((root / "run").iterdir()) and not list((root / "tmp").iterdir())
    assert not disk.remove_tree(tmp_path) and not tmp_path.exists()


@pytest.mark.root
def test_a_filesystem_is_grown_once_then_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image built on an OS layer starts from a filesystem that already fills its partition: no second
    e2fsck -f and resize2fs for it (about a second of CPU per image). A smaller or unclean one is still checked."""
    from imagebuilder.core import disk
    from imagebuilder.core.disk import attach

    image = tmp_path / "fs.img"
    image.write_bytes(b"")
    os.truncate(image, 16 * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image), "8M"], check=True)
    with disk.loop_device(image, 0, 16 * 2**20) as dev:
        disk.grow_filesystem(dev)
        size, clean = attach._ext_geometry(dev) or (0, False)
        assert (size, clean) == (16 * 2**20, True)
        # grown and clean: neither tool is run again (a PATH with only dumpe2fs would fail the call if it were)
        empty = tmp_path / "bin"
        empty.mkdir()
        (empty / "dumpe2fs").symlink_to(shutil.which("dumpe2fs") or "/sbin/dumpe2fs")
        monkeypatch.setenv("PATH", str(empty))
        disk.grow_filesystem(dev)
        monkeypatch.undo()
        # a filesystem marked unclean is checked before anything mounts it, even at full size
        subprocess.run(["debugfs", "-w", "-R", "ssv state 0", dev], check=True, capture_output=True)
        assert attach._ext_geometry(dev) == (16 * 2**20, False)
        monkeypatch.setenv("PATH", str(empty))
        with pytest.raises(FileNotFoundError):
            disk.grow_filesystem(dev)
        monkeypatch.undo()


# --- the slow part: a real matrix, offline --------------------------------------------------------------------------


def mibs_kept(raw: Path, layer: Path) -> int:
    """How many MiBs of the disk ``raw`` hold data and are the disk ``layer``'s bytes at the same offset."""
    kept, zeros = 0, bytes(1 << 20)
    with open(raw, "rb") as a, open(layer, "rb") as b:
        while chunk := a.read(1 << 20):
            kept += chunk != zeros[: len(chunk)] and chunk == b.read(len(chunk))
            b.seek(a.tell())
    return kept


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.qemu
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_matrix_shares_one_os_layer_and_skips_what_is_built(
    offline_ns: str,
    home: Path,
    base_image: tuple[Path, str],
    tmp_path: Path,
    runtime_of_a_1_7_line: ReleaseRuntime,
    upstream_runtime_1_7: RuntimeBuild,
) -> None:
    """Two lines from one OS layer: 1-33's release carries the real runtime of a containerd 1.7 line in the
    reference bundle's tarball layout (checked on disk: containerd v1.7.28, config version 2, runc, crictl, the
    tarball's bytes); 1-24's names none, so its image gets the line's runtime from containerd's, runc's and
    cri-tools' own releases (issue 42), mirrored with their checksum files, and that image boots."""
    from imagebuilder.attest.keys import generate, public_path
    from imagebuilder.attest.packages import collect
    from imagebuilder.attest.sbom import package_names
    from imagebuilder.builder.verify import boot_raw, verify_image
    from imagebuilder.core.disk import mounted_root, raw_view
    from imagebuilder.core.fetch import Mirror
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.mirror import create_mirror
    from imagebuilder.release.standin import make_standin_release
    from tests.support.attest import check_provenance, check_sbom
    from tests.support.offline import in_ns
    from tests.support.runtime import write_upstream_runtime

    upstream, mirror = tmp_path / "upstream", tmp_path / "mirror"
    line_24 = load_catalog().channel("1-24")
    upstream_files = write_upstream_runtime(upstream, line_24, upstream_runtime_1_7)
    for channel in ("1-33", "1-24"):
        runtime = runtime_of_a_1_7_line if channel == "1-33" else None
        release = make_standin_release(upstream, load_catalog().channel(channel), runtime)
        create_mirror(release.manifest_url, mirror, runtime=load_catalog().channel(channel).runtime,
                      source=Mirror(str(upstream)))  # fmt: skip
    for name, path in upstream_files.items():  # the mirror carries the line's upstream runtime, byte for byte
        assert (mirror / path.relative_to(upstream)).read_bytes() == path.read_bytes(), name
    image, digest = base_image
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    out, layers = tmp_path / "out", tmp_path / "layers"
    key = tmp_path / "keys" / "build.pem"
    generate(key, "ecdsa")
    args = [str(BIN / "image-builder"), "build.matrix", "--os", "ubuntu", "--hypervisor", "baremetal",
            "--release-channel", "1-33,1-24", "--baremetal-config", str(config), "--mirror", str(mirror),
            "--offline", "--engine", "chroot", "--disk-gb", "4", "--output-dir", str(out),
            "--layer-cache", str(layers), "--signing-key", str(key)]  # fmt: skip
    # issue 29, build.matrix: a first run killed (its process group, SIGKILL) while Ansible provisions the shared OS
    # layer; the run below starts on what it left and must leave nothing of it
    env = {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(home / "work")}
    killed = subprocess.Popen(["ip", "netns", "exec", offline_ns, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    kill_at(killed, "TASK [", random.Random(29).uniform(0, 3))
    first = in_ns(offline_ns, *args, home=home)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert not group_alive(killed.pid) and not tagged(killed.pid) and not run_folders(killed.pid)
    assert not loops_on(f"/image-builder-{killed.pid}-", str(home / "work"))
    assert not [p for p in (*out.rglob(".*"), *layers.rglob(".*")) if p.name.endswith((".tmp", ".part"))]
    assert len(list(layers.glob("os-ubuntu-20.04-*.qcow2"))) == 1, "one OS layer for both channels"
    manifests = {p.name: json.loads(p.read_text()) for p in out.glob("*.build-manifest.json")}
    assert len(manifests) == 2
    for m in manifests.values():
        assert m["engine"] == "chroot" and m["os_layer"].startswith("os-ubuntu-20.04-")
        assert m["tools"]["packer"] is None and "chroot" in m["steps"]
    # each image is reproducible (issue 45) and its OS layer's filesystem with its own changes applied: it keeps the
    # layer's blocks, byte for byte at their offsets (checked on the disks: how many of its members the store gave
    # depends on how far the layer's priming had got when it was packaged, on CI's loaded cores 510 of 1022 MiBs)
    counts = [m["gzip_members"] for m in manifests.values()]
    assert all(c["data"] > 500 for c in counts) and sum(c["reused"] for c in counts) > 0, counts
    (layer_disk,) = layers.glob("os-ubuntu-20.04-*.qcow2")
    with raw_view(layer_disk, work_dir=tmp_path / "raw") as layer_raw:
        for name, m in manifests.items():
            with raw_view(out / name.replace(".build-manifest.json", ".gz"), work_dir=tmp_path / "raw") as raw:
                kept = mibs_kept(raw, layer_raw)
            assert kept > m["gzip_members"]["data"] // 3, (name, kept, m["gzip_members"])
    assert all(m["reproducible"] and m["source_date_epoch"] for m in manifests.values())
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert logs.count("the layer's filesystem changed:") == 2 and "laying the whole tree out afresh" not in logs
    (store,) = layers.glob("os-ubuntu-20.04-*.members")
    assert store.is_dir()
    assert "built" in first.stdout and "shared" in first.stdout
    assert "[ok  ] host-os" in first.stdout, "the matrix's preflight ran, as build's does"
    assert not list((home / "work").iterdir()), "the workspaces are removed"
    assert not leaked_scratch(), "the working disks in memory are removed"
    # both images are what a build promises; one of them boots (the other shares its OS layer), by BIOS: through the
    # EXTLINUX boot sector and ldlinux.sys the build patched without a mount (its UEFI path boots in the offline
    # test's node check; this boot was the reproducible test's until 2026-11-30, one boot of CI's machine less)
    for name, boot in (("ubuntu-v1.33.13-eks-31-amd64.gz", False), ("ubuntu-v1.24.17-eks-36-amd64.gz", True)):
        findings = verify_image(out / name, boot=False)
        assert not [f for f in findings if not f.ok], (name, findings)
        if boot:
            with raw_view(out / name, work_dir=tmp_path / "raw") as raw, vm_turn():
                booted = boot_raw(raw, firmware="bios")
            assert booted.ok and "BIOS" in booted.detail, booted.detail
            # under TCG a throwaway copy boots, its systemd told to wait for emulated devices
            assert "systemd waits 900 s for devices" in booted.detail or ", kvm" in booted.detail, booted.detail
        found = {f.name: f.detail for f in findings}
        if "1-33" in manifests[name.replace(".gz", ".build-manifest.json")]["plan"]["release_channel"]:
            # the 1.7 line's own runtime, from the reference's layout, on a merged-/usr image
            assert "v1.7.28" in found["containerd version"] and "1.36.0" in found["crictl version"], found
            assert found["containerd config version"].endswith("version 2 for containerd 1.7.28"), found
            assert "/usr/local/sbin/runc" in found["containerd binaries"], found
            assert "are the tarball's" in found["crictl binaries"], found
            with raw_view(out / name, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
                assert (root / "sbin").is_symlink(), "the tarball's ./sbin did not replace the /sbin link"
                assert "Delegate=yes" in (root / "etc/systemd/system/containerd.service").read_text()
        else:
            # a release that names no runtime: the line's, as containerd, runc and cri-tools publish theirs
            assert "v1.7.28" in found["containerd version"] and "1.36.0" in found["crictl version"], found
            assert upstream_runtime_1_7.runc.lstrip("v") in found["runc version"], found
            assert "matches" in found["runc binary"] and "opencontainers/runc" in found["runc binary"], found
            assert "/usr/local/bin/containerd" in found["containerd binaries"], found
            assert "no OS containerd or runc" in found["one runtime"], found
            with raw_view(out / name, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
                assert "Delegate=yes" in (root / "etc/systemd/system/containerd.service").read_text()
        # issue 31: each has its SBOM (the packages of its own database, its Kubernetes artifacts, its source
        # image) and its provenance, signed by the key given, naming the SBOM
        stem = name.removesuffix(".gz")
        doc = check_sbom(out / f"{stem}.spdx.json", out / name)
        listed = {p["name"]: p for p in doc["packages"]}
        assert {"containerd", "systemd", "openssh-server"} <= set(listed), sorted(listed)[:20]
        with raw_view(out / name, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
            inventory = collect(root)  # the same database read off the image here
        assert package_names(doc) == {p.name: p.version for p in inventory.packages}
        purl = listed["systemd"]["externalRefs"][0]["referenceLocator"]
        assert purl.startswith(f"pkg:deb/{inventory.distro}/systemd@") and "arch=amd64" in purl, purl
        assert {"kubelet", "kubeadm", "kubectl"} <= set(listed) and listed["kubelet"]["checksums"][0]["checksumValue"]
        assert listed[image.name]["checksums"][0]["checksumValue"] == digest, "the source image, by its digest"
        statement = check_provenance(out / f"{stem}.intoto.json", public_path(key), out / name)
        parameters = statement["predicate"]["buildDefinition"]["externalParameters"]
        assert parameters["engine"] == "chroot" and parameters["release_channel"] in ("1-33", "1-24")
        deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
        assert deps["source-image"]["digest"] == {"sha256": digest} and deps["release-manifest"]["digest"]["sha256"]
        assert deps["config:bm.json"]["digest"]["sha256"] and "uri" not in deps["config:bm.json"]
    # issue 31, end to end: the booted image published to S3 (moto in server mode), downloaded and verified by our
    # client and by tuftool, its provenance checked on what was downloaded; then served to machines from a folder
    # repository (serve --repo), whose osImageURL gives the image's bytes
    publish_and_serve(out, ["ubuntu-v1.24.17-eks-36-amd64.gz"], key, tmp_path)
    # issue 45: an image of the matrix rebuilt from its provenance alone, without the layer cache (the OS part, then
    # the image's, each sealed as the matrix did): the same bytes
    stem = "ubuntu-v1.24.17-eks-36-amd64"
    rebuilt = in_ns(offline_ns, str(BIN / "image-builder"), "image.rebuild", "--provenance",
                    str(out / f"{stem}.intoto.json"), "--mirror", str(mirror), "--output-dir", str(tmp_path / "rb"),
                    "--public-key", str(public_path(key)), home=home)  # fmt: skip
    assert rebuilt.returncode == 0 and "reproduced" in rebuilt.stdout, rebuilt.stdout[-3000:] + rebuilt.stderr[-3000:]
    assert sha256_file(tmp_path / "rb" / f"{stem}.gz") == sha256_file(out / f"{stem}.gz")
    # a rerun builds nothing: the manifests record the same inputs
    again = in_ns(offline_ns, *args, home=home)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    table = again.stdout[again.stdout.index("build.matrix") :]  # the summary, after the preflight's report
    assert table.count("skipped") >= 2 and "built" not in table, table


def publish_and_serve(out: Path, names: list[str], build_key: Path, tmp_path: Path) -> None:
    import urllib.request

    from imagebuilder.attest.keys import public_path
    from tests.support.moto import moto_server
    from tests.support.publishing import cli, public_bucket, serving_repo, tuftool_download

    keys = tmp_path / "repo-keys"
    assert cli("repo.keygen", "--dest", str(keys)).returncode == 0
    with moto_server() as env:
        s3 = public_bucket(env, "fleet")
        init = cli("repo.init", "--repo", "s3://fleet/images", "--keys", str(keys), env=env)
        assert init.returncode == 0, init.stderr
        for name in names:
            res = cli("image.publish", "--image", str(out / name), "--repo", "s3://fleet/images", "--keys", str(keys),
                      "--public-key", str(public_path(build_key)), env=env)  # fmt: skip
            assert res.returncode == 0 and "published:" in res.stdout, res.stdout + res.stderr
        url = f"{env['AWS_ENDPOINT_URL']}/fleet/images"
        root = tmp_path / "fleet-root.json"
        root.write_bytes(s3.get_object(Bucket="fleet", Key="images/metadata/1.root.json")["Body"].read())
        sha512 = init.stdout.split("root SHA-512: ")[1].split()[0]
        dl = tmp_path / "fleet-dl"
        for name in names:
            stem = name.removesuffix(".gz")
            for target in (name, f"{stem}.spdx.json", f"{stem}.intoto.json"):
                got = cli("download.image", "--repo", url, "--root", str(root), "--root-sha512", sha512, "--target",
                          target, "--dest", str(dl))  # fmt: skip
                assert got.returncode == 0, got.stdout + got.stderr
            assert (dl / name).read_bytes() == (out / name).read_bytes()
            check = cli("image.verify", "--image", str(dl / name), "--provenance", str(dl / f"{stem}.intoto.json"),
                        "--public-key", str(public_path(build_key)))  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr
            tt = tuftool_download(root, f"{url}/metadata", f"{url}/targets", name, tmp_path / f"tt-{stem}")
            assert tt.returncode == 0 and (tmp_path / f"tt-{stem}" / name).read_bytes() == (out / name).read_bytes()
    folder = tmp_path / "fleet-repo"
    assert cli("repo.init", "--repo", str(folder), "--keys", str(keys)).returncode == 0
    assert cli("image.publish", "--image", str(out / names[-1]), "--repo", str(folder), "--keys", str(keys)
               ).returncode == 0  # fmt: skip
    with serving_repo(folder) as values:
        digest = hashlib.sha256()
        with urllib.request.urlopen(values[f"osImageURL ({names[-1]})"], timeout=60) as res:
            while block := res.read(1 << 20):
                digest.update(block)
        assert digest.hexdigest() == sha256_file(out / names[-1])


def test_image_diff_reads_packages_etc_units_and_binaries(tmp_path: Path) -> None:
    from imagebuilder.image.diff import compare, inventory

    def image(name: str, version: str, extra: dict[str, str]) -> Path:
        root = tmp_path / name
        (root / "var/lib/dpkg").mkdir(parents=True)
        (root / "var/lib/dpkg/status").write_text(
            f"Package: containerd\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
            "Description: x\n multi-line: not a field\n\n"
            "Package: removed-one\nStatus: deinstall ok config-files\nVersion: 1\n"
        )
        (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
        os.symlink("/lib/systemd/system/kubelet.service",
                   root / "etc/systemd/system/multi-user.target.wants/kubelet.service")  # fmt: skip
        (root / "usr/bin").mkdir(parents=True)
        (root / "usr/bin/kubelet").write_bytes(b"kubelet")
        for rel, text in extra.items():
            (root / rel).write_text(text)
        return root

    a = inventory(image("a", "1.6.20", {"etc/passwd-": "with builder\n", "etc/hostname": ""}))
    b = inventory(image("b", "1.6.21", {"etc/hostname": "leaked-build-vm\n"}))
    assert a.packages == {"containerd": "1.6.20"} and "multi-user.target.wants/kubelet.service" in a.enabled_units
    found = {(d.kind, d.name): d for d in compare(a, b)}
    assert set(found) == {("package", "containerd"), ("etc", "etc/passwd-"), ("etc", "etc/hostname")}
    assert found[("etc", "etc/passwd-")].expected and "shadow-utils" in str(found[("etc", "etc/passwd-")])
    assert found[("etc", "etc/hostname")].expected is None and found[("package", "containerd")].expected is None
    assert compare(a, a) == []


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_image_whose_fstab_leads_out_is_refused_and_nothing_is_left(
    base_image: tuple[Path, str], tmp_path: Path
) -> None:
    """A bootable image whose fstab mounts its ESP at '/../../..' : the build exits 2 naming the source image, the
    host's directories are untouched, nothing stays mounted, no output or workspace is left."""
    import hashlib

    from imagebuilder.core import disk

    raw = tmp_path / "hostile.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(base_image[0]), str(raw)], check=True)
    part = disk.root_partition(raw)
    with disk.loop_device(raw, part.offset, part.length) as dev, disk.mounted(dev, tmp_path / "mnt") as root:
        fstab = (root / "etc/fstab").read_text().replace(" /boot/efi ", " /../../../../tmp/ib-hostile-esp ")
        assert "ib-hostile-esp" in fstab
        (root / "etc/fstab").write_text(fstab)
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    config = write_config(tmp_path, str(raw))
    config.write_text(json.dumps({"source_image_url": str(raw), "source_image_checksum": f"sha256:{digest}"}))
    out, work = tmp_path / "out", tmp_path / "work"
    mirror = tmp_path / "mirror"
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(mirror, load_catalog().channel("1-24"))
    res = run("build", *BASE, "--baremetal-config", str(config), "--mirror", str(mirror), "--engine", "chroot",
              "--disk-gb", "4", "--output-dir", str(out), "--skip-check", "disk", "--skip-check", "kvm",
              "--runtime", "os", env={"IMAGE_BUILDER_WORKSPACE": str(work)})  # fmt: skip
    assert res.code == 2, (res.out[-2000:], res.err)
    assert "fstab mount point" in res.err and "source_image_url" in res.err
    assert not Path("/tmp/ib-hostile-esp").exists()
    assert not disk.mounts_under(tmp_path)
    assert not list(out.glob("*.gz")) and not list(work.iterdir())
    assert not leaked_scratch()
