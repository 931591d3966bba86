"""``invoke test --mutation MODULE...`` (issue 63): the mutation score of the code that guards secrets and trust,
measured with mutmut over the unit tests.

mutmut plants one small bug at a time (a comparison turned, a constant changed, a call dropped) in a copy of the
checkout and runs the unit tests that reach the function it changed; a bug no test notices is a survivor. The score
of a module is its killed mutants over all of them but those listed as equivalent (a change that alters nothing a
caller can see) in ``tests/data/mutation-equivalent.yaml``, each with why. A module under :data:`TARGET` fails the
run, naming its survivors. Not part of the CI run: it takes minutes to hours per module (docs/testing.md keeps the
scores).

Run as ``python -m tests.support.mutation imagebuilder/core/grammar.py ...`` from the checkout (the task does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: the share of a module's mutants the unit tests must kill
TARGET = 0.90
#: the modules that guard secrets and trust (issue 63), each measured on its own
GUARDED = (
    "imagebuilder/core/grammar.py",
    "imagebuilder/core/untrusted.py",
    "imagebuilder/core/validation.py",
    "imagebuilder/publish/images.py",
    "imagebuilder/release/manifest.py",
    "imagebuilder/attest/provenance.py",
    "imagebuilder/attest/signers.py",
    "imagebuilder/publish/repository.py",
    "imagebuilder/host/dhcp/model.py",
)
#: the mutants whose change no caller can see, each with why (reviewed one by one)
EQUIVALENT = ROOT / "tests" / "data" / "mutation-equivalent.yaml"
#: where each module's survivors are shown (kept after the run; not in git)
REPORTS = ROOT / ".mutation"
#: mutmut's exit codes of a checked mutant, by what they mean (mutmut/stats.py)
KILLED, SURVIVED = {1, 3, 36, 37, 24, 152, 255, -24}, {0, 5, 33}


class NotMeasured(Exception):
    """mutmut gave no result for a module: why, with the end of its output."""


#: the environment variable that makes the unit tests use :func:`use_hypothesis_profile`'s profile
PROFILE_ENV = "IMAGE_BUILDER_MUTATION"


def use_hypothesis_profile() -> None:
    """Under mutmut (its tracing makes every example slower, and a mutant is judged by the same examples each time):
    Hypothesis without deadlines and derandomized. Elsewhere nothing changes."""
    from hypothesis import settings

    if os.environ.get(PROFILE_ENV):
        settings.register_profile("mutation", deadline=None, derandomize=True, print_blob=False)
        settings.load_profile("mutation")


def equivalent() -> dict[str, str]:
    if not EQUIVALENT.is_file():
        return {}
    listed = yaml.safe_load(EQUIVALENT.read_text()) or {}
    assert isinstance(listed, dict) and all(isinstance(v, str) and v for v in listed.values()), EQUIVALENT
    return listed


def _copy_checkout(dest: Path) -> None:
    """The checkout's tracked files (and its uncommitted changes to them) into ``dest``."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def measure(module: str, work: Path) -> dict[str, object]:
    """Run mutmut on ``module`` in a copy of the checkout under ``work``; its counts, score and survivors."""
    copy = work / Path(module).stem
    copy.mkdir(parents=True)
    _copy_checkout(copy)
    tops = sorted({Path(n).parts[0] for n in (p.relative_to(copy) for p in copy.rglob("*") if p.is_file())})
    config = {
        "source_paths": ["imagebuilder/"],
        "only_mutate": [module],
        "also_copy": [t for t in tops if t not in ("imagebuilder", "tests", "pyproject.toml")],
        "pytest_add_cli_args_test_selection": ["tests/unit/"],
        "pytest_add_cli_args": ["-q", "-x", "-p", "no:cacheprovider"],
    }
    with (copy / "pyproject.toml").open("a") as fh:
        fh.write("\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    mutmut = Path(sys.executable).parent / "mutmut"
    run = subprocess.run([str(mutmut), "run"], cwd=copy, capture_output=True, text=True, check=False,
                         env={**os.environ, PROFILE_ENV: "1"})  # fmt: skip
    meta = copy / "mutants" / (module + ".meta")
    if not meta.is_file():
        raise NotMeasured(f"mutmut produced no results for {module} (exit {run.returncode}):\n{run.stdout[-3000:]}"
                         f"{run.stderr[-3000:]}")  # fmt: skip
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    if codes and all(code is None for code in codes.values()):
        why = (
            "no unit test reaches it (its tests are integration tests: a score over the unit tests is 0)"
            if "could not find any test case" in run.stdout
            else "the unit tests must pass on the copy first"
        )
        raise NotMeasured(f"mutmut checked no mutant of {module} (exit {run.returncode}): {why}\n"
                         f"{run.stdout[-3000:]}{run.stderr[-3000:]}")  # fmt: skip
    listed = equivalent()
    counts: Counter[str] = Counter()
    survivors = []
    for name, code in sorted(codes.items()):
        if name in listed:
            counts["equivalent"] += 1
        elif code in KILLED:
            counts["killed"] += 1
        elif code in SURVIVED:
            counts["survived"] += 1
            survivors.append(name)
        else:
            counts["not checked"] += 1
            survivors.append(name)
    scored = len(codes) - counts["equivalent"]
    score = counts["killed"] / scored if scored else 1.0
    _write_report(module, copy, mutmut, survivors)
    return {"module": module, "mutants": len(codes), **counts, "score": round(score, 3), "survivors": survivors}


def _write_report(module: str, copy: Path, mutmut: Path, survivors: list[str]) -> None:
    """Each survivor's change (``mutmut show``), in ``REPORTS/<module>.txt``: what a new test must notice, or what
    to list as equivalent with why. The copy it was made in is gone after the run."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    shown = []
    for name in survivors:
        diff = subprocess.run([str(mutmut), "show", name], cwd=copy, capture_output=True, text=True, check=False)
        shown.append(f"## {name}\n{diff.stdout.strip()}\n")
    report = REPORTS / (module.replace("/", ".") + ".txt")
    report.write_text(f"# {module}: {len(survivors)} survivors\n\n" + "\n".join(shown))
    print(f"{module}: the survivors' changes are in {report}", flush=True)


def main(modules: list[str]) -> int:
    """Measure ``modules`` (checked by the task: paths of the checkout), or every guarded one."""
    results = []
    unmeasured: list[str] = []
    with tempfile.TemporaryDirectory(prefix="image-builder-mutation-") as tmp:
        for module in modules or list(GUARDED):
            try:
                result = measure(module, Path(tmp))
            except NotMeasured as exc:  # one module mutmut could not measure: said, and the next one measured
                print(f"{module}: not measured: {exc}", flush=True)
                unmeasured.append(module)
                continue
            results.append(result)
            print(f"{module}: {result['score']:.1%} of {result['mutants']} mutants killed "
                  f"({', '.join(f'{k} {v}' for k, v in result.items() if isinstance(v, int) and k != 'mutants')})",
                  flush=True)  # fmt: skip
            for name in result["survivors"][:40]:  # type: ignore[index]
                print(f"  survived: {name}")
    low = [r["module"] for r in results if float(r["score"]) < TARGET]  # type: ignore[arg-type]
    if low:
        print(f"under {TARGET:.0%}: {', '.join(map(str, low))}")
    return 1 if low or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
