"""How much disk a build needs, from its work: the preflight's disk check and the plan's "needs N GiB".

Spec 8 sizes a build host at a 50 GB disk: that is the size of a host, not what every build takes. A build needs
room for what it writes: the node artifacts it fetches, the source image it fetches (a local one is read in place),
its working disk (the build VM's, or the chroot engine's when it does not fit in memory), the packaged output
(converted from the working disk) and the checksum and manifest beside it. Disks are thin and outputs sparse or
compressed, so each copy is counted at the data a node image holds, not at ``--disk-gb``: the source image's
allocated bytes plus the node artifacts plus :data:`GROWTH` (an ISO install: :data:`INSTALLED`), never more than
the disk. The sum is what ``preflight`` asks of the workspace's filesystem (the output's too, when it is
elsewhere); spec 8's figure stays the advice for a build host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imagebuilder.plan.model import BuildPlan

GIB = 1024**3
#: the node artifacts a build fetches into its workspace (a release, binaries and image tarballs, is under 1 GiB)
ARTIFACTS = 2 * GIB
#: what provisioning adds to a source image beyond the artifacts (packages, logs, caches before sysprep)
GROWTH = 2 * GIB
#: the data of an ISO install with the node's packages (an installed Ubuntu or RHEL with Kubernetes: 4-6 GB)
INSTALLED = 8 * GIB


@dataclass(frozen=True)
class DiskNeed:
    """Bytes a build writes, by folder and by what they are."""

    workspace: Path
    output: Path
    parts: tuple[tuple[str, Path, int], ...]

    def on(self, folder: Path) -> int:
        """Bytes written on the filesystem of ``folder``."""
        dev = _device(folder)
        return sum(size for _, where, size in self.parts if _device(where) == dev)

    @property
    def total(self) -> int:
        return sum(size for *_, size in self.parts)

    def describe(self) -> str:
        items = ", ".join(f"{what} {size / GIB:.1f}" for what, _, size in self.parts if size)
        return f"needs {self.total / GIB:.1f} GiB ({items})"


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists():
        path = path.parent
    return path


def _device(path: Path) -> int:
    return _existing(path).stat().st_dev


def disk_need(plan: BuildPlan) -> DiskNeed:
    """What ``plan`` writes, and where (its workspace, its output folder)."""
    from imagebuilder.builder.runner import source_image
    from imagebuilder.core import disk
    from imagebuilder.providers import registry

    size = plan.disk_gb * GIB
    work = plan.workspace
    out = plan.output_path.parent if plan.output_path else Path("output").absolute()
    parts: list[tuple[str, Path, int]] = [("node artifacts", work, ARTIFACTS if plan.artifacts else 0)]
    source = source_image(plan)
    if source is None:
        data = min(size, INSTALLED)
    elif "://" in source[0]:
        data = size  # its size is known once fetched: counted at the disk's
        parts.append(("source image", work, size))
    else:
        local = Path(source[0].removeprefix("file://"))
        held = local.stat().st_blocks * 512 if local.is_file() else size
        data = min(size, held + ARTIFACTS + GROWTH)
    if plan.engine == "packer":
        parts.append(("build VM disk", work, data))
        parts.append(("its conversion for packaging", work, data))
    else:
        parts.append(("working disk", work, 0 if disk.scratch_fits_in_memory(size) else data))
    if registry.get(plan.provider).local_artifact:
        parts.append(("output", out, data))
    return DiskNeed(work, out, tuple(parts))
