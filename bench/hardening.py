"""Benchmark of issue 62: what ``--hardening cis_level1_server`` adds to a build, and what it changes in the scan.

Inputs: the demo's stand-in release of 1-24 mirrored, the base image (``image.base``, reused from the bench's work
folder), ComplianceAsCode's debian12 data stream built from its source release (the cache's, as the suite's). Two
chroot builds of the same inputs, one after the other: plain, then hardened (its remediation's packages from
Debian's archive). The plain image is then scanned as ``image.verify --hardening`` scans any image; the hardened
build scans its own. Reported: both pass rates over the applicable rules, and the time the remediation and the
scan add (the build manifests' step times).

Run with ``bench/run.py --only hardening``; the outputs are removed after.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.builder.resolve import make_plan  # noqa: E402
from imagebuilder.builder.runner import run_build  # noqa: E402
from imagebuilder.core.fetch import Mirror  # noqa: E402
from imagebuilder.flows.demo import ensure_base_image  # noqa: E402
from imagebuilder.hardening.model import HardeningRequest  # noqa: E402
from imagebuilder.hardening.run import scan_any_image  # noqa: E402
from imagebuilder.plan.model import BuildRequest  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.mirror import create_mirror  # noqa: E402
from imagebuilder.release.standin import make_standin_release  # noqa: E402

PROFILE = "cis_level1_server"


def _say(text: str) -> None:
    print(text, flush=True)


def bench_hardening(work: Path) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    base, digest = ensure_base_image(work / "base" / "debian-base.qcow2", _say)
    upstream, mirror, out = work / "hardening-upstream", work / "hardening-mirror", work / "hardening-out"
    for folder in (upstream, mirror, out):
        shutil.rmtree(folder, ignore_errors=True)
    channel = load_catalog().channel("1-24")
    release = make_standin_release(upstream, channel)
    create_mirror(release.manifest_url, mirror, runtime=None, source=Mirror(str(upstream)))
    config = work / "hardening-bm.json"
    config.write_text(json.dumps({"source_image_url": str(base), "source_image_checksum": f"sha256:{digest}"}))
    results: dict[str, dict[str, object]] = {}
    for kind in ("plain", "hardened"):
        request = BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", offline=True,
                               configs={"baremetal": str(config)}, mirror=str(mirror), output_dir=str(out / kind),
                               engine="chroot", runtime="os", disk_gb=4,
                               hardening=HardeningRequest(PROFILE) if kind == "hardened" else None)  # fmt: skip
        _say(f"hardening: the {kind} build")
        t0 = time.monotonic()
        built = run_build(make_plan(request), say=_say)
        results[kind] = {"build_s": round(time.monotonic() - t0, 1), "steps": built.steps, "extra": built.extra}
    assert results["plain"]["extra"] is not None
    plain_image = next((out / "plain").glob("*.gz"))
    _say("hardening: the plain image scanned as image.verify --hardening scans it")
    t0 = time.monotonic()
    plain_scan, content = scan_any_image(plain_image, HardeningRequest(PROFILE), out / "plain" / "plain", say=_say)
    plain_scan_s = round(time.monotonic() - t0, 1)
    hardened = results["hardened"]
    record = hardened["extra"]["hardening"]  # type: ignore[index]
    steps_plain, steps_hard = results["plain"]["steps"], hardened["steps"]
    assert isinstance(steps_plain, dict) and isinstance(steps_hard, dict)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "profile": PROFILE,
        "content": content.origin,
        "plain_pass_rate": plain_scan.pass_rate,
        "plain_counts": plain_scan.counts,
        "plain_scan_s": plain_scan_s,
        "hardened_pass_rate": record["scan"]["pass_rate"],
        "hardened_counts": record["scan"]["counts"],
        "rules_tailored_out": len(record["tailoring"]["turned_off"]),
        "remediation_tasks": record["remediation"]["tasks"],
        "tasks_left_out": len(record["remediation"]["left_out"]),
        "plain_build_s": results["plain"]["build_s"],
        "hardened_build_s": hardened["build_s"],
        "chroot_step_plain_s": round(steps_plain.get("chroot", 0.0), 1),
        "chroot_step_hardened_s": round(steps_hard.get("chroot", 0.0), 1),
        "scan_step_s": round(steps_hard.get("scan", 0.0), 1),
        "added_s": round(float(str(hardened["build_s"])) - float(str(results["plain"]["build_s"])), 1),
        "hardened_vs_plain": round(float(str(hardened["build_s"])) / float(str(results["plain"]["build_s"])), 2),
    }
