"""What the test suite builds from upstream source, named once: the fixtures take the builds from
~/.cache/image-builder, and ``./scripts/setup.sh --test`` starts making them in the background, so that on a machine
without them the tests start meanwhile; a fixture that asks for a component being built waits for it (one builder per
component: imagebuilder/release/source.py).

    .venv/bin/python -m tests.support.sources     (from the repository root; a second run takes seconds)
    .venv/bin/python -m tests.support.sources --arm64-base     (the arm64 base image; root)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

#: the release the offline end-to-end test builds, mirrors and proves on a node (the demo's default too)
SOURCE_RELEASE = "v1.36.3"
#: the runtime of a containerd 1.7 line (1-30 .. 1-33): containerd and crictl, as the reference's bundle names them
RUNTIME_1_7 = ("v1.7.28", "v1.36.0")
#: the ComplianceAsCode product of the suite's base image (image.base: Debian 12), which the hardening tests harden
HARDENING_PRODUCT = "debian12"


#: what an arm64 base image is made by: image.base's code and the architecture table (its cache key, with the suite)
ARM64_BASE_INPUTS = ("imagebuilder/image/base.py", "imagebuilder/core/arch.py", "imagebuilder/core/disk/chroot.py")


def arm64_base() -> Path:
    """``image.base --arch arm64``'s image, made for real by the CLI (debootstrap of Debian's arm64 packages through
    qemu-user: half an hour on 2 cores, mostly waiting on the archive and on emulated package scripts) and kept in
    ~/.cache/image-builder/arm64-base by its inputs; setup.sh --test starts it in the background, and whoever asks
    meanwhile waits for that one."""
    from imagebuilder.core.files import held
    from imagebuilder.core.paths import cache_root
    from tests.support.common import ROOT, local_shortcut

    reuse = local_shortcut("IMAGE_BUILDER_TEST_ARM64_BASE")  # as the amd64 base's: refused under CI
    if reuse:
        return Path(reuse)
    key = hashlib.sha256(b"bookworm\0" + b"".join((ROOT / f).read_bytes() for f in ARM64_BASE_INPUTS)).hexdigest()
    folder = cache_root() / "arm64-base" / key[:16]
    image = folder / "debian-arm64.qcow2"
    folder.mkdir(parents=True, exist_ok=True)
    # one maker at a time: setup.sh --test starts it in the background and the tests that need it wait here for it
    with held(folder.parent / f"{key[:16]}.lock"):
        if not image.is_file():
            _make_arm64_base(folder, image)
    return image


def _make_arm64_base(folder: Path, image: Path) -> None:
    from tests.support.common import BIN, ROOT

    with tempfile.TemporaryDirectory(prefix=".arm64-base-", dir=folder.parent) as tmp:
        dest = Path(tmp) / image.name
        proc = subprocess.run([str(BIN / "image-builder"), "image.base", "--arch", "arm64", "--dest", str(dest)],
                              cwd=ROOT, capture_output=True, text=True, timeout=7200, check=False)  # fmt: skip
        (folder / "build.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"image.base --arch arm64 failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        os.replace(dest.with_name(dest.name + ".sha256"), folder / (image.name + ".sha256"))
        os.replace(dest, image)


def build_all() -> None:
    """Build (or find in the cache) every source build the suite uses; the laid-out release is thrown away."""
    from imagebuilder.release.source import build_release, build_runtime

    with tempfile.TemporaryDirectory(prefix="warm-release-") as tmp:
        built = build_release(SOURCE_RELEASE, Path(tmp) / "release", say=print)
        print(f"release {built.manifest_path.stem}: cached")
        # and the arm64 one beside it (issue 46: cross-compiled; about 15 minutes more the first time)
        built = build_release(SOURCE_RELEASE, Path(tmp) / "release-both", say=print, arches=("amd64", "arm64"))
        print(f"release {built.manifest_path.stem} ({', '.join(built.arches)}): cached")
    runtime = build_runtime(*RUNTIME_1_7, say=print)
    print(f"runtime containerd {RUNTIME_1_7[0]} (runc {runtime.runc}), crictl {RUNTIME_1_7[1]}: cached")
    from imagebuilder.hardening.content import built_content

    content = built_content(HARDENING_PRODUCT, say=print)  # issue 62: the hardening tests' (about two minutes)
    print(f"hardening content {content.origin}, {content.datastream.name}: cached")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--arm64-base"]:  # beside the others: it mostly waits (the archive, emulated scripts)
        print(f"arm64 base image: {arm64_base()}")
    else:
        build_all()
