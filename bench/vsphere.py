"""Benchmark: prepare 8 templates (Kubernetes 1.21-1.24 x OS-1 and OS-2) on vcsim, ours against govc.

Both sides do the same steps of spec 3 / 4.6 on a fresh vcsim each: content library, import, deploy into the
template folder, OS-1 disk resize, snapshot ``root``, mark as template, two tag categories, two tags per template.
govc runs the spec 4.6 command sequence (one process per step, as a user types it); ours runs
``template.import --from-file`` (one process, one session) and, as a second figure, one ``template.import`` per
template. Each side is run ``rounds`` times and the median is kept; the result is checked with govc afterwards
(8 templates, each with its two tags), so a fast wrong answer cannot win.

API calls: govc's are counted from its debug trace (a separate, untimed pass: tracing writes files); ours from
the tool's own counter, which starts after login (SmartConnect's version discovery and login are not counted).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.image.ova import make_ova  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.profile import load_profile  # noqa: E402
from imagebuilder.vsphere.tags import expected_tags  # noqa: E402
from imagebuilder.vsphere.templates import default_name  # noqa: E402
from tests.support.vcsim import GOVC, Vcsim, start_vcsim  # noqa: E402

DC = "DC0"
FOLDER = f"/{DC}/vm/Templates"
POOL = f"/{DC}/host/DC0_C0/Resources"
DATASTORE = f"/{DC}/datastore/LocalDS_0"
KUBERNETES = ("1.21", "1.22", "1.23", "1.24")
OSES = ("bottlerocket", "ubuntu")
IMAGE_BUILDER = Path(sys.executable).parent / "image-builder"


def _ovas(work: Path) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    disks = []
    for name, size in (("d1", "64M"), ("d2", "32M")):
        disk = work / f"{name}.qcow2"
        if not disk.exists():
            subprocess.run(["qemu-img", "create", "-f", "qcow2", str(disk), size], check=True, capture_output=True)
        disks.append(disk)
    return {
        "bottlerocket": make_ova(disks[0], work / "os1.ova", name="os1", extra_disks=[disks[1]]),
        "ubuntu": make_ova(disks[0], work / "os2.ova", name="os2"),
    }


def _govc_steps(ovas: dict[str, Path]) -> list[list[str]]:
    """The spec 4.6 command sequence for the 8 templates."""
    catalog = load_catalog()
    tags = load_profile().tags
    library = load_profile().vsphere_templates.library
    steps = [
        ["library.create", f"-ds={DATASTORE}", library],
        ["folder.create", FOLDER],
        ["tags.category.create", "-t", "VirtualMachine", tags.os_category],
        ["tags.category.create", "-t", "VirtualMachine", tags.release_category],
    ]
    made: set[str] = set()
    for os_name in OSES:
        os_ = catalog.os(os_name)
        for kube in KUBERNETES:
            channel = catalog.channel_for_kubernetes(kube)
            name = default_name(os_, channel)
            path = f"{FOLDER}/{name}"
            steps += [
                ["library.import", "-n", name, library, str(ovas[os_name])],
                ["library.deploy", "-pool", POOL, "-folder", FOLDER, f"/{library}/{name}", name],
            ]
            disk = os_.template_disk(channel.minor)
            if disk:
                steps.append(["vm.disk.change", "-vm", path, "-disk.label", disk.label, "-size", f"{disk.size_gb}G"])
            steps += [["snapshot.create", "-vm", path, "root"], ["vm.markastemplate", path]]
            for tag in expected_tags(os_, channel):
                if tag.name not in made:
                    steps.append(["tags.create", "-c", tag.category, tag.name])
                    made.add(tag.name)
                steps.append(["tags.attach", "-c", tag.category, tag.name, path])
    return steps


def _run_govc(sim: Vcsim, steps: list[list[str]], debug: Path | None = None) -> float:
    env = {**os.environ, **sim.env}
    if debug:
        env["GOVC_DEBUG_PATH"] = str(debug)
    t0 = time.monotonic()
    for step in steps:
        args = [str(GOVC), step[0], *(["-debug"] if debug else []), *step[1:]]
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"govc {' '.join(step)}: {proc.stderr}")
    return time.monotonic() - t0


def _listing(work: Path, ovas: dict[str, Path]) -> Path:
    path = work / "templates.yaml"
    path.write_text("".join(f"- {{ova: {ovas[o]}, os: {o}, kubernetes: '{k}'}}\n" for o in OSES for k in KUBERNETES))
    return path


def _run_ours(sim: Vcsim, args_list: list[list[str]]) -> tuple[float, int]:
    env = {**os.environ, **sim.env}
    calls = 0
    t0 = time.monotonic()
    for args in args_list:
        proc = subprocess.run([str(IMAGE_BUILDER), *args], env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"image-builder {' '.join(args)}: {proc.stderr}")
        m = re.search(r"vCenter API calls: (\d+)", proc.stdout)
        calls += int(m.group(1)) if m else 0
    return time.monotonic() - t0, calls


def _check(sim: Vcsim) -> None:
    """8 templates, each carrying exactly its two tags (read with govc)."""
    catalog = load_catalog()
    for os_name in OSES:
        for kube in KUBERNETES:
            os_, channel = catalog.os(os_name), catalog.channel_for_kubernetes(kube)
            path = f"{FOLDER}/{default_name(os_, channel)}"
            out = sim.govc("tags.attached.ls", "-r", path).split()
            want = sorted(t.name for t in expected_tags(os_, channel))
            assert sorted(out) == want, f"{path}: tags {out}, expected {want}"
            info = sim.govc("vm.info", "-json", path).replace(" ", "")
            assert '"template":true' in info, f"{path} is not a template"


def bench_vsphere(work: Path, rounds: int = 5) -> dict[str, object]:
    ovas = _ovas(work / "vsphere")
    steps = _govc_steps(ovas)
    listing = _listing(work / "vsphere", ovas)
    batch = [["template.import", "--from-file", str(listing)]]
    single = [
        ["template.import", "--ova", str(ovas[o]), "--os", o, "--kubernetes", k] for o in OSES for k in KUBERNETES
    ]
    times: dict[str, list[float]] = {"govc": [], "ours_batch": [], "ours_per_template": []}
    ours_calls = ours_single_calls = 0
    for _ in range(rounds):
        for side in times:
            sim = start_vcsim()
            try:
                if side == "govc":
                    times[side].append(_run_govc(sim, steps))
                elif side == "ours_batch":
                    elapsed, ours_calls = _run_ours(sim, batch)
                    times[side].append(elapsed)
                else:
                    elapsed, ours_single_calls = _run_ours(sim, single)
                    times[side].append(elapsed)
                _check(sim)
            finally:
                sim.stop()
    sim = start_vcsim()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _run_govc(sim, steps, Path(tmp))
            govc_calls = sum(1 for _ in Path(tmp).rglob("*.req.headers"))
    finally:
        sim.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "templates": len(OSES) * len(KUBERNETES),
        "rounds": rounds,
        "govc_commands": len(steps),
        "govc_s": round(med["govc"], 3),
        "ours_batch_s": round(med["ours_batch"], 3),
        "ours_per_template_s": round(med["ours_per_template"], 3),
        "speedup_batch": round(med["govc"] / med["ours_batch"], 2),
        "speedup_per_template": round(med["govc"] / med["ours_per_template"], 2),
        "govc_api_calls_per_template": round(govc_calls / 8, 1),
        "ours_batch_api_calls_per_template": round(ours_calls / 8, 1),
        "ours_per_template_api_calls_per_template": round(ours_single_calls / 8, 1),
        "all_runs_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_vsphere(Path(tempfile.mkdtemp(prefix="bench-vsphere-"))), indent=2))
