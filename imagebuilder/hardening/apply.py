"""The hardening step of a chroot build, run by its child (:mod:`imagebuilder.builder.chroot_mounts`) between the
node playbook and the seal, in a mount namespace of its own (``unshare --mount``): the image's ``/proc/sys`` and
``/sys`` are made read-only there, then the remediation playbook runs against the image.

Why read-only: the remediation is made safe for an image (:func:`.remediate.for_an_image`), and this is the
second guard: a task that still tries to set a kernel parameter fails instead of changing the build host's.

Usage: ``python -m imagebuilder.hardening.apply ROOT -- ANSIBLE-PLAYBOOK-COMMAND...``"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _read_only(path: Path) -> None:
    if path.is_dir():
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m imagebuilder.hardening.apply ROOT -- COMMAND...", file=sys.stderr)
        return 2
    root = Path(argv[0])
    for part in ("proc/sys", "sys"):
        _read_only(root / part)
    print("::image-builder:: applying the hardening profile's remediation (its tasks in the build log)", flush=True)
    return subprocess.run(argv[2:], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
