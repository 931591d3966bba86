#!/usr/bin/env python3
"""Benchmarks, one command: ``.venv/bin/python bench/run.py``. Results go to bench/results.json and docs/benchmarks.md.

e2e: the offline bare-metal flow of ``invoke demo`` (base image reused when present), timed end to end, with
the share of the build spent outside Packer (rendering, compression, checksum, manifest) from the build
manifest's step durations.

vsphere: 8 templates prepared on vcsim, ours against the spec 4.6 govc commands (see bench/vsphere.py).

os1: lz4 -> gzip, the whole TUF download, and the image server, against their peers (see bench/os1.py).

engines: the chroot engine against Packer, and build.matrix against single builds (see bench/engines.py).

startup: CPU time of ``--list``, every task's ``--help`` and the first error of every bad flag (see bench/startup.py).

dhcp: ``dhcp.render`` of 100,000 fixed leases spread over one range, each server, and the pool split against the
per-address split it replaced (see bench/dhcp.py).

reproducible: N chroot builds of the same inputs in different conditions, the number of distinct digests, and the
time a rebuild takes against the first build (see bench/reproducible.py).

arm64: an arm64 bare-metal image by the Packer engine (qemu-system-aarch64 under TCG) against the chroot engine
(qemu-user), from the same inputs (see bench/arm64.py).

nodes: the node check (``image.verify --node-check``) of one release built from source on each architecture, arm64's
against amd64's (see bench/nodes.py).

hardening: a plain and a ``--hardening cis_level1_server`` build of the same inputs: the scan's pass rate of each,
and the time the remediation and the scan add (see bench/hardening.py).

``--only e2e|vsphere|os1|engines|startup|dhcp|reproducible|arm64|nodes|hardening`` runs one and keeps the others'
last results.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.arm64 import bench_arm64  # noqa: E402
from bench.dhcp import bench_dhcp  # noqa: E402
from bench.engines import bench_engines  # noqa: E402
from bench.hardening import bench_hardening  # noqa: E402
from bench.nodes import bench_nodes  # noqa: E402
from bench.os1 import bench_os1  # noqa: E402
from bench.reproducible import bench_reproducible  # noqa: E402
from bench.startup import TARGET_S, bench_startup  # noqa: E402
from bench.vsphere import bench_vsphere  # noqa: E402
from imagebuilder.core.hostinfo import kvm_status  # noqa: E402
from imagebuilder.flows.demo import run_demo  # noqa: E402

START = "<!-- bench:start (written by bench/run.py; do not edit) -->"
END = "<!-- bench:end -->"


def bench_e2e(work: Path) -> dict[str, object]:
    reused = (work / "base" / "debian-base.qcow2").is_file()
    t0 = time.monotonic()
    result = run_demo(work, boot=False, say=lambda m: print(m, flush=True))
    total = time.monotonic() - t0
    steps = result.build.steps
    build_total = sum(steps.values())
    engine = "chroot" if "chroot" in steps else "packer"  # the demo uses the fastest engine this host supports
    outside = build_total - steps.get(engine, 0.0)
    return {
        "flow_wall_s": round(total, 1),
        "build_wall_s": round(build_total, 1),
        "engine": engine,
        "engine_s": round(steps.get(engine, 0.0), 1),
        "outside_packer_s": round(outside, 1),
        "outside_packer_share": round(outside / build_total, 4) if build_total else None,
        "steps": steps,
        "accelerator": kvm_status().accelerator,
        "base_image_reused": reused,
        "image_bytes": result.build.size,
    }


def _vsphere_rows(v: dict[str, object]) -> list[str]:
    return [
        f"| vSphere: prepare {v['templates']} templates on vcsim (1.21-1.24 x OS-1, OS-2), govc's "
        f"{v['govc_commands']} spec 4.6 commands | {v['govc_s']} s |",
        f"| the same with `template.import --from-file` (one command) | {v['ours_batch_s']} s: "
        f"**{v['speedup_batch']}x faster** |",
        f"| the same with one `template.import` per template | {v['ours_per_template_s']} s: "
        f"{v['speedup_per_template']}x |",
        f"| vCenter API calls per template: govc / ours (one command) / ours (per template) | "
        f"{v['govc_api_calls_per_template']} / {v['ours_batch_api_calls_per_template']} / "
        f"{v['ours_per_template_api_calls_per_template']} |",
    ]


def _os1_rows(o: dict[str, object]) -> list[str]:
    c, d, s = o["convert"], o["download"], o["serve"]
    assert isinstance(c, dict) and isinstance(d, dict) and isinstance(s, dict)
    gib = float(str(o["image_bytes"])) / 1024**3
    return [
        f"| OS-1: lz4 -> gzip of a {gib:.0f} GiB disk-like image, `lz4 -dc \\| gzip` (spec 4.5) "
        f"| {c['lz4_gzip_s']} s |",
        f"| the same, `lz4 -dc \\| pigz -p2` | {c['lz4_pigz_s']} s |",
        f"| the same, ours (one stream, ISA-L gzip level 1) | {c['ours_s']} s: **{c['vs_gzip']}x** gzip, "
        f"**{c['vs_pigz']}x** pigz; peak RSS {c['ours_peak_rss_mb']} MB |",
        f"| OS-1 metal download from a loopback TUF repository: `tuftool download` + `lz4 -d` + `gzip` | "
        f"{d['tuftool_lz4_gzip_s']} s |",
        f"| the same, `download.bottlerocket` (verified, lz4 -> gzip in the stream) | {d['ours_s']} s: "
        f"**{d['vs_tuftool']}x faster** |",
        f"| the same, unverified: `curl \\| lz4 -dc \\| pigz -p2` | {d.get('curl_lz4_pigz_s', '-')} s: ours is "
        f"**{d.get('vs_curl_lz4_pigz', '-')}x faster** (target 1.8x) |",
        f"| a plain `curl` of the same {int(str(d['target_bytes'])) // 1024**2} MiB target | {d['curl_s']} s "
        f"(the metal download takes {d['vs_curl']}x: it also converts 1 GiB, see below) |",
        f"| the same bytes as the OVA target (verified, no conversion) | {d.get('ours_ova_s', '-')} s: "
        f"{d.get('ova_vs_curl', '-')}x curl |",
        f"| {s['clients']} concurrent clients fetching the .gz: nginx | {s['nginx_mib_s']} MiB/s |",
        f"| the same from `image-builder serve` | {s['ours_mib_s']} MiB/s: **{s['ratio']}x** nginx |",
    ]


def _engine_rows(e: dict[str, object]) -> list[str]:
    singles = e["single_chroot_s"]
    assert isinstance(singles, dict)
    return [
        f"| bare-metal build from the base image, `--engine packer` (QEMU {e['accelerator']}) | {e['packer_s']} s |",
        f"| the same inputs, `--engine chroot` (no VM) | {e['chroot_s']} s: **{e['chroot_speedup']}x faster** |",
        f"| 4 single chroot builds, channels 1-21..1-24, one after the other | {e['four_singles_s']} s "
        f"({', '.join(f'{v} s' for v in singles.values())}) |",
        f"| `build.matrix` of the same 4 (one OS layer, empty cache) | {e['matrix_s']} s: "
        f"**{e['matrix_vs_one_single']}x** one single chroot build, {e['matrix_vs_four_singles']}x the four, "
        f"{e['matrix_vs_one_packer_build']}x one Packer build |",
        *(
            [
                f"| later, one of the 4 again on the cached OS layer and its members (3 skipped) | "
                f"{e['one_more_on_cached_layer_s']} s: {e['one_more_vs_one_single']}x one single chroot build |"
            ]
            if "one_more_on_cached_layer_s" in e
            else []
        ),
    ]


def _arm64_rows(a: dict[str, object]) -> list[str]:
    return [
        f"| arm64 bare-metal build from the arm64 base, `--arch arm64 --engine packer` (qemu-system-aarch64, TCG, "
        f"AAVMF) | {a['packer_s']} s |",
        f"| the same inputs, `--arch arm64 --engine chroot` (qemu-user) | {a['chroot_s']} s: "
        f"**{a['chroot_speedup']}x faster** |",
    ]


def _nodes_rows(n: dict[str, object]) -> list[str]:
    return [
        f"| node check (`image.verify --node-check`) of Kubernetes {n['release']} built from source, the chroot "
        f"engine's amd64 image under OVMF (TCG) | {n['amd64_s']} s: passed |",
        f"| the same, the arm64 image under AAVMF (TCG; its control plane's arm64 programs under qemu-user) | "
        f"{n['arm64_s']} s: passed, **{n['arm64_vs_amd64']}x** amd64's |",
    ]


def _startup_rows(s: dict[str, object]) -> list[str]:
    over = s["over_target"]
    assert isinstance(over, dict)
    return [
        f"| start-up: `python -c pass` | {s['python_pass_cpu_s']} s of CPU |",
        f"| `image-builder --list` | {s['list_cpu_s']} s of CPU |",
        f"| `--list`, every task's `--help` and the first error of every bad flag ({s['commands']} commands, "
        f"median of {s['rounds']}): median / slowest | {s['median_cpu_s']} s / {s['max_cpu_s']} s "
        f"(`{s['max_command']}`, {s['max_vs_python']}x `python -c pass`); over {TARGET_S} s: {len(over)} |",
    ]


def _dhcp_rows(d: dict[str, object]) -> list[str]:
    return [
        f"| `dhcp.render` of {d['machines']:,} fixed leases spread over one range (hardware.csv, the whole command): "
        f"ISC / Kea | {d['render_isc_s']} s / {d['render_kea_s']} s (target {d['target_s']} s: "
        f"{'met' if d['met'] else 'NOT met'}) |",
        f"| the pool split of {d['peer_rows']:,} of them: per address (before) / one sweep | {d['old_split_s']} s / "
        f"{d['split_s']} s: **{d['split_speedup']}x faster** |",
    ]


def _reproducible_rows(r: dict[str, object]) -> list[str]:
    builds = r["build_s"]
    assert isinstance(builds, list)
    return [
        f"| reproducibility: {r['builds']} chroot builds of the same inputs, each in its own folders with its own "
        f"copies of the mirror and source image, under another host name, umask and time zone "
        f"({'; '.join(map(str, r['conditions']))}) | **{r['distinct_digests']} distinct digest"
        f"{'' if r['distinct_digests'] == 1 else 's'}** (goal 1); {', '.join(f'{b} s' for b in builds)} |",
        f"| `image.rebuild` from the first build's provenance | {r['rebuild_s']} s: {r['rebuild_vs_first_build']}x "
        f"the first build; {'reproduced' if r['rebuild_reproduced'] else 'NOT reproduced'} |",
    ]


def _hardening_rows(h: dict[str, object]) -> list[str]:
    return [
        f"| OpenSCAP's {h['profile']} scan of a plain bare-metal image (the demo's, image.verify --hardening) | "
        f"{h['plain_pass_rate']}% of the applicable rules pass |",
        f"| the same inputs built with `--hardening {h['profile']}` ({h['remediation_tasks']} remediation tasks, "
        f"{h['rules_tailored_out']} rules tailored out for a node, {h['tasks_left_out']} tasks left out as they act on "
        f"the running system) | **{h['hardened_pass_rate']}%** pass |",
        f"| the build: plain / hardened (the chroot step {h['chroot_step_plain_s']} s / "
        f"{h['chroot_step_hardened_s']} s, the scan {h['scan_step_s']} s) | {h['plain_build_s']} s / "
        f"{h['hardened_build_s']} s: +{h['added_s']} s, {h['hardened_vs_plain']}x |",
    ]


def write_readme(results: dict[str, object]) -> None:
    e2e = results["e2e"]
    assert isinstance(e2e, dict)
    vsphere = results.get("vsphere")
    os1 = results.get("os1")
    engines = results.get("engines")
    startup = results.get("startup")
    dhcp = results.get("dhcp")
    reproducible = results.get("reproducible")
    arm64 = results.get("arm64")
    nodes = results.get("nodes")
    hardening = results.get("hardening")
    table = "\n".join(
        [
            START,
            "",
            f"Measured {results['date']} on {results['machine']} (QEMU accelerator: {e2e['accelerator']}).",
            "",
            "| benchmark | result |",
            "|---|---|",
            "| offline flow end to end (base image "
            + ("reused" if e2e.get("base_image_reused") else "built with debootstrap")
            + f", mirror, bare-metal build, offline verify) | {e2e['flow_wall_s']} s |",
            f"| the build alone | {e2e['build_wall_s']} s |",
            *(
                [
                    f"| of which the {e2e['engine']} engine ("
                    + ("VM boot, Ansible, shutdown" if e2e["engine"] == "packer" else "mount, Ansible, seal")
                    + f") | {e2e['engine_s']} s |",
                    f"| outside it (source check, gzip compression, checksum, manifest) | {e2e['outside_packer_s']} s "
                    f"({100 * float(e2e['outside_packer_share'] or 0):.1f} %) |",
                ]
                if "engine" in e2e
                else []
            ),
            *(_vsphere_rows(vsphere) if isinstance(vsphere, dict) else []),
            *(_os1_rows(os1) if isinstance(os1, dict) else []),
            *(_engine_rows(engines) if isinstance(engines, dict) else []),
            *(_startup_rows(startup) if isinstance(startup, dict) else []),
            *(_dhcp_rows(dhcp) if isinstance(dhcp, dict) else []),
            *(_reproducible_rows(reproducible) if isinstance(reproducible, dict) else []),
            *(_arm64_rows(arm64) if isinstance(arm64, dict) else []),
            *(_nodes_rows(nodes) if isinstance(nodes, dict) else []),
            *(_hardening_rows(hardening) if isinstance(hardening, dict) else []),
            "",
            END,
        ]
    )
    page = ROOT / "docs" / "benchmarks.md"
    text = page.read_text()
    text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S)
    page.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", default=str(ROOT / "bench" / "work"), help="working directory (kept for reuse)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite docs/benchmarks.md's table")
    only = ("e2e", "vsphere", "os1", "engines", "startup", "dhcp", "reproducible", "arm64", "nodes", "hardening")
    parser.add_argument("--only", choices=only, help="run one benchmark, keep the others' results")
    args = parser.parse_args()
    saved = ROOT / "bench" / "results.json"
    if args.readme_only:
        write_readme(json.loads(saved.read_text()))
        return
    results: dict[str, object] = json.loads(saved.read_text()) if saved.exists() and args.only else {}
    results.update(
        {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores"}
    )
    if args.only in (None, "e2e"):
        results["e2e"] = bench_e2e(Path(args.work))
    if args.only in (None, "vsphere"):
        results["vsphere"] = bench_vsphere(Path(args.work))
    if args.only in (None, "os1"):
        results["os1"] = bench_os1(Path(args.work))
    if args.only in (None, "engines"):
        results["engines"] = bench_engines(Path(args.work))
    if args.only in (None, "startup"):
        results["startup"] = bench_startup()
    if args.only in (None, "dhcp"):
        results["dhcp"] = bench_dhcp(Path(args.work))
    if args.only in (None, "reproducible"):
        results["reproducible"] = bench_reproducible(Path(args.work))
    if args.only in (None, "arm64"):
        results["arm64"] = bench_arm64(Path(args.work))
    if args.only in (None, "nodes"):
        results["nodes"] = bench_nodes(Path(args.work))
    if args.only in (None, "hardening"):
        results["hardening"] = bench_hardening(Path(args.work))
    saved.write_text(json.dumps(results, indent=2) + "\n")
    write_readme(results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
