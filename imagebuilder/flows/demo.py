"""The offline flow end to end, as ``invoke demo`` runs it: base image, release, mirror, bare-metal build, verify: a
flow of flows (the build is :mod:`imagebuilder.flows.build`'s, with the same checks and gate as ``build``).

By default the release is Kubernetes built from upstream source (``release.build``, cached: about 15 minutes the
first time on 2 cores, seconds after) and the image is proven by nodes: ``image.verify --node-check --join`` runs the
image's own control plane on the host and joins two copies of the image to it as nodes. ``--standin`` keeps the
quick flow on a stand-in release whose binaries are scripts (labelled so), verified to a login prompt. Each step is
the same library call a user's command makes. Steps converge: a rerun reuses a base image, release and mirror whose
checksums still match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuilder.builder.runner import BuildResult
from imagebuilder.builder.verify import Finding, verify_image
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.files import atomic_write
from imagebuilder.core.progress import Say, silent
from imagebuilder.flows.build import prepare_build, run_build
from imagebuilder.image.base import make_base_image
from imagebuilder.plan.model import BuildRequest
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.mirror import create_mirror, file_sha256
from imagebuilder.release.source import DEFAULT_BASE_URL, build_release, manifest_url, parse_version
from imagebuilder.release.standin import make_standin_release

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from imagebuilder.hardening.model import HardeningRequest


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


#: the release the demo builds from source
#: the newest Kubernetes this project builds from source and proves by a node: 1.36's newest patch on the Go module
#: proxy (the distro's 1-36 is v1.36.2), with its line's runtime, containerd v2.3.1 (and the runc v1.4.2 it pins)
DEMO_KUBERNETES = "v1.36.3"
STANDIN_CHANNEL = "1-24"


def demo_steps(
    dest: Path,
    *,
    channel: str = STANDIN_CHANNEL,
    disk_gb: int = 4,
    boot: bool = True,
    engine: str = "auto",
    standin: bool = False,
    kubernetes: str = DEMO_KUBERNETES,
    hardening: HardeningRequest | None = None,
) -> list[str]:
    """What :func:`run_demo` runs, as the commands a user would type (``demo --dry-run`` prints them)."""
    root = dest.resolve()
    if standin:
        release = f"stand-in release {channel} under {root}/upstream (its binaries are scripts: labelled so)"
        manifest = ""
    else:
        channel = f"1-{parse_version(kubernetes)[1]}"
        release = f"release.build --kubernetes {kubernetes} --dest {root}/upstream-source (from source, cached)"
        manifest = f" --release-manifest {manifest_url(DEFAULT_BASE_URL, channel)}"
    upstream = f"{root}/upstream" if standin else f"{root}/upstream-source"
    verify = "image.verify" + ("" if boot else " --no-boot") + ("" if standin or not boot else " --node-check --join")
    chosen, why = _demo_engine(root, engine)
    harden = f" --hardening {hardening.profile}" if hardening else ""
    return [
        f"image.base --dest {root}/base/debian-base.qcow2 (reused when its sha256 still matches)",
        release,
        f"mirror.create --release-channel {channel}{manifest} --dest {root}/mirror --source {upstream}",
        f"build --os ubuntu --hypervisor baremetal --release-channel {channel}{manifest} --mirror {root}/mirror"
        f" --offline --disk-gb {disk_gb} --output-dir {root}/output --engine {engine}{harden}  ({chosen}: {why})",
        verify,
    ]


def _demo_engine(root: Path, engine: str) -> tuple[str, str]:
    """The engine the demo's build gets (``auto`` resolved here as the build will resolve it: a bare-metal build from
    the base image), and why."""
    from imagebuilder.builder.resolve import choose_engine
    from imagebuilder.providers import registry

    provider = registry.get("baremetal")
    # the config the demo writes once the base image is made (not there yet on a dry run: not validated here)
    fields: dict[str, Any] = {"source_image_url": str(root / "base" / "debian-base.qcow2")}
    config = provider.config_model.model_construct(**fields)
    return choose_engine(engine, provider.name, config)


def run_demo(
    dest: Path,
    *,
    channel: str = STANDIN_CHANNEL,
    disk_gb: int = 4,
    boot: bool = True,
    mirror_source: str | None = None,
    say: Say = silent,
    status: Say = silent,
    skip_checks: tuple[str, ...] = (),
    engine: str = "auto",
    standin: bool = False,
    kubernetes: str = DEMO_KUBERNETES,
    signer: Signer | None = None,
    hardening: HardeningRequest | None = None,
) -> DemoResult:
    """The offline flow end to end; ``say`` reports each step (kept), ``status`` the build's finer progress.
    ``standin``: the stand-in release of ``channel``; else Kubernetes ``kubernetes`` built from source and the
    image proven by a node (when ``boot``)."""
    dest = dest.resolve()
    if standin:
        release_channel = load_catalog().channel(channel)
    else:
        channel = f"1-{parse_version(kubernetes)[1]}"
        release_channel = load_catalog().channel(channel)
    base, digest = ensure_base_image(dest / "base" / "debian-base.qcow2", say)

    if standin:
        upstream = dest / "upstream"
        release = make_standin_release(upstream, release_channel)
        manifest_location = release.manifest_url
        say(f"stand-in release {release_channel.release_name}: {release.manifest_path}")
        release_manifest = None
    else:
        upstream = dest / "upstream-source"
        say(f"release: Kubernetes {kubernetes} from upstream source (cached after the first run, about 15 minutes)")
        built = build_release(kubernetes, upstream, say=status)
        manifest_location = release_manifest = built.manifest_url
        say(f"release {built.manifest_path.stem} (built from source): {built.manifest_path}")
    source = Mirror.parse(mirror_source) if mirror_source else Mirror(str(upstream))
    mirror_dir = dest / "mirror"
    # a stand-in release's image takes the OS's containerd (its binaries are scripts: no node runs on it)
    runtime = None if standin else release_channel.runtime
    manifest, items = create_mirror(manifest_location, mirror_dir, runtime=runtime, source=source)
    say(f"mirror: {mirror_dir} ({len(items)} artifacts of {manifest.name}, sha256-verified)")

    config = dest / "baremetal.json"
    with atomic_write(config) as fh:
        json.dump({"source_image_url": str(base), "source_image_checksum": f"sha256:{digest}"}, fh, indent=2)
    prepared = prepare_build(
        BuildRequest(
            os="ubuntu",
            hypervisor="baremetal",
            release_channel=channel,
            release_manifest=release_manifest,
            configs={"baremetal": str(config)},
            mirror=str(mirror_dir),
            output_dir=str(dest / "output"),
            offline=True,
            disk_gb=disk_gb,
            engine=engine,
            runtime="os" if standin else None,
            hardening=hardening,
        ),
        say=say,
    )
    plan = prepared.plan
    how = "Packer + QEMU + Ansible" if plan.engine == "packer" else "Ansible in a chroot, no VM"
    say(f"build: {plan.output_name} ({how}, offline); engine {plan.engine}: {plan.engine_reason}")
    build = run_build(prepared, skip_checks=skip_checks, say=say, status=status, signer=signer)  # as 'build'
    assert build.artifact is not None
    say(f"image: {build.artifact}  sha256 {build.sha256}")
    if boot and not standin:
        say(
            "node check: the image's control plane on this host, two copies of the image under QEMU join it as nodes, "
            "then kube-proxy, CoreDNS and a pod on the second node"
        )
    findings = verify_image(build.artifact, manifest=build.manifest, boot=boot, kubernetes=boot and not standin,
                            join=boot and not standin, say=status)  # fmt: skip
    return DemoResult(base, mirror_dir, build, findings)
