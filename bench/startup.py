"""Start-up: the CPU time (user + system, the child's own rusage) of ``image-builder --list``, of every task's
``--help``, and of the first error of every bad flag of every task (an unknown flag, and each flag of the task
given a value no flag accepts), against ``python -c pass`` in the same run. Target (issue 28): every one within
0.3 s of CPU.

Each command runs in an empty folder with an empty HOME, no vCenter, AWS or Nutanix variables and a proxy that
answers nothing, and with ``--dry-run`` where the task has one (a task without it changes nothing, by the
project's rules), so none of them can change or reach anything; ``test`` (it would run the suite) is timed for its
``--help`` and an unknown flag only. A command that does not exit with an error within 20 s is reported, not
timed.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET_S = 0.3
#: a value every flag refuses: a path under a file (no folder can be made there), with a control character (no
#: name, number, URL or version grammar accepts it)
BAD = "/dev/null/\x01bad"


def cpu_of(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """The CPU seconds a command used (its rusage) and its exit status; -1 if it ran past 20 s (then killed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, timeout=20, check=False)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = -1
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


#: tasks whose flag values are not fed bad values: ``test`` runs the test suite with whatever ``-k`` it is given
NOT_RUN = ("test",)


def tasks() -> dict[str, list[tuple[str, bool]]]:
    """Every task by its name, with its flags (name, takes a value)."""
    sys.path.insert(0, str(ROOT))
    from imagebuilder.cli import namespace

    out: dict[str, list[tuple[str, bool]]] = {}
    for name in sorted(namespace.task_names):
        task = namespace[name]
        flags = []
        for arg in task.get_arguments():
            flag = max(arg.names, key=len).replace("_", "-")
            flags.append((flag, arg.kind is not bool))
        out[name] = flags
    return out


def bench_startup(rounds: int = 3) -> dict[str, Any]:
    exe = str(BIN / "image-builder")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        sys.path.insert(0, str(ROOT))
        from imagebuilder.release.profile import load_profile

        profile = load_profile()
        product = f"{profile.product.env_prefix}_"
        # results name the product's own flags generically: the product's name lives in config/ only
        short = re.compile(rf"\b{re.escape(profile.product.short_name)}\b")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVC_", product, "AWS_", "NUTANIX_"))}
        env.update(HOME=str(work / "home"), IMAGE_BUILDER_WORKSPACE=str(work / "ws"))
        env.update({k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
        commands: list[tuple[str, list[str]]] = [("--list", [exe, "--list"])]
        for name, flags in tasks().items():
            commands.append((f"{name} --help", [exe, name, "--help"]))
            commands.append((f"{name} --no-such-flag", [exe, name, "--no-such-flag"]))
            if name in NOT_RUN:
                continue
            dry = ["--dry-run"] if ("dry-run", False) in flags else []
            for flag, takes_value in flags:
                if takes_value:
                    label = short.sub("<product>", f"{name} --{flag} <bad>")
                    commands.append((label, [exe, name, f"--{flag}", BAD, *dry]))
        baseline = statistics.median(cpu_of([sys.executable, "-c", "pass"], work, env)[0] for _ in range(5))
        timed: dict[str, float] = {}
        not_errors: dict[str, int] = {}
        t0 = time.monotonic()
        for label, args in commands:
            runs = [cpu_of(args, work, env) for _ in range(rounds)]
            codes = {c for _, c in runs}
            expected_ok = label.endswith("--help") or label == "--list"
            if expected_ok and codes != {0}:
                not_errors[label] = sorted(codes)[0]
                continue
            if not expected_ok and codes - {1, 2}:
                not_errors[label] = sorted(codes)[0]
                continue
            timed[label] = statistics.median(s for s, _ in runs)
        worst = sorted(timed.items(), key=lambda kv: -kv[1])
        over = {k: round(v, 3) for k, v in worst if v > TARGET_S}
        return {
            "commands": len(commands),
            "rounds": rounds,
            "python_pass_cpu_s": round(baseline, 4),
            "max_cpu_s": round(worst[0][1], 3),
            "max_command": worst[0][0],
            "median_cpu_s": round(statistics.median(timed.values()), 3),
            "list_cpu_s": round(timed["--list"], 3),
            "max_vs_python": round(worst[0][1] / baseline, 1) if baseline else None,
            "over_target": over,
            "not_an_error": not_errors,
            "slowest": [[k, round(v, 3)] for k, v in worst[:8]],
            "wall_s": round(time.monotonic() - t0, 1),
        }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_startup(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 1), indent=2))
