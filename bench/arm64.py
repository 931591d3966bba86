"""Benchmark of issue 46: an arm64 image built on this amd64 host by each engine, from the same inputs.

Inputs: the arm64 base (``image.base --arch arm64``, kept in ~/.cache/image-builder/arm64-base by its inputs, as the
test suite keeps it), and a stand-in release of 1-24 with its arm64 artifacts in a directory mirror, with the OS's
runtime (``--runtime os``: Debian's arm64 containerd).

- ``build --arch arm64 --engine packer``: Packer boots the base in qemu-system-aarch64's ``virt`` machine under TCG
  with AAVMF, Ansible provisions it over SSH, it seals itself and powers off (the build VM as the product's profile
  sizes it);
- ``build --arch arm64 --engine chroot``: the same playbook in a chroot, the image's programs run by qemu-user.

Each image is checked as ``image.verify`` checks it on disk (every node program an aarch64 ELF, arm64's UEFI
loader): CI runs the Packer engine's arm64 build only up to its Ansible (tests/integration/test_arm64.py), so this
is where its whole build is proven.

Wall time of each and the ratio (the peer is the chroot engine, this project's default for arm64). Run with
``bench/run.py --only arm64``; every timed run starts after a ``sync`` and the outputs are removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.builder.resolve import make_plan  # noqa: E402
from imagebuilder.builder.runner import run_build  # noqa: E402
from imagebuilder.builder.verify import verify_image  # noqa: E402
from imagebuilder.core.files import sha256_file  # noqa: E402
from imagebuilder.plan.model import BuildRequest  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.standin import make_standin_release  # noqa: E402
from tests.support.sources import arm64_base  # noqa: E402


def _say(text: str) -> None:
    print(text, flush=True)


def bench_arm64(work: Path) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    _say("arm64: the arm64 base (cached by its inputs; half an hour when it is made)")
    base = arm64_base()
    mirror = work / "arm64-upstream"
    shutil.rmtree(mirror, ignore_errors=True)
    make_standin_release(mirror, load_catalog().channel("1-24"), arches=("amd64", "arm64"))
    config = work / "arm64-baremetal.json"
    checksum = f"sha256:{sha256_file(base)}"
    config.write_text(json.dumps({"source_image_url": str(base), "source_image_checksum": checksum}))
    out = work / "arm64-out"
    timed: dict[str, float] = {}
    steps: dict[str, dict[str, float]] = {}
    for engine in ("packer", "chroot"):
        shutil.rmtree(out, ignore_errors=True)
        plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                                      configs={"baremetal": str(config)}, mirror=str(mirror), output_dir=str(out),
                                      disk_gb=4, engine=engine, runtime="os", arch="arm64"))  # fmt: skip
        _say(f"arm64: {engine} build")
        os.sync()
        t0 = time.monotonic()
        result = run_build(plan, say=lambda _text: None)
        timed[engine] = time.monotonic() - t0
        steps[engine] = result.steps
        # each engine's image is what CI proves of the chroot engine's (CI runs the Packer build to its Ansible only)
        assert result.artifact is not None
        findings = verify_image(result.artifact, boot=False)
        failed = [f"{f.name}: {f.detail}" for f in findings if not f.ok]
        if failed:
            raise SystemExit(f"arm64: the {engine} build's image fails its checks: " + "; ".join(failed))
        architecture = next(f.detail for f in findings if f.name == "architecture")
        if "aarch64 ELF" not in architecture:
            raise SystemExit(f"arm64: the {engine} build's image: {architecture}")
    shutil.rmtree(out, ignore_errors=True)
    return {
        "packer_s": round(timed["packer"], 1),
        "packer_steps": steps["packer"],
        "chroot_s": round(timed["chroot"], 1),
        "chroot_steps": steps["chroot"],
        "chroot_speedup": round(timed["packer"] / timed["chroot"], 2),
    }
