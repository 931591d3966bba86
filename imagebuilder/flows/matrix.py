"""Many images at once: every plan checked as one build's is, then gated by one preflight per OS and provider pair,
then built with the OS layers shared (:mod:`imagebuilder.builder.matrix`); or the CI definition that runs them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.builder import matrix
from imagebuilder.builder.disk_need import DiskNeed, disk_need
from imagebuilder.builder.packer import prepare_packer
from imagebuilder.core.errors import InputError
from imagebuilder.core.progress import Say, silent
from imagebuilder.flows.build import dry_run_checks, preflight_skips
from imagebuilder.host.preflight import require

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from imagebuilder.builder.ci_emit import CiOptions
    from imagebuilder.builder.packer_plugins import PluginCheck
    from imagebuilder.customization.model import Customization
    from imagebuilder.plan.model import BuildPlan, BuildRequest


@dataclass(frozen=True)
class PreparedMatrix:
    """Every plan of a matrix, checked: what its dry run reports and what :func:`run_matrix` runs."""

    plans: list[BuildPlan]
    tools: PluginCheck | None
    #: the disk each plan writes, in the plans' order
    needs: list[DiskNeed]
    #: the dry run's look at each local source image, once per image
    source_checks: list[str]
    customization: Customization | None
    dry_run: bool

    def parallelism(self, jobs: int | None) -> int:
        return matrix.parallelism(self.plans, jobs)


def prepare_matrix(
    request: BuildRequest,
    pairs: list[tuple[str, str]],
    channels: list[str],
    *,
    customization: Customization | None = None,
    packer: str | None = None,
    plugins: Path | None = None,
    dry_run: bool = False,
    say: Say = silent,
    arches: tuple[str, ...] = ("amd64",),
) -> PreparedMatrix:
    """One plan per pair and channel, each validated as ``build`` validates it, and the same checks before anything
    runs: Packer and the plugins of every builder, the disk each writes, and on a dry run the source images and the
    chroot engine's tools."""
    plans = matrix.expand(request, pairs, channels, arches)
    tools = prepare_packer(plans, packer=packer, plugins=plugins, install=not dry_run, say=say)
    needs = [disk_need(p) for p in plans]
    checks = dry_run_checks(plans) if dry_run else []
    return PreparedMatrix(plans, tools, needs, checks, customization, dry_run)


def emit_matrix(
    kind: str, request: BuildRequest, pairs: list[tuple[str, str]], channels: list[str], *, customize: str | None,
    options: CiOptions, arches: tuple[str, ...] = ("amd64",)
) -> str:  # fmt: skip
    """The CI definition (``github-actions`` or ``gitlab-ci``) that runs this matrix, its plans validated first."""
    from imagebuilder.builder.ci_emit import emit_ci, manifest_secret

    planned = request
    secret = manifest_secret(request)
    if secret is not None:  # the plan reads the manifest the jobs will: the variable's value here
        value = os.environ.get(secret.name, "")
        if not value:
            raise InputError(f"${secret.name} is not set here", field="--release-manifest",
                             expected=f"{secret.name} set in this environment too: the pipeline is planned from the "
                             "manifest it names")  # fmt: skip
        planned = dataclasses.replace(request, release_manifest=value)
    return emit_ci(kind, matrix.expand(planned, pairs, channels, arches), request=request, customize=customize,
                   options=options)  # fmt: skip


def run_matrix(
    prepared: PreparedMatrix,
    *,
    skip_checks: Sequence[str] = (),
    min_disk_gb: int | None = None,
    jobs: int | None = None,
    force: bool = False,
    layer_cache: Path | None = None,
    layer_only: bool = False,
    keep_on_error: bool = False,
    signer: Signer | None = None,
    say: Say = silent,
    status: Say = silent,
) -> list[matrix.MatrixRow]:
    """Gate the matrix on this host's preflight, once per OS and provider pair (with the disk of that pair's largest
    build: the builds' workspaces come and go, one at a time per job), then build every plan."""
    if prepared.dry_run:
        raise ValueError("a dry run's preparation is not run")  # a caller's mistake, never the user's
    largest: dict[tuple[str, str, str], DiskNeed] = {}
    packer_pairs: set[tuple[str, str, str]] = set()
    for plan, need in zip(prepared.plans, prepared.needs, strict=True):
        key = (plan.os, plan.provider, plan.arch)
        if key not in largest or need.total > largest[key].total:
            largest[key] = need
        if plan.engine == "packer":
            packer_pairs.add(key)
    for (os_name, provider, arch), need in largest.items():
        tools = prepared.tools if (os_name, provider, arch) in packer_pairs else None  # a chroot pair runs no Packer
        require(os_name, provider, preflight_skips(skip_checks, tools), min_disk_gb, say=say, checked=tools,
                need=need, arch=arch)  # fmt: skip
    return matrix.run_matrix(prepared.plans, customization=prepared.customization, jobs=jobs, force=force,
                             layer_cache=layer_cache, layer_only=layer_only, say=status, keep_on_error=keep_on_error,
                             plugins=prepared.tools, signer=signer)  # fmt: skip
