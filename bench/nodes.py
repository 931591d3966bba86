"""Benchmark of issue 46's node check on arm64: ``image.verify --node-check`` of the same release on each
architecture, one after the other, the machine otherwise idle.

Inputs: Kubernetes v1.36.3 with its containerd 2 runtime built from source for amd64 and arm64 by ``release.build``
(cached in ~/.cache/image-builder, as the suite's), mirrored, and built into a bare-metal image per architecture by the
chroot engine from each architecture's base (the amd64 one made by ``image.base`` in the bench's work folder, the
arm64 one kept in ~/.cache by its inputs, as the suite keeps it).

Each image gets the whole node check: the image's own control plane on this host (for arm64 its programs run by
qemu-user), the image booted under TCG (OVMF, AAVMF) joins it with kubeadm, turns Ready, runs kube-proxy, CoreDNS
and a pod. Why here and not in CI: issue 46 runs the arm64 node check in CI "only if the budget holds", and at the
machine's slow speed it does not (docs/testing.md); CI boots the arm64 image to its login prompt, the amd64 node
check is the offline test's, and this is where the arm64 one is proven and timed against amd64's.

Run with ``bench/run.py --only nodes``; the outputs are removed after.
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
from imagebuilder.core.fetch import Mirror  # noqa: E402
from imagebuilder.core.files import sha256_file  # noqa: E402
from imagebuilder.flows.demo import ensure_base_image  # noqa: E402
from imagebuilder.plan.model import BuildRequest  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.mirror import create_mirror  # noqa: E402
from imagebuilder.release.source import build_release  # noqa: E402
from tests.support.sources import SOURCE_RELEASE, arm64_base  # noqa: E402

ARCHES = ("amd64", "arm64")


def _say(text: str) -> None:
    print(text, flush=True)


def bench_nodes(work: Path) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    bases = {"amd64": ensure_base_image(work / "base" / "debian-base.qcow2", _say)[0], "arm64": arm64_base()}
    upstream, mirror, out = work / "nodes-upstream", work / "nodes-mirror", work / "nodes-out"
    for folder in (upstream, mirror, out):
        shutil.rmtree(folder, ignore_errors=True)
    _say(f"nodes: Kubernetes {SOURCE_RELEASE} from source for {', '.join(ARCHES)} (cached by its inputs)")
    release = build_release(SOURCE_RELEASE, upstream, arches=ARCHES)
    channel = load_catalog().channel("1-36")
    create_mirror(release.manifest_url, mirror, runtime=channel.runtime, source=Mirror(str(upstream)), arches=ARCHES)
    node_s: dict[str, float] = {}
    details: dict[str, str] = {}
    for name in ARCHES:
        config = work / f"nodes-{name}.json"
        config.write_text(json.dumps({"source_image_url": str(bases[name]),
                                      "source_image_checksum": f"sha256:{sha256_file(bases[name])}"}))  # fmt: skip
        plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-36", offline=True,
                                      release_manifest=release.manifest_url, configs={"baremetal": str(config)},
                                      mirror=str(mirror), output_dir=str(out), disk_gb=6, engine="chroot",
                                      arch=name))  # fmt: skip
        _say(f"nodes: {name} image (chroot engine)")
        result = run_build(plan, say=lambda _text: None)
        assert result.artifact is not None
        _say(f"nodes: {name} node check")
        os.sync()
        t0 = time.monotonic()
        findings = verify_image(result.artifact, kubernetes=True, node_timeout=2400)
        node_s[name] = time.monotonic() - t0
        failed = [f"{f.name}: {f.detail}" for f in findings if not f.ok]
        if failed:
            raise SystemExit(f"nodes: the {name} image's node check failed: " + "; ".join(failed))
        seen = {f.name: f.detail for f in findings}
        for needed in ("kubeadm join", "node Ready", "kube-proxy and CoreDNS Running", "test pod Running"):
            if needed not in seen:
                raise SystemExit(f"nodes: the {name} node check did not reach {needed!r}")
        details[name] = seen["boot and cloud-init"]
    for folder in (upstream, mirror, out):
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "release": SOURCE_RELEASE,
        "amd64_s": round(node_s["amd64"], 1),
        "arm64_s": round(node_s["arm64"], 1),
        "arm64_vs_amd64": round(node_s["arm64"] / node_s["amd64"], 2),
        "boots": details,
    }
