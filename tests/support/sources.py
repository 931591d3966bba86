"""What the test suite builds from upstream source, named once: the fixtures take the builds from
~/.cache/image-builder, and ``./scripts/setup.sh --test`` makes them beforehand, beside its other builds, so that the
first test run on a machine does not spend its end-to-end tests' minutes on them.

    .venv/bin/python -m tests.support.sources     (from the repository root; a second run takes seconds)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

#: the release the offline end-to-end test builds, mirrors and proves on a node (the demo's default too)
SOURCE_RELEASE = "v1.36.3"
#: the runtime of a containerd 1.7 line (1-30 .. 1-33): containerd and crictl, as the reference's bundle names them
RUNTIME_1_7 = ("v1.7.28", "v1.36.0")


def build_all() -> None:
    """Build (or find in the cache) every source build the suite uses; the laid-out release is thrown away."""
    from imagebuilder.release.source import build_release, build_runtime

    with tempfile.TemporaryDirectory(prefix="warm-release-") as tmp:
        built = build_release(SOURCE_RELEASE, Path(tmp) / "release", say=print)
        print(f"release {built.manifest_path.stem}: cached")
    runtime = build_runtime(*RUNTIME_1_7, say=print)
    print(f"runtime containerd {RUNTIME_1_7[0]} (runc {runtime.runc}), crictl {RUNTIME_1_7[1]}: cached")


if __name__ == "__main__":
    build_all()
