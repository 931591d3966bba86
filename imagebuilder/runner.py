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
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from imagebuilder import __version__
from imagebuilder.bootcheck import check_image
from imagebuilder.errors import ExternalError, InputError
from imagebuilder.files import atomic_write, sha256_file
from imagebuilder.hostinfo import KvmStatus, kvm_status, tool_version
from imagebuilder.mirror import fetch_verified, is_url
from imagebuilder.ova import make_ova
from imagebuilder.packer import (
    PackerInfo,
    RenderedBuild,
    builder_for,
    check_buildable,
    packer_env,
    render_build,
)
from imagebuilder.plan import BuildPlan
from imagebuilder.provider_config import AmiConfig, SourceImageFields, VsphereConfig

CHUNK = 4 * 1024 * 1024


class Redactor:
    """Replaces every secret value in a text with ``********``."""

    def __init__(self, values: list[str]) -> None:
        self.values = sorted({v for v in values if v}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, "********")
        return text


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


def gzip_parallel(src: Path, dest: Path, *, on_bytes: Callable[[int], None] | None = None) -> tuple[str, int]:
    """Compress ``src`` to ``dest`` with pigz on every core; returns (sha256, size) of the .gz.

    The compressed stream is hashed as it is written, so the result is read once; it lands at ``dest`` only
    when complete.
    """
    pigz = shutil.which("pigz")
    if pigz is None:
        raise ExternalError("pigz is not installed", hint="run ./scripts/setup.sh")
    digest, size = hashlib.sha256(), 0
    with atomic_write(dest, "wb") as out:
        proc = subprocess.Popen(
            [pigz, "-c", "-p", str(os.cpu_count() or 1), str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        read_so_far = 0
        while block := proc.stdout.read(CHUNK):
            out.write(block)
            digest.update(block)
            size += len(block)
            if on_bytes is not None:
                done = _bytes_read(proc.pid, src)
                if done is not None and done > read_so_far:
                    on_bytes(done - read_so_far)
                    read_so_far = done
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise ExternalError(f"pigz failed compressing {src}: {err.strip()}")
        if on_bytes is not None:
            on_bytes(max(0, src.stat().st_size - read_so_far))
    return digest.hexdigest(), size


def _bytes_read(pid: int, path: Path) -> int | None:
    """How far a process has read ``path`` (from /proc/PID/fdinfo), for the progress bar."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("pos:"):
                        return int(line.split()[1])
    except OSError:
        return None
    return None


def _place(src: Path, dest: Path) -> tuple[str, int]:
    """Move ``src`` to ``dest`` atomically (copying across filesystems); returns (sha256, size)."""
    digest = sha256_file(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return digest, dest.stat().st_size


def _run_packer(
    rendered: RenderedBuild, packer: PackerInfo, log: IO[str], redact: Redactor, status: Callable[[str], None]
) -> None:
    env = packer_env(rendered)
    for stage in rendered.stages or (None,):
        args = [packer.path, "build", "-color=false", "-on-error=cleanup"]
        if stage:
            args.append(f"-only={stage}")
        args.append(rendered.template.name)
        log.write(f"$ {' '.join(args)}\n")
        log.flush()
        proc = subprocess.Popen(
            args,
            cwd=rendered.directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            clean = redact(line)
            log.write(clean)
            log.flush()
            text = clean.strip()
            if text.startswith("==>") or "TASK [" in text or "PLAY [" in text:
                status(text.removeprefix("==> "))
        if proc.wait() != 0:
            raise ExternalError(
                f"packer build failed (exit {proc.returncode}) in stage {stage or 'build'}; see {log.name}",
                hint="read the log's last lines; rerun with --keep-on-error to keep the workspace for inspection",
            )


def _tool_versions(packer: PackerInfo) -> dict[str, str | None]:
    return {
        "image-builder": __version__,
        "packer": packer.version_text,
        "ansible": tool_version("ansible-playbook"),
        "qemu": tool_version("qemu-system-x86_64"),
        "pigz": tool_version("pigz"),
    }


def run_build(
    plan: BuildPlan,
    *,
    packer: PackerInfo | None = None,
    kvm: KvmStatus | None = None,
    keep_on_error: bool = False,
    console: Console | None = None,
) -> BuildResult:
    """Execute ``plan``. Raises :class:`ExternalError` with the log's path when something outside us fails."""
    check_buildable(plan)  # bad input fails here, before anything is written
    console = console or Console(stderr=True)
    packer = packer or PackerInfo.detect()
    out_dir = plan.output_path.parent if plan.output_path else Path("output").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    build_id = f"{plan.output_name}-{started:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
    workspace = plan.workspace / build_id
    log_path = out_dir / "logs" / f"{build_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    redact = Redactor(plan.config.secret_values() if plan.config else [])
    steps: dict[str, float] = {}
    succeeded = False
    result_extra: dict[str, Any] = {}
    artifact: Path | None = None
    sha = None
    size = None
    builder = builder_for(plan)
    try:
        with log_path.open("w") as log, console.status(f"building {plan.output_name}") as spinner:

            def status(text: str) -> None:
                spinner.update(f"[bold]{plan.output_name}[/]: {text[:110]}")

            with _step(steps, "source"):
                source = prepare_source_image(plan, workspace, status)
            with _step(steps, "render"):
                if builder == "qemu" and kvm is None:
                    kvm = kvm_status()
                    log.write(f"accelerator: {kvm.accelerator} ({kvm.reason})\n")
                    if not kvm.usable:
                        console.print(f"[yellow]warning:[/] {kvm.reason}; QEMU uses TCG (slow)")
                rendered = render_build(plan, workspace, packer, kvm=kvm, source_image=source)
            with _step(steps, "packer"):
                _run_packer(rendered, packer, log, redact, status)
            with _step(steps, "package"):
                artifact, sha, size = _package(plan, rendered, out_dir, console, status, result_extra)
        with (
            atomic_write(artifact.with_name(artifact.name + ".sha256")) if artifact else contextlib.nullcontext() as fh
        ):
            if fh is not None:
                fh.write(f"{sha}  {artifact.name}\n")  # type: ignore[union-attr]
        succeeded = True
    finally:
        if succeeded or not keep_on_error:
            shutil.rmtree(workspace, ignore_errors=True)
        elif workspace.exists():
            console.print(f"[yellow]workspace kept:[/] {workspace}")
    finished = dt.datetime.now(dt.UTC)
    manifest = {
        "build_id": build_id,
        "started": started.isoformat(),
        "finished": finished.isoformat(),
        "plan": plan.to_json(),
        "tools": _tool_versions(packer),
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


def _package(
    plan: BuildPlan,
    rendered: RenderedBuild,
    out_dir: Path,
    console: Console,
    status: Callable[[str], None],
    extra: dict[str, Any],
) -> tuple[Path | None, str | None, int | None]:
    """Turn Packer's output into the artifact the plan promises."""
    if plan.provider in ("ami", "nutanix"):
        extra["packer_manifest"] = _read_packer_manifest(plan, rendered)
        return None, None, None
    output = rendered.directory / "output"
    vm_name = plan.output_stem
    disk = output / vm_name
    if builder_for(plan) == "qemu" and (not disk.is_file() or disk.stat().st_size == 0):
        raise ExternalError(
            f"Packer finished but produced no image at {disk}",
            hint="read the build log; rerun with --keep-on-error to inspect the workspace",
        )
    assert plan.output_path is not None
    final = plan.output_path
    if builder_for(plan) == "qemu":
        status("checking the image's boot sectors and filesystem")
        require_bootable(disk, "the built image", work_dir=rendered.directory)
    if plan.provider == "baremetal":
        total, done = disk.stat().st_size, 0

        def progress(n: int) -> None:
            nonlocal done
            done += n
            status(f"compressing {total / 2**30:.1f} GiB with pigz: {100 * done // max(total, 1)} %")

        progress(0)
        sha, size = gzip_parallel(disk, final, on_bytes=progress)
        return final, sha, size
    if isinstance(plan.config, VsphereConfig):
        status("packaging the OVA (streamOptimized VMDK, OVF, manifest)")
        source = disk if disk.is_file() else _exported_disk(output)
        if builder_for(plan) != "qemu":
            require_bootable(source, "the exported disk", work_dir=rendered.directory)
        make_ova(
            source,
            final,
            name=vm_name,
            guest_os_type=plan.os_version.guest_os_type or "otherLinux64Guest",
        )
        return final, sha256_file(final), final.stat().st_size
    sha, size = _place(disk, final)
    return final, sha, size


def require_bootable(disk: Path, what: str, *, work_dir: Path) -> None:
    """Fail the build at once when its output would not boot, instead of after compressing it and a boot test."""
    check = check_image(disk, work_dir=work_dir)
    if not check.ok:
        raise ExternalError(
            f"{what} would not boot: " + "; ".join(check.problems),
            hint="read the build log (did the guest power off cleanly?); rerun with --keep-on-error to inspect it",
        )


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
    return f"{location}: {check.summary()}"


def prepare_source_image(plan: BuildPlan, workspace: Path, status: Callable[[str], None]) -> Path | None:
    """The source image as a local, verified and checked file for Packer (a URL is fetched into the workspace)."""
    source = source_image(plan)
    if source is None:
        return None
    location, checksum = source
    if is_url(location):
        algorithm, _, digest = checksum.partition(":")
        local = workspace / "source" / Path(location.split("?")[0]).name
        status(f"fetching the source image {location}")
        fetch_verified(location, local, digest, algorithm=algorithm)
    else:
        local = Path(location.removeprefix("file://"))
    status("checking the source image's boot sectors and filesystem")
    _check_source(plan, local, workspace)
    return local


def _exported_disk(output: Path) -> Path:
    disks = sorted(output.glob("*.vmdk"))
    if not disks:
        raise ExternalError(f"Packer exported no disk into {output}", hint="read the build log")
    return disks[0]


def _read_packer_manifest(plan: BuildPlan, rendered: RenderedBuild) -> Any:
    path = rendered.directory / "packer-manifest.json"
    if isinstance(plan.config, AmiConfig) and plan.config.manifest_output:
        path = Path(plan.config.manifest_output)
    if not path.is_file():
        raise ExternalError(f"Packer wrote no manifest at {path}", hint="read the build log")
    return json.loads(path.read_text())
