"""One image: planned and checked, then gated by preflight and built. ``build`` and the demo both run it, so a build
meets the same checks in the same order wherever it starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.builder import runner
from imagebuilder.builder.disk_need import DiskNeed, disk_need
from imagebuilder.builder.estimate import Estimate, build_estimate
from imagebuilder.builder.packer import check_emulator, packer_check
from imagebuilder.builder.resolve import image_based, make_plan
from imagebuilder.core.fetch import is_url
from imagebuilder.core.progress import Say, silent
from imagebuilder.host.preflight import require
from imagebuilder.image.reproducible import source_date_epoch

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from imagebuilder.builder.chroot import Reproducible
    from imagebuilder.builder.packer_plugins import PluginCheck
    from imagebuilder.builder.runner import BuildResult
    from imagebuilder.core.fetch import Mirror
    from imagebuilder.customization.model import Customization
    from imagebuilder.plan.model import BuildPlan, BuildRequest


@dataclass(frozen=True)
class PreparedBuild:
    """A build every input of which was checked: what a dry run reports and what :func:`run_build` runs."""

    plan: BuildPlan
    #: the Packer and plugins it runs (None for the chroot engine)
    tools: PluginCheck | None
    need: DiskNeed
    #: the dry run's look at the source image (None when there is none, or on a real run: checked once fetched)
    source_check: str | None
    customization: Customization | None
    dry_run: bool
    #: about how long its steps take, as the benchmarks measured a build like it (None: none measured)
    estimate: Estimate | None = None


def prepare_build(
    request: BuildRequest,
    *,
    customization: Customization | None = None,
    packer: str | None = None,
    plugins: Path | None = None,
    dry_run: bool = False,
    say: Say = silent,
) -> PreparedBuild:
    """Plan ``request`` and check what can be checked before anything runs: Packer and the plugins its builder needs
    (once the builder is known and before anything is downloaded: a missing plugin exits 2 here, offline included;
    a real run installs what it can), the disk the build writes, and on a dry run what the real run checks first
    (a local source image, the chroot engine's tools)."""
    checks: list[PluginCheck] = []

    def packer_first(builder: str, mirror: Mirror | None, offline: bool) -> None:
        checks.append(packer_check([builder], packer=packer, plugins=plugins, mirror=mirror, offline=offline,
                                   install=not dry_run, say=say))  # fmt: skip

    plan = make_plan(request, before_fetch=packer_first)
    source_date_epoch(plan.manifest.date, 0)  # a bad SOURCE_DATE_EPOCH (or release date) exits 2 now, dry run too
    need = disk_need(plan)
    source_check = "; ".join(dry_run_checks([plan])) or None if dry_run else None
    estimate = build_estimate(plan, image_based(plan.provider, plan.config)) if dry_run else None
    return PreparedBuild(plan, checks[0] if checks else None, need, source_check, customization, dry_run, estimate)


def dry_run_checks(plans: Sequence[BuildPlan]) -> list[str]:
    """What a dry run checks of these plans that the real run checks first: each local source image once (a broken
    one is refused in seconds; a remote one is checked once fetched, before the VM starts) and, for the chroot
    engine, root, the tools and Ansible's chroot connection; for a Packer build VM of another architecture, its
    emulator and firmware. Returns what was checked of the source images."""
    checked: list[str] = []
    for plan in plans:
        check_emulator(plan)
        found = runner.check_source_image(plan)
        if found and found not in checked:
            checked.append(found)
        source = runner.source_image(plan)
        if plan.hardening is not None and source is not None and not is_url(source[0]):
            from imagebuilder.hardening.run import check_ahead

            checked.append(check_ahead(plan.hardening, Path(source[0].removeprefix("file://")), mirror=plan.mirror))
    machines = dict.fromkeys(p.arch for p in plans if p.engine == "chroot")
    if machines:
        from imagebuilder.builder.chroot import check_engine

        for machine in machines:
            check_engine(machine)
    return checked


def preflight_skips(skip_checks: Sequence[str], tools: PluginCheck | None) -> list[str]:
    """The preflight checks a run skips: the user's, and Packer's when no Packer runs (the chroot engine); a Packer
    build's plugins were checked, and installed, when it was prepared."""
    return [*skip_checks, *(["packer"] if tools is None else [])]


def run_build(
    prepared: PreparedBuild,
    *,
    skip_checks: Sequence[str] = (),
    min_disk_gb: int | None = None,
    keep_on_error: bool = False,
    signer: Signer | None = None,
    say: Say = silent,
    status: Say = silent,
    reproducible: Reproducible | None = None,
) -> BuildResult:
    """Gate the build on this host's preflight (its report through ``say``), then run it (its progress through
    ``status``). ``reproducible``: SOURCE_DATE_EPOCH and hash seed a rebuild takes from the provenance."""
    if prepared.dry_run:
        raise ValueError("a dry run's preparation is not run")  # a caller's mistake, never the user's
    plan = prepared.plan
    require(plan.os, plan.provider, preflight_skips(skip_checks, prepared.tools), min_disk_gb, say=say,
            checked=prepared.tools, need=prepared.need, arch=plan.arch)  # fmt: skip
    return runner.run_build(plan, keep_on_error=keep_on_error, customization=prepared.customization, say=status,
                            plugins=prepared.tools, signer=signer, reproducible=reproducible)  # fmt: skip
