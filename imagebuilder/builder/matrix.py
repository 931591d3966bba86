"""``build.matrix``: many images at once, sharing what they have in common.

A release is many images (OS x provider x channel), and each of them rebuilt the same OS part: base image,
packages and node settings. Here that part is the **OS layer**: built once by the chroot engine
(``node.yml`` with ``node_layers: [os]``), kept as a qcow2 under a name that is the SHA-256 of everything it is
made of (the base image's checksum, the OS, its version, the firmware, the disk size, the files of the roles that
make it, this tool's version), and every channel then runs only its own part (``[kubernetes]``: binaries, images,
provider, custom roles, sysprep) on a copy of it. Changing a role or the base image changes the name, so a stale
layer is never used; a layer is written atomically, so a crash never leaves a half one to be reused. The layer's
bytes are also compressed once for all its images: they share its gzip members (:mod:`imagebuilder.image.gzipdisk`),
which a background thread starts making while the images are still provisioned.

Builds run in parallel up to what this host has room for (cores and memory, or ``--jobs``); an output whose build
manifest records the same inputs (:func:`inputs_digest`) and whose artifact is still there is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuilder.builder.chroot import OsLayer, Reproducible, run_chroot_build
from imagebuilder.builder.inputs import digest, inputs_digest, layer_inputs, layer_seed
from imagebuilder.builder.packer_plugins import PluginCheck
from imagebuilder.builder.resolve import make_plan
from imagebuilder.core import disk
from imagebuilder.core.errors import ExternalError, ImageBuilderError, InputError
from imagebuilder.core.files import atomic_write, parse_json, partial_prefix, read_text, run_checked
from imagebuilder.core.paths import workspace_root
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.untrusted import Redactor
from imagebuilder.customization.model import Customization
from imagebuilder.image.bootcheck import check_image
from imagebuilder.image.gzipdisk import Base, prime
from imagebuilder.plan.model import BuildPlan, BuildRequest
from imagebuilder.plan.request import check_matrix
from imagebuilder.release.catalog import load_catalog

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

#: what one build needs, to bound the parallelism: a chroot build (Ansible, then compression) or a Packer build (a VM)
CHROOT_BUILD = {"cpus": 1, "memory_mb": 1536}


def layer_cache_root() -> Path:
    """Where OS layers are kept: ``$IMAGE_BUILDER_LAYER_CACHE``, else beside the build workspace."""
    env = os.environ.get("IMAGE_BUILDER_LAYER_CACHE")
    return Path(env).expanduser() if env else workspace_root().parent / "layers"


def layer_path(plan: BuildPlan, cache: Path) -> Path:
    return cache / f"os-{plan.os}-{plan.os_version.version}-{digest(layer_inputs(plan))[:32]}.qcow2"


class LayerBuilds:
    """The OS layers of one matrix run, each built once, and written to the cache without holding up the builds.

    A layer is provisioned as a raw disk (in memory when it fits: :func:`~imagebuilder.core.disk.scratch_dir`). The
    builds of the run copy that raw disk (no conversion) and start from the facts its Ansible run gathered, while
    one background thread writes the durable qcow2 into the cache (converted without going through the page
    cache, flushed, renamed into place, so a crash never leaves a half layer to be reused) and another compresses
    the layer's MiBs into its member store at a low priority (:func:`~imagebuilder.image.gzipdisk.prime`), which its
    images then only copy when they are packaged: a MiB of an image equal to the layer's at the same offset is
    found by comparing, not hashing. :meth:`close` waits for both and removes the raw disk and the workspaces; a
    later run finds the qcow2 and its members and copies them."""

    def __init__(self, cache: Path, *, say: Say = silent, prime_workers: int = 1) -> None:
        self.cache = cache
        self.say = say
        self.prime_workers = prime_workers
        self._stop = threading.Event()
        self._lock = threading.Lock()  # two channels of one OS wait for one layer, never build it twice
        self._layers: dict[Path, OsLayer] = {}
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layer-save")
        self._primer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layer-members")
        self._saves: list[Future[None]] = []
        self._primes: list[Future[None]] = []
        self._work: list[Path] = []
        self._scratch = contextlib.ExitStack()  # the layers' raw disks, in memory when they fit

    def get(self, plan: BuildPlan) -> tuple[OsLayer, bool]:
        """The OS layer of ``plan``: this run's or the cache's (False), or built now (True)."""
        target = layer_path(plan, self.cache)
        with self._lock:
            if target in self._layers:
                return self._layers[target], False
            if target.is_file():
                self.say(f"OS layer: {target.name} (cached)")
                layer, built = OsLayer(target, target), False
            else:
                layer, built = self._build(plan, target), True
            self._layers[target] = layer
            return layer, built

    def _build(self, plan: BuildPlan, target: Path) -> OsLayer:
        from imagebuilder.builder.runner import prepare_source_image

        self.cache.mkdir(parents=True, exist_ok=True)
        # what a killed run was writing into the cache (a layer's qcow2, gzip members in a layer's store), then this
        # run's workspace for the layer, marked as its own like a build's: killed, it is released by the next run
        disk.release(disk.stale_partials(self.cache, recursive=True))
        work = plan.workspace / f"layer-{target.stem}-{os.getpid()}"
        disk.claim(work)
        self._work.append(work)
        log_path = self.cache / f"{target.stem}.log"
        self.say(f"OS layer: building {target.name} (chroot: packages, node settings)")
        with log_path.open("w") as log:
            source = prepare_source_image(plan, work, self.say)
            assert source is not None
            scratch = self._scratch.enter_context(
                disk.scratch_dir(work / "scratch", size=plan.disk_gb * 1024**3, log=self.say)
            )
            # sealed as a reproducible layer: laid out afresh from its tree, the filesystem its images' changes are
            # applied to (imagebuilder.image.fsdelta), so they keep its blocks and share its compressed MiBs
            seal = Reproducible(0, layer_seed(plan, ""))  # a layer's time is its source's (reproducible.layer_epoch)
            raw = run_chroot_build(plan, source, scratch / "chroot", customization=None, log=log,
                                   redact=Redactor(plan.config.secret_values() if plan.config else []),
                                   status=self.say, layers=("os",), output=scratch / "layer.raw",
                                   output_format="raw", reproducible=seal)  # fmt: skip
        check = check_image(raw, work_dir=work)
        if not check.ok:
            raise ExternalError("the OS layer would not boot: " + "; ".join(check.problems), hint=f"read {log_path}")
        layer = OsLayer(target, raw, base=Base(raw), facts=scratch / "chroot" / "facts")
        self._saves.append(self._saver.submit(self._save, plan, raw, target))
        # the layer's bytes are in every image built on it: compress them once, meanwhile, with the idle CPU (and
        # learn which member each MiB is, so that its images compare their MiBs with it rather than hash them)
        self._primes.append(self._primer.submit(prime, raw, layer.members, workers=self.prime_workers, stop=self._stop,
                                                base=layer.base))  # fmt: skip
        return layer

    def _save(self, plan: BuildPlan, raw: Path, target: Path) -> None:
        tmp = self.cache / f"{partial_prefix(target)}layer.tmp"
        try:
            # -t none: written straight to the device (O_DIRECT), not as gigabytes of dirty pages that would hold up
            # the writes of the builds running meanwhile; through the page cache where the filesystem has no
            # O_DIRECT (tmpfs before Linux 6.6)
            try:
                run_checked("qemu-img", "convert", "-t", "none", "-f", "raw", "-O", "qcow2", str(raw), str(tmp))
            except ExternalError:
                run_checked("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(tmp))
            with atomic_write(self.cache / f"{target.stem}.json") as fh:
                fh.write(json.dumps(layer_inputs(plan), indent=2) + "\n")
            os.replace(tmp, target)
            self.say(f"OS layer: {target.name} saved to the cache")
        finally:
            tmp.unlink(missing_ok=True)

    def close(self, *, interrupted: bool = False) -> None:
        """Wait for the layers to reach the cache (raising the first failure unless ``interrupted``: Ctrl-C or a
        failure, whose own error is the one to report) and for their members (a help, never a failure: what is
        missing is compressed when an image needs it), then remove the workspaces."""
        if interrupted:
            self._stop.set()  # the members not yet compressed are left for later
        self._saver.shutdown(wait=True)
        self._primer.shutdown(wait=True)
        try:
            for primed in self._primes:
                if primed.exception() is not None:
                    self.say(f"warning: the OS layer's members were not all compressed ahead: {primed.exception()}")
            for save in self._saves:
                if not interrupted:
                    save.result()
        finally:
            self._scratch.close()
            for work in self._work:
                disk.remove_tree(work)


@dataclass
class MatrixRow:
    plan: BuildPlan
    status: str = "pending"  #: built, skipped, failed
    seconds: float = 0.0
    layer: str = "-"
    detail: str = ""


def expand(
    request: BuildRequest, pairs: list[tuple[str, str]], channels: list[str], arches: tuple[str, ...] = ("amd64",)
) -> list[BuildPlan]:
    """One plan per (os, provider) pair, channel and architecture, each validated as ``build`` validates it (a pair
    not built for an architecture is refused naming why), each architecture's from its own provider config."""
    check_matrix(request.release_manifest, channels)
    catalog = load_catalog()
    # an architecture a pair is not built for is the matrix's first mistake, told before any entry's own
    for os_name, provider in pairs:
        pair = catalog.build_pair(catalog.os(os_name), catalog.provider(provider))
        for arch in arches:
            pair.check_built_for(arch)
    plans: list[BuildPlan] = []
    seen: set[str] = set()
    for os_name, provider in pairs:
        real_provider = catalog.provider(provider).name
        for arch in arches:
            entry = request.for_arch(arch)
            configs = {k: v for k, v in entry.configs.items() if k == real_provider}
            for channel in channels:
                plan = make_plan(dataclasses.replace(entry, os=os_name, hypervisor=provider, release_channel=channel,
                                                     configs=configs))  # fmt: skip
                key = plan.output_name
                if key in seen:
                    raise InputError(f"two entries make the same image {key}", field="--release-channel")
                seen.add(key)
                plans.append(plan)
    return plans


def recorded_inputs(plan: BuildPlan) -> str | None:
    """The inputs digest of the build manifest beside ``plan``'s output, when that output is whole: the artifact,
    its ``.sha256`` and the manifest all there and agreeing (name, size, digest), and the manifest written after the
    artifact (a run killed between the two left a new artifact beside an older manifest: never trusted)."""
    if plan.output_path is None:
        return None
    artifact_path = plan.output_path
    manifest = artifact_path.parent / f"{plan.output_stem}.build-manifest.json"
    sidecar = artifact_path.with_name(artifact_path.name + ".sha256")
    if not (manifest.is_file() and artifact_path.is_file() and sidecar.is_file()):
        return None
    try:
        data = parse_json(read_text(manifest, "build manifest"), manifest)
        recorded_sha = (sidecar.read_text().split() or [""])[0]
        written, made = manifest.stat().st_mtime_ns, artifact_path.stat()
    except (ImageBuilderError, OSError, UnicodeDecodeError):
        return None
    artifact = data.get("artifact") if isinstance(data, dict) else None
    if not isinstance(artifact, dict) or written < made.st_mtime_ns:
        return None
    if (artifact.get("name"), artifact.get("size"), artifact.get("sha256")) != (
        artifact_path.name,
        made.st_size,
        recorded_sha,
    ):
        return None
    digest = data.get("inputs_sha256")
    return digest if isinstance(digest, str) else None


def parallelism(plans: list[BuildPlan], jobs: int | None) -> int:
    """How many builds run at once: ``jobs``, else what the cores and memory hold for the biggest build."""
    if jobs:
        return max(1, min(jobs, len(plans)))
    vm = load_catalog().build_vm
    needs = [CHROOT_BUILD if p.engine == "chroot" else {"cpus": vm["cpus"], "memory_mb": vm["memory_mb"] + 1024}
             for p in plans] or [CHROOT_BUILD]  # fmt: skip
    need = {"cpus": max(n["cpus"] for n in needs), "memory_mb": max(n["memory_mb"] for n in needs)}
    cores = os.cpu_count() or 1
    try:
        available_mb = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError):
        available_mb = need["memory_mb"]
    return max(1, min(len(plans), cores // need["cpus"], available_mb // need["memory_mb"]))


def run_matrix(
    plans: list[BuildPlan],
    *,
    customization: Customization | None = None,
    jobs: int | None = None,
    force: bool = False,
    layer_cache: Path | None = None,
    layer_only: bool = False,
    say: Say = silent,
    keep_on_error: bool = False,
    build: Callable[..., Any] | None = None,
    plugins: PluginCheck | None = None,
    signer: Signer | None = None,
) -> list[MatrixRow]:
    """Build every plan (OS layers first, once each), skipping outputs already built from the same inputs."""
    from imagebuilder.builder.runner import run_build

    build = build or run_build
    cache = layer_cache or layer_cache_root()
    rows = [MatrixRow(p) for p in plans]
    todo: list[MatrixRow] = []
    for row in rows:
        digest = inputs_digest(row.plan, customization)
        if not force and not layer_only and recorded_inputs(row.plan) == digest:
            row.status, row.detail = "skipped", "its build manifest records the same inputs"
        else:
            todo.append(row)
    chosen: dict[int, OsLayer] = {}

    def one(i: int) -> None:
        row = todo[i]
        start = time.monotonic()
        try:
            result = build(row.plan, customization=customization, os_layer=chosen.get(i), say=say,
                           inputs_sha256=inputs_digest(row.plan, customization),
                           keep_on_error=keep_on_error, plugins=plugins, signer=signer)  # fmt: skip
            row.status, row.detail = "built", str(result.artifact or result.manifest)
        except ImageBuilderError as exc:
            row.status, row.detail = "failed", str(exc).splitlines()[0]
        row.seconds += time.monotonic() - start

    # a layer-only run (a CI job that makes the layer for the image jobs) compresses its members on every core
    layers = LayerBuilds(cache, say=say, prime_workers=(os.cpu_count() or 1) if layer_only else 1)
    try:
        for i, row in enumerate(todo):
            if row.plan.engine != "chroot":
                continue
            start = time.monotonic()
            seen = set(chosen.values())
            chosen[i], built = layers.get(row.plan)
            row.seconds += time.monotonic() - start
            row.layer = "built" if built else "shared" if chosen[i] in seen else "cached"
        if layer_only:
            for row in todo:
                row.status = "layer" if row.plan.engine == "chroot" else "no layer (packer)"
        else:
            with ThreadPoolExecutor(max_workers=parallelism([r.plan for r in todo], jobs)) as pool:
                list(pool.map(one, range(len(todo))))
    except BaseException:
        layers.close(interrupted=True)  # Ctrl-C or a failure: what is not compressed yet stays so
        raise
    layers.close()
    return rows
