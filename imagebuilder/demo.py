"""The offline flow end to end, as ``invoke demo`` runs it: base image, mirror, bare-metal build, verify.

Each step is the same library call a user's command makes; nothing here is demo-only except the stand-in
release (real artifacts cannot be downloaded offline). Steps converge: a rerun reuses a base image and mirror
whose checksums still match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.baseimage import make_base_image
from imagebuilder.catalog import load_catalog
from imagebuilder.fetch import Mirror
from imagebuilder.files import atomic_write
from imagebuilder.mirror import create_mirror, file_sha256
from imagebuilder.plan import BuildRequest
from imagebuilder.planner import make_plan
from imagebuilder.preflight import require
from imagebuilder.progress import Say, silent
from imagebuilder.runner import BuildResult, run_build
from imagebuilder.standin import make_standin_release
from imagebuilder.verify import Finding, verify_image


@dataclass
class DemoResult:
    base_image: Path
    mirror: Path
    build: BuildResult
    findings: list[Finding]


def ensure_base_image(path: Path, say: Say, **kw: object) -> tuple[Path, str]:
    side = path.with_name(path.name + ".sha256")
    if path.is_file() and side.is_file():
        want = side.read_text().split()[0]
        if file_sha256(path) == want:
            say(f"base image: {path} (reused, sha256 verified)")
            return path, want
    say(f"base image: building {path} with debootstrap (a few minutes)")
    return make_base_image(path, log=None, **kw)  # type: ignore[arg-type]


def demo_steps(
    dest: Path, *, channel: str = "1-24", disk_gb: int = 4, boot: bool = True, engine: str = "auto"
) -> list[str]:
    """What :func:`run_demo` runs, as the commands a user would type (``demo --dry-run`` prints them)."""
    root = dest.resolve()
    return [
        f"image.base --dest {root}/base/debian-base.qcow2 (reused when its sha256 still matches)",
        f"stand-in release {channel} under {root}/upstream",
        f"mirror.create --release-channel {channel} --dest {root}/mirror --source {root}/upstream",
        f"build --os ubuntu --hypervisor baremetal --release-channel {channel} --mirror {root}/mirror"
        f" --offline --disk-gb {disk_gb} --output-dir {root}/output --engine {engine}",
        "image.verify" + ("" if boot else " --no-boot"),
    ]


def run_demo(
    dest: Path,
    *,
    channel: str = "1-24",
    disk_gb: int = 4,
    boot: bool = True,
    mirror_source: str | None = None,
    say: Say = silent,
    status: Say = silent,
    skip_checks: tuple[str, ...] = (),
    engine: str = "auto",
) -> DemoResult:
    """The offline flow end to end; ``say`` reports each step (kept), ``status`` the build's finer progress."""
    dest = dest.resolve()
    release_channel = load_catalog().channel(channel)
    base, digest = ensure_base_image(dest / "base" / "debian-base.qcow2", say)

    upstream = dest / "upstream"
    release = make_standin_release(upstream, release_channel)
    say(f"stand-in release {release_channel.release_name}: {release.manifest_path}")
    source = Mirror.parse(mirror_source) if mirror_source else Mirror(str(upstream))
    mirror_dir = dest / "mirror"
    manifest, items = create_mirror(release.manifest_url, mirror_dir, source=source)
    say(f"mirror: {mirror_dir} ({len(items)} artifacts of {manifest.name}, sha256-verified)")

    config = dest / "baremetal.json"
    with atomic_write(config) as fh:
        json.dump({"source_image_url": str(base), "source_image_checksum": f"sha256:{digest}"}, fh, indent=2)
    plan = make_plan(
        BuildRequest(
            os="ubuntu",
            hypervisor="baremetal",
            release_channel=channel,
            configs={"baremetal": str(config)},
            mirror=str(mirror_dir),
            output_dir=str(dest / "output"),
            offline=True,
            disk_gb=disk_gb,
            engine=engine,
        )
    )
    require(plan.os, plan.provider, skip_checks, say=say)  # the same gate as 'build'
    how = "Packer + QEMU + Ansible" if plan.engine == "packer" else "Ansible in a chroot, no VM"
    say(f"build: {plan.output_name} ({how}, offline); engine {plan.engine}: {plan.engine_reason}")
    build = run_build(plan, say=status)
    assert build.artifact is not None
    say(f"image: {build.artifact}  sha256 {build.sha256}")
    findings = verify_image(build.artifact, manifest=build.manifest, boot=boot)
    return DemoResult(base, mirror_dir, build, findings)
