"""Hostile images for the chroot engine: an image's /etc/fstab is the image's text, and the engine mounts what it
names as root on the build host. A mount point that climbs out with '..' or leads out through a symbolic link in the
image (an absolute link resolves against the host) is refused (exit 2) and nothing stays mounted or attached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuilder.builder.chroot_mounts import attached
from imagebuilder.core import disk
from tests.support.common import ROOT

pytestmark = pytest.mark.root

LAYOUT = "label: gpt\nstart=2048, size=16384, type=linux, name=data\nstart=18432, type=linux, name=root\n"


def make_disk(tmp_path: Path, fstab_point: str, link: tuple[str, str] | None = None) -> Path:
    """A GPT disk: a small ext4 'data' partition and an ext4 root whose fstab mounts 'data' at ``fstab_point``."""
    raw = tmp_path / "disk.raw"
    with raw.open("wb") as fh:
        fh.truncate(64 * 1024 * 1024)
    subprocess.run(["sfdisk", "--quiet", str(raw)], input=LAYOUT, text=True, check=True)
    _, (data, root) = disk.partitions(raw)
    with disk.loop_device(raw, data.offset, data.length) as dev:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "data", dev], check=True)
    # the root is filled from a directory by mke2fs (-d), never mounted here: a mount made in this process, in the
    # host's namespace, is copied by any namespace another test makes meanwhile (``ip netns exec``), and the copy
    # keeps the loop device attached after it is detached (seen in CI)
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "fstab").write_text(f"LABEL=root / ext4 defaults 0 1\nLABEL=data {fstab_point} ext4 defaults 0 2\n")
    if link:
        os.symlink(link[1], tree / link[0])
    with disk.loop_device(raw, root.offset, root.length) as dev:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(tree), dev], check=True)
    return raw


#: the refused attach, in a process of its own that mounts in a mount namespace of its own first, as the chroot
#: engine's child does (``unshare --mount``): in the test's process, in the host's namespace, a namespace another
#: test made meanwhile (``ip netns exec``, a chroot build's) took a copy of the image's mount, which kept its loop
#: device attached past the tool's 60 s wait after it had unmounted and detached it (seen in a CI simulation)
_REFUSED = """
import sys
from pathlib import Path
from imagebuilder.builder.chroot_mounts import attached
from imagebuilder.core import disk
from imagebuilder.core.errors import InputError
raw, root = Path(sys.argv[1]), Path(sys.argv[2])
disk.private_mounts()
try:
    with attached(raw, root, log=lambda _t: None):
        print("attached")
except InputError as exc:
    print("refused:", exc)
print("still mounted:", disk.mounts_under(root.parent))
"""


@pytest.mark.parametrize(
    ("point", "link"),
    [
        ("/../../../../tmp/ib-escape", None),  # climbs out
        ("/mnt/data", ("mnt", "/tmp")),  # an absolute link in the image resolves against the host
        ("/srv", ("srv", "../../../../../tmp")),  # a relative link that climbs out
    ],
)
def test_fstab_mount_points_cannot_leave_the_image(tmp_path: Path, point: str, link: tuple[str, str] | None) -> None:
    raw = make_disk(tmp_path, point, link)
    res = subprocess.run([sys.executable, "-c", _REFUSED, str(raw), str(tmp_path / "root")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused:" in res.stdout and "fstab mount point" in res.stdout, res.stdout
    assert "still mounted: []" in res.stdout, "nothing stays mounted"
    # the loop devices of this image only: other tests attach and detach their own meanwhile
    left = subprocess.run(["losetup", "-j", str(raw)], capture_output=True, text=True, check=True).stdout
    assert not left, f"nothing stays attached: {left}"
    assert not Path("/tmp/ib-escape").exists()


def test_a_mount_point_inside_the_image_is_mounted_and_released(tmp_path: Path) -> None:
    raw = make_disk(tmp_path, "/var/lib/data")
    with attached(raw, tmp_path / "root", log=lambda _t: None) as root:
        assert (root / "var/lib/data/lost+found").is_dir(), "the data partition is mounted where fstab says"
        assert len(disk.mounts_under(tmp_path)) == 2
    assert not disk.mounts_under(tmp_path)
