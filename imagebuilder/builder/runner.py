"""Run a build plan for real: render, Packer, post-processing, checksum and build manifest.

Guarantees a user relies on:
- nothing partial at a final path: every output is written beside its final name and renamed when complete;
- secrets never reach the log, the manifest or a child's argv: Packer gets them as PKR_VAR_* in its environment,
  and every log line is redacted against the config's secret values before it is written;
- the workspace is removed after the build, and kept on failure only with ``keep_on_error``;
- Packer exiting 0 without an image is an error with the log's path, never a crash.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from imagebuilder import __version__
from imagebuilder.builder.attestations import write_attestations
from imagebuilder.builder.chroot import OsLayer, Reproducible, check_engine, run_chroot_build
from imagebuilder.builder.inputs import build_digests, layer_seed
from imagebuilder.builder.packer import (
    RenderedBuild,
    builder_for,
    check_buildable,
    check_emulator,
    effective_customization,
    packer_env,
    prepare_packer,
    render_build,
)
from imagebuilder.builder.packer_plugins import PackerInfo, PluginCheck
from imagebuilder.core import disk, fetch
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Expected, is_url
from imagebuilder.core.files import atomic_write
from imagebuilder.core.hostinfo import KvmStatus, kvm_status, tool_version
from imagebuilder.core.progress import Say, follow, silent
from imagebuilder.core.stream import member_codec
from imagebuilder.core.untrusted import Redactor
from imagebuilder.customization.model import Customization
from imagebuilder.hardening.run import Hardening
from imagebuilder.image.bootcheck import check_image
from imagebuilder.image.outputs import sharing
from imagebuilder.image.reproducible import dated, source_date_epoch
from imagebuilder.plan.config import SourceImageFields
from imagebuilder.plan.model import BuildPlan
from imagebuilder.providers import registry

if TYPE_CHECKING:
    from securesystemslib.signer import Signer


@dataclass
class BuildResult:
    build_id: str
    artifact: Path | None
    sha256: str | None
    size: int | None
    manifest: Path
    log: Path
    steps: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _step(steps: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        steps[name] = round(time.monotonic() - start, 3)


def _run_packer(rendered: RenderedBuild, packer: PackerInfo, log: IO[str], redact: Redactor, status: Say) -> None:
    # Packer's own temporary files (the seed ISO, its plugins' sockets) in a folder named for this run: a killed
    # run's are released by the next, as are the Packer and QEMU processes it left running (disk.stale_processes)
    # Ansible's SSH control sockets too: under the user's HOME (~/.ansible/cp) a long home folder made their path
    # longer than a Unix socket's 108 bytes, and Ansible could not reach the build VM (seen with a test's HOME)
    with disk.run_tempdir("packer") as tmp:
        env = {**packer_env(rendered), "TMPDIR": str(tmp), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp / "cp")}
        _packer_stages(rendered, packer, env, log, redact, status)


def _packer_stages(
    rendered: RenderedBuild, packer: PackerInfo, env: dict[str, str], log: IO[str], redact: Redactor, status: Say
) -> None:

    def pick(text: str) -> str | None:  # Packer's steps and Ansible's tasks
        hit = text.startswith("==>") or "TASK [" in text or "PLAY [" in text
        return text.removeprefix("==> ") if hit else None

    for stage in rendered.stages or (None,):
        args = [packer.path, "build", "-color=false", "-on-error=cleanup"]
        if stage:
            args.append(f"-only={stage}")
        args.append(rendered.template.name)
        code = follow(args, env=env, log=log, redact=redact, say=status, pick=pick, cwd=rendered.directory)
        if code != 0:
            raise ExternalError(
                f"packer build failed (exit {code}) in stage {stage or 'build'}; see {log.name}",
                hint="read the log's last lines; rerun with --keep-on-error to keep the workspace for inspection",
            )


def _tool_versions(packer: PackerInfo | None) -> dict[str, str | None]:
    return {
        "image-builder": __version__,
        "packer": packer.version_text if packer else None,
        "packer_path": packer.path if packer else None,
        "ansible": tool_version("ansible-playbook"),
        "qemu": tool_version("qemu-system-x86_64"),
        "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "gzip": member_codec(),  # what deflated the image's members: their bytes depend on it
    }


def run_build(
    plan: BuildPlan,
    *,
    packer: PackerInfo | None = None,
    kvm: KvmStatus | None = None,
    keep_on_error: bool = False,
    customization: Customization | None = None,
    say: Say = silent,
    os_layer: OsLayer | None = None,
    inputs_sha256: str | None = None,
    plugins: PluginCheck | None = None,
    signer: Signer | None = None,
    reproducible: Reproducible | None = None,
) -> BuildResult:
    """Execute ``plan``, saying each step as it starts (the progress protocol). Raises :class:`ExternalError` with
    the log's path when something outside us fails. ``customization`` (``build --customize``) adds the customize
    role; its secrets reach Ansible through Packer's environment only and are redacted from the log. ``os_layer``
    (chroot engine, from ``build.matrix``) is a cached OS layer of this plan: the build runs only its Kubernetes
    part on a copy of it. ``plugins`` is the Packer and plugin check the caller made (:func:`prepare_packer`); without
    it the build makes its own, with ``packer`` (default: ``packer`` on PATH), before anything else starts. Every build
    writes the image's SBOM and provenance beside it (:mod:`imagebuilder.builder.attestations`), the provenance signed
    by ``signer`` when one is given."""
    check_buildable(plan)  # bad input fails here, before anything is written
    check_emulator(plan)  # and a host that cannot run the build VM
    computed_inputs, content_sha256 = build_digests(plan, customization)
    inputs_sha256 = inputs_sha256 or computed_inputs
    started = dt.datetime.now(dt.UTC)
    # the chroot engine's image is the same bytes on every run of these inputs; Packer's is not (a VM boot writes
    # what no step after it takes back: image.diff tells what differs). A rebuild gives what the provenance recorded.
    if reproducible is None:
        epoch = source_date_epoch(plan.manifest.date, int(started.timestamp()))
        if plan.engine == "chroot":
            reproducible = Reproducible(epoch, layer_seed(plan, content_sha256), layered=os_layer is not None)
    else:
        epoch = reproducible.epoch
    if os_layer is not None and plan.engine != "chroot":
        raise InputError("an OS layer is provisioned by the chroot engine only", field="--engine", expected="chroot")
    if plan.engine == "chroot":
        check_engine(plan.arch)
        packer = None
    else:
        plugins = plugins or prepare_packer([plan], packer=packer.path if packer else None, say=say)
        assert plugins is not None
        packer = plugins.packer
    out_dir = plan.output_path.parent if plan.output_path else Path("output").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    build_id = f"{plan.output_name}-{started:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
    workspace = plan.workspace / build_id
    # what runs killed before left here (no clean-up of theirs ran), then this run's own workspace, marked as its
    disk.release(disk.leftovers(workspaces=plan.workspace, outputs=(out_dir,)))
    disk.claim(workspace)
    log_path = out_dir / "logs" / f"{build_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    secret_values = plan.config.secret_values() if plan.config else []
    applied = effective_customization(plan, customization)  # render_build applies the same
    redact = Redactor(secret_values + (applied.secret_values() if applied else []))
    steps: dict[str, float] = {}
    succeeded = False
    result_extra: dict[str, Any] = {"customization": applied.summary()} if applied else {}
    artifact: Path | None = None
    sha = None
    size = None
    builder = builder_for(plan)
    hardening: Hardening | None = None
    try:
        with log_path.open("w") as log, contextlib.ExitStack() as scratch:

            def status(text: str) -> None:
                say(f"{plan.output_name}: {text}")

            with _step(steps, "source"):
                source = os_layer.disk if os_layer is not None else prepare_source_image(plan, workspace, status)
            if plan.engine == "chroot":
                with _step(steps, "chroot"):
                    assert source is not None  # the planner chose chroot for an image-based build only
                    # the working disk: in memory when it fits (removed after packaging), kept on disk in the
                    # workspace when the user asked to keep a failed one
                    directory = scratch.enter_context(disk.scratch_dir(
                        workspace / "chroot", size=plan.disk_gb * 1024**3, in_memory=not keep_on_error, log=status
                    ))  # fmt: skip
                    layers = ("kubernetes",) if os_layer is not None else ("os", "kubernetes")
                    if plan.hardening is not None:
                        hardening = Hardening(plan.hardening, out_dir / plan.output_stem, plan.mirror)
                    built = run_chroot_build(plan, source, directory, customization=customization, log=log,
                                             redact=redact, status=status, layers=layers,
                                             source_format=os_layer.disk_format if os_layer else None,
                                             facts=os_layer.facts if os_layer else None,
                                             reproducible=reproducible, hardening=hardening)  # fmt: skip
            else:
                assert packer is not None
                playbook = None
                if plan.hardening is not None:
                    with _step(steps, "hardening"):
                        hardening = Hardening(plan.hardening, out_dir / plan.output_stem, plan.mirror)
                        playbook = hardening.prepare_packer(source, plan.os, plan.os_version.version,
                                                            workspace / "hardening", status)  # fmt: skip
                with _step(steps, "render"):
                    if builder == "qemu" and kvm is None:
                        kvm = kvm_status()
                        log.write(f"accelerator: {kvm.accelerator} ({kvm.reason})\n")
                        if not kvm.usable:
                            say(f"warning: {kvm.reason}; QEMU uses TCG (slow)")
                    rendered = render_build(plan, workspace, packer, kvm=kvm, source_image=source,
                                            customization=customization, playbook=playbook)  # fmt: skip
                    directory = rendered.directory
                with _step(steps, "packer"):
                    _run_packer(rendered, packer, log, redact, status)
                if hardening is not None:
                    built = registry.get(plan.provider).built_disk(plan, directory, status)
            if hardening is not None:
                with _step(steps, "scan"):
                    try:
                        hardening.check(built, workspace, status)
                    finally:
                        result_extra["hardening"] = hardening.record()
                        if hardening.remediation and hardening.remediation.dropped:
                            log.write(
                                "hardening: tasks left out (they act on the running system):\n  "
                                + "\n  ".join(hardening.remediation.dropped)
                                + "\n"
                            )
            # an image built on a cached OS layer takes from the layer's member store the MiBs it has in common with
            # it (since images are reproducible, their remade filesystems have few: docs/benchmarks.md)
            store = os_layer.members if os_layer is not None else None
            with (
                _step(steps, "package"),
                sharing(store, os_layer.base if os_layer is not None else None),
                dated(epoch),
            ):
                packaged = registry.get(plan.provider).package(plan, directory, status)
                artifact, sha, size = packaged.artifact, packaged.sha256, packaged.size
                result_extra.update(packaged.extra)
            with _step(steps, "attest"):
                status("writing the SBOM and the provenance")
                result_extra.update(write_attestations(
                    plan, directory=directory, out_dir=out_dir, artifact=artifact, sha256=sha, build_id=build_id,
                    started=started, tools=_tool_versions(packer), customization=applied, signer=signer,
                    epoch=epoch, hash_seed=reproducible.seed if reproducible else None,
                    layered=reproducible is not None and reproducible.layered,
                    inputs=hardening.dependencies() if hardening else (),
                ))  # fmt: skip
        with (
            atomic_write(artifact.with_name(artifact.name + ".sha256")) if artifact else contextlib.nullcontext() as fh
        ):
            if fh is not None:
                fh.write(f"{sha}  {artifact.name}\n")  # type: ignore[union-attr]
        succeeded = True
    finally:
        if succeeded or not keep_on_error:
            left = disk.remove_tree(workspace)
            if left:
                say(f"warning: still mounted, so the workspace {workspace} was kept: {', '.join(left)}")
        elif workspace.exists():
            disk.unclaim(workspace)  # kept for the user: no later sweep takes it
            say(f"warning: build failed; workspace kept: {workspace}")
    finished = dt.datetime.now(dt.UTC)
    manifest = {
        "build_id": build_id,
        "started": started.isoformat(),
        "finished": finished.isoformat(),
        "plan": plan.to_json(),
        "tools": _tool_versions(packer),
        "packer_plugins": [s.to_json() for s in plugins.states] if plugins and packer else [],
        "engine": plan.engine,
        "os_layer": os_layer.image.name if os_layer else None,
        "inputs_sha256": inputs_sha256,
        "source_date_epoch": epoch,
        # a hardened image is sealed as any chroot build's, but its remediation's packages and AIDE database are
        # those of the day it ran: not the same bytes on a rebuild (image.rebuild refuses it)
        "reproducible": reproducible is not None and plan.hardening is None,
        "accelerator": kvm.accelerator if kvm else None,
        "artifact": {"name": artifact.name, "sha256": sha, "size": size} if artifact else None,
        "steps": steps,
        "log": str(log_path),
        **result_extra,
    }
    manifest_path = out_dir / f"{plan.output_stem}.build-manifest.json"
    with atomic_write(manifest_path) as fh:
        fh.write(redact(json.dumps(manifest, indent=2)) + "\n")
    return BuildResult(build_id, artifact, sha, size, manifest_path, log_path, steps, result_extra)


def source_image(plan: BuildPlan) -> tuple[str, str] | None:
    """(location, checksum) of the disk image a qemu build starts from, or None (an ISO install)."""
    config = plan.config
    if builder_for(plan) != "qemu" or not isinstance(config, SourceImageFields) or not config.uses_source_image:
        return None
    assert config.source_image_url and config.source_image_checksum
    return config.source_image_url, config.source_image_checksum


def check_source_image(plan: BuildPlan) -> str | None:
    """The dry run's look at the source image: a local one is checked now (:func:`_check_source`), a remote one once
    the real run has fetched and verified it. Returns what was checked, for the plan's output."""
    source = source_image(plan)
    if source is None:
        return None
    if is_url(source[0]):
        return f"{source[0]}: checked after it is fetched and verified"
    return _check_source(plan, Path(source[0].removeprefix("file://")))


def _check_source(plan: BuildPlan, location: Path, work_dir: Path | None = None) -> str:
    """Refuse a source image that is dirty or would not boot, in seconds and before any VM starts (exit 2)."""
    check = check_image(location, work_dir=work_dir)
    if not check.ok:
        raise InputError(
            "the source image is unfit to build from: " + "; ".join(check.problems),
            source=plan.config_path or location,
            field="source_image_url",
            expected="a cleanly unmounted, bootable image (make one with 'image-builder image.base')",
        )
    if check.uefi_arches and plan.arch not in check.uefi_arches:  # its UEFI loader says what it is, in seconds
        raise InputError(
            f"the source image boots {', '.join(check.uefi_arches)} machines (its EFI loader), and the build is for"
            f" {plan.arch}",
            source=plan.config_path or location,
            field="source_image_url",
            expected=f"a {plan.arch} image (make one with 'image-builder image.base --arch {plan.arch}')",
        )
    return f"{location}: {check.summary()}"


def prepare_source_image(plan: BuildPlan, workspace: Path, status: Say) -> Path | None:
    """The source image as a local, verified and checked file for Packer (a URL is fetched into the workspace)."""
    source = source_image(plan)
    if source is None:
        return None
    location, checksum = source
    if is_url(location):
        algorithm, _, digest = checksum.partition(":")
        local = workspace / "source" / Path(location.split("?")[0]).name
        status(f"fetching the source image {location}")
        fetch.download(location, local, Expected(None, {algorithm: digest}))
    else:
        local = Path(location.removeprefix("file://"))
    status("checking the source image's boot sectors and filesystem")
    _check_source(plan, local, workspace)
    return local
