"""Benchmarks of issue 18: the chroot engine against Packer, and build.matrix against single builds, in one run.

Inputs are the offline demo's (the debootstrapped base image, reused when present; a stand-in release per channel
in a directory mirror): the same inputs for every build.

- engines: ``build --engine packer`` and ``build --engine chroot`` of ubuntu on bare metal, channel 1-24, one
  after the other; wall time of each and the ratio (target: chroot at least 4x faster without KVM).
- matrix: four single chroot builds (channels 1-21 to 1-24, one after the other; the 1-24 one is the engines
  benchmark's) against ``build.matrix`` of the same four with an empty OS layer cache; the ratio of the matrix to
  one single build (target: at most 1.6x) and to the four; then one image of it again on the cached layer and its
  members (the others skipped), against one single build.

Run with ``bench/run.py --only engines``. Each build is the library call the command makes; outputs are removed
between runs so that nothing is skipped, and every timed run starts after a ``sync``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.builder.matrix import run_matrix  # noqa: E402
from imagebuilder.builder.resolve import make_plan  # noqa: E402
from imagebuilder.builder.runner import run_build  # noqa: E402
from imagebuilder.core.fetch import Mirror  # noqa: E402
from imagebuilder.core.hostinfo import kvm_status  # noqa: E402
from imagebuilder.flows.demo import ensure_base_image  # noqa: E402
from imagebuilder.plan.model import BuildPlan, BuildRequest  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.mirror import create_mirror  # noqa: E402
from imagebuilder.release.standin import make_standin_release  # noqa: E402

CHANNELS = ("1-21", "1-22", "1-23", "1-24")


def _say(text: str) -> None:
    print(text, flush=True)


def _inputs(work: Path) -> tuple[Path, Path]:
    base, digest = ensure_base_image(work / "base" / "debian-base.qcow2", _say)
    upstream, mirror = work / "engines-upstream", work / "engines-mirror"
    for channel in CHANNELS:
        release = make_standin_release(upstream, load_catalog().channel(channel))
        create_mirror(release.manifest_url, mirror, runtime=None, source=Mirror(str(upstream)))
    config = work / "engines-baremetal.json"
    config.write_text(json.dumps({"source_image_url": str(base), "source_image_checksum": f"sha256:{digest}"}))
    return config, mirror


def _plan(config: Path, mirror: Path, out: Path, channel: str, engine: str) -> BuildPlan:
    return make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel=channel, offline=True,
                                  configs={"baremetal": str(config)}, mirror=str(mirror), output_dir=str(out),
                                  disk_gb=4, engine=engine, runtime="os"))  # fmt: skip


def _settled() -> None:
    """Every run starts with nothing of the previous ones left to write back (as hyperfine's ``--prepare sync``):
    the outputs of earlier builds would otherwise be flushed, and throttle writes, during the next one."""
    os.sync()


def _timed_build(plan: BuildPlan) -> tuple[float, dict[str, float]]:
    _settled()
    t0 = time.monotonic()
    result = run_build(plan, say=lambda _text: None)
    return time.monotonic() - t0, result.steps


def bench_engines(work: Path) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    config, mirror = _inputs(work)
    out = work / "engines-out"
    shutil.rmtree(out, ignore_errors=True)
    _say("engines: packer build (1-24)")
    packer_s, packer_steps = _timed_build(_plan(config, mirror, out / "packer", "1-24", "packer"))
    singles: dict[str, float] = {}
    chroot_steps: dict[str, float] = {}
    for channel in CHANNELS[::-1]:
        _say(f"engines: chroot build ({channel})")
        singles[channel], steps = _timed_build(_plan(config, mirror, out / "single", channel, "chroot"))
        if channel == "1-24":
            chroot_steps = steps
    layers = work / "engines-layers"
    shutil.rmtree(layers, ignore_errors=True)
    plans = [_plan(config, mirror, out / "matrix", c, "chroot") for c in CHANNELS]
    _say("matrix: 4 channels, empty layer cache")
    _settled()
    t0 = time.monotonic()
    rows = run_matrix(plans, layer_cache=layers, force=True, say=lambda _text: None)
    matrix_s = time.monotonic() - t0
    assert all(r.status == "built" for r in rows), [(r.plan.output_name, r.status, r.detail) for r in rows]
    # later, one image of the matrix again (its output removed): the layer and its members come from the cache
    again = plans[-1]
    assert again.output_path is not None
    again.output_path.unlink()
    _say("matrix again: 1 image on the cached layer, the others skipped")
    _settled()
    t0 = time.monotonic()
    rows = run_matrix(plans, layer_cache=layers, say=lambda _text: None)
    one_more_s = time.monotonic() - t0
    assert [r.status for r in rows] == ["skipped"] * 3 + ["built"], [(r.status, r.detail) for r in rows]
    chroot_s = singles["1-24"]
    single_mean = statistics.mean(singles.values())
    shutil.rmtree(out, ignore_errors=True)
    return {
        "accelerator": kvm_status().accelerator,
        "packer_s": round(packer_s, 1),
        "packer_steps": packer_steps,
        "chroot_s": round(chroot_s, 1),
        "chroot_steps": chroot_steps,
        "chroot_speedup": round(packer_s / chroot_s, 2),
        "single_chroot_s": {k: round(v, 1) for k, v in singles.items()},
        "four_singles_s": round(sum(singles.values()), 1),
        "matrix_s": round(matrix_s, 1),
        "matrix_vs_one_single": round(matrix_s / single_mean, 2),
        "matrix_vs_one_packer_build": round(matrix_s / packer_s, 2),
        "matrix_vs_four_singles": round(matrix_s / sum(singles.values()), 2),
        "one_more_on_cached_layer_s": round(one_more_s, 1),
        "one_more_vs_one_single": round(one_more_s / single_mean, 2),
    }
