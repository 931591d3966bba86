"""The one disk helper: image views, partition tables, loop devices and mounts, a chroot's mounts, what dead runs left,
and scratch space.

Why one package: a disk image is attached, mounted and released in three places (``image.base`` assembles one,
``image.verify`` inspects one, the boot checks read one), and the way a mount is released decides whether the image
is safe to ship. An unmount that gives up and detaches lazily leaves the filesystem mounted while the image is
copied, with a journal that the first boot replays over whatever was written to the disk behind the kernel's back
(the boot sector). So a mount is released only for real: whatever still holds it is stopped first, and if it still
cannot be unmounted the operation fails, naming the holders, instead of carrying on.

By job, each a module: image views (:mod:`.views`), partition tables, loop devices and mounts (:mod:`.attach`), a
chroot's mounts (:mod:`.chroot`), all unmounting and detaching (:mod:`.releasing`), what dead runs left
(:mod:`.deadruns`), and scratch space (:mod:`.scratch`, in the places :mod:`.places` names). Callers use the names
below (``from imagebuilder.core import disk``; ``disk.raw_view``), not the modules.
"""

from __future__ import annotations

from imagebuilder.core.disk.attach import (
    LINUX_TYPES,
    SECTOR,
    Partition,
    ext_superblock,
    grow_filesystem,
    grow_last_partition,
    loop_device,
    mounted,
    mounted_root,
    partitions,
    private_mounts,
    root_partition,
)
from imagebuilder.core.disk.chroot import CHROOT_MOUNTS, POLICY_RC_D, chroot_mounts
from imagebuilder.core.disk.deadruns import (
    RUN_MARKER,
    Leftover,
    claim,
    leftovers,
    release,
    stale_partials,
    stale_processes,
    stale_scratch,
    stale_workspaces,
    sweep_once,
    sweep_scratch,
    unclaim,
)
from imagebuilder.core.disk.releasing import (
    Holder,
    detach_backing,
    detach_loop,
    holders,
    mounts,
    mounts_under,
    remove_tree,
    stop_holders,
    unmount,
)
from imagebuilder.core.disk.scratch import SCRATCH_RESERVE, run_tempdir, scratch_dir, scratch_fits_in_memory
from imagebuilder.core.disk.views import (
    GzipMember,
    copy_sparse,
    data_extents,
    gunzip_sparse,
    image_format,
    raw_view,
    read_partition,
    write_partition,
)

__all__ = [
    "CHROOT_MOUNTS",
    "LINUX_TYPES",
    "POLICY_RC_D",
    "RUN_MARKER",
    "SCRATCH_RESERVE",
    "SECTOR",
    "GzipMember",
    "Holder",
    "Leftover",
    "Partition",
    "chroot_mounts",
    "claim",
    "copy_sparse",
    "data_extents",
    "detach_backing",
    "detach_loop",
    "ext_superblock",
    "grow_filesystem",
    "grow_last_partition",
    "gunzip_sparse",
    "holders",
    "image_format",
    "leftovers",
    "loop_device",
    "mounted",
    "mounted_root",
    "mounts",
    "mounts_under",
    "partitions",
    "private_mounts",
    "raw_view",
    "read_partition",
    "release",
    "remove_tree",
    "root_partition",
    "run_tempdir",
    "scratch_dir",
    "scratch_fits_in_memory",
    "stale_partials",
    "stale_processes",
    "stale_scratch",
    "stale_workspaces",
    "stop_holders",
    "sweep_once",
    "sweep_scratch",
    "unclaim",
    "unmount",
    "write_partition",
]
