"""Benchmark of issue 45: reproducible images, as a figure.

N chroot builds of the same inputs (the offline demo's debootstrapped base image, reused when present; the stand-in
1-24 release in a directory mirror), each under other conditions: its own output folder and workspace, its own
copy of the mirror and of the source image, another host name (a UTS namespace), umask and time zone. The figure
is the number of distinct digests of the artifact (the goal is 1), then the time ``image.rebuild`` takes from the
first build's provenance against the time the first build took.

Run with ``bench/run.py --only reproducible``. Each build is the ``image-builder build`` command, as a user runs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.core.fetch import Mirror  # noqa: E402
from imagebuilder.flows.demo import ensure_base_image  # noqa: E402
from imagebuilder.release.catalog import load_catalog  # noqa: E402
from imagebuilder.release.mirror import create_mirror  # noqa: E402
from imagebuilder.release.standin import make_standin_release  # noqa: E402

IB = str(ROOT / ".venv" / "bin" / "image-builder")
#: (host name, umask, time zone) of each build
CONDITIONS = (("builder-a", "022", "UTC"), ("builder-b", "077", "Pacific/Kiritimati"),
              ("a-much-longer-host-name", "027", "America/St_Johns"))  # fmt: skip


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _timed(args: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:4])}... failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.monotonic() - t0


def bench_reproducible(work: Path) -> dict[str, object]:
    base, digest = ensure_base_image(work / "base" / "debian-base.qcow2", lambda m: print(m, flush=True))
    root = work / "reproducible"
    shutil.rmtree(root, ignore_errors=True)
    upstream = root / "upstream"
    release = make_standin_release(upstream, load_catalog().channel("1-24"))
    create_mirror(release.manifest_url, root / "mirror", runtime=None, source=Mirror(str(upstream)))
    digests, seconds = [], []
    for n, (host, umask, tz) in enumerate(CONDITIONS):
        side = root / f"side-{n}" / ("elsewhere/" * n)
        side.mkdir(parents=True)
        mirror = side / "mirror"
        shutil.copytree(root / "mirror", mirror)
        image = side / "base.qcow2"
        shutil.copyfile(base, image)
        config = side / "baremetal.json"
        config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
        build = [IB, "build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
                 "--baremetal-config", str(config), "--mirror", str(mirror), "--offline", "--engine", "chroot",
                 "--runtime", "os", "--disk-gb", "4", "--output-dir", str(side / "out")]  # fmt: skip
        env = {**os.environ, "TZ": tz, "IMAGE_BUILDER_WORKSPACE": str(side / "work")}
        env.pop("SOURCE_DATE_EPOCH", None)
        script = 'hostname "$1"; umask "$2"; shift 2; exec "$@"'
        subprocess.run(["sync"], check=False)
        seconds.append(_timed(["unshare", "--uts", "sh", "-c", script, "sh", host, umask, *build], env))
        digests.append(_sha256(next((side / "out").glob("*.gz"))))
        print(f"build {n + 1}: {seconds[-1]:.1f} s, sha256 {digests[-1]}", flush=True)
    first = root / "side-0" / "out"
    provenance = next(first.glob("*.intoto.json"))
    subprocess.run(["sync"], check=False)
    rebuild_s = _timed([IB, "image.rebuild", "--provenance", str(provenance), "--mirror", str(root / "mirror"),
                        "--output-dir", str(root / "rebuild")], {**os.environ})  # fmt: skip
    rebuilt = _sha256(next((root / "rebuild").glob("*.gz")))
    return {
        "builds": len(CONDITIONS),
        "conditions": [f"{h}, umask {u}, TZ {t}" for h, u, t in CONDITIONS],
        "distinct_digests": len(set(digests)),
        "build_s": [round(s, 1) for s in seconds],
        "rebuild_s": round(rebuild_s, 1),
        "rebuild_vs_first_build": round(rebuild_s / seconds[0], 2),
        "rebuild_reproduced": rebuilt == digests[0],
    }
