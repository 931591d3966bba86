"""Developer tasks: ``lint`` and ``test`` (the README's test command is ``invoke test``)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from invoke.context import Context

from imagebuilder.cli._common import cli_task, task
from imagebuilder.core import paths
from imagebuilder.core.errors import ExternalError, InputError

BIN = Path(sys.executable).parent
#: the pytest markers of tests that need root, a VM or a long run (pyproject.toml declares them)
HEAVY_MARKERS = ("root", "netns", "qemu", "vcsim", "slow")
#: the static checks of the source, each a program of the virtualenv with its arguments, run from the checkout
STATIC_CHECKS = ("ruff check .", "ruff format --check .", "mypy", "ansible-lint -q ansible/")
#: the suite's module that runs them: the full suite runs them as tests, beside the others (the Packer templates'
#: checks are tests/integration/test_packer.py's), rather than before it with a core idle
STATIC_MODULE = "tests/integration/test_static_checks.py"


@task(
    help={
        "packer": "the packer binary that validates the templates (default: packer on PATH)",
        "packer_plugins": "folder of Packer plugin binaries to install missing plugins from (Packer 1.7+; default:"
        " 'packer init')",
    },
)
@cli_task
def lint(c: Context, packer: str | None = None, packer_plugins: str | None = None) -> None:
    """Static checks: ruff, mypy, ansible-lint (in a checkout), and all seven pairs rendered, packer validate'd and
    fmt-checked (anywhere: an installed package checks the templates it ships).

    Examples:
        image-builder lint
    """
    from imagebuilder.cli import flags

    plugin_dir = flags.existing_dir(packer_plugins, "--packer-plugins") if packer_plugins else None
    from imagebuilder.builder.packer_plugins import PackerInfo

    info = PackerInfo.detect(packer)  # before the renderers are imported: a bad --packer is answered at once
    from imagebuilder.builder.lint import lint_templates

    root = paths.checkout_root()
    if root is None:
        print("ruff, mypy, ansible-lint: skipped (they check the source; this is an installed package)")
    else:
        with c.cd(str(root)):
            # every check runs, so one report names everything to fix
            failed_checks = [cmd for cmd in STATIC_CHECKS if not c.run(f"{BIN}/{cmd}", warn=True).ok]
        if failed_checks:
            raise ExternalError(
                f"static checks failed: {', '.join(failed_checks)}",
                hint="their output is above; 'ruff format .' fixes formatting",
            )
    with tempfile.TemporaryDirectory(prefix="image-builder-lint-") as tmp:
        results = lint_templates(Path(tmp), info, plugins=plugin_dir, say=print)
        print(f"packer {info.version_text} ({info.path})")
        for r in results:
            mode = "validate -syntax-only" if r.syntax_only else "validate"
            status = "ok" if r.ok else "FAILED"
            print(f"packer {mode:<21} fmt -check  {r.os:<7} {r.provider:<11} {r.arch:<6} {status}")
            if not r.ok:
                print("  " + r.output.replace("\n", "\n  "))
        failed = [f"{r.os}+{r.provider}+{r.arch}" for r in results if not r.ok]
        if failed:
            raise ExternalError(f"Packer templates failed their checks: {', '.join(failed)}")


#: the flag harness of issue 60: every flag of every task attacked (a sample of it in --quick)
HARNESS = "tests/integration/adversarial/test_every_flag.py"


@task(
    help={
        "k": "only tests matching this pytest -k expression",
        "no_lint": "skip the static checks of the source (ruff, mypy, ansible-lint; the templates' Packer checks are"
        " tests of their own)",
        "fast": "only the tests that need no root, network namespace, VM, vcsim or long run (no static checks)",
        "quick": "the edit-test loop: tests/unit (in-process: no program, socket, root or guest) and a tenth of the"
        " flag harness (tests/integration/adversarial/test_every_flag.py); about a minute",
        "mutation": "instead of the suite: the mutation score of these modules (comma-separated paths, or 'guarded':"
        " the code that guards secrets and trust) over the unit tests, with mutmut; fails under 90%; minutes to"
        " hours per module, not part of the CI run (tests/support/mutation.py)",
    },
)
@cli_task
def test(c: Context, k: str = "", no_lint: bool = False, fast: bool = False, quick: bool = False,
         mutation: str = "") -> None:  # fmt: skip
    """Run the whole test suite: pytest against the real components, the static checks among its tests.

    Examples:
        image-builder test --quick
    """
    if fast and quick:
        raise InputError("--fast and --quick choose different sets", field="--quick", expected="one of them")
    if mutation:
        from imagebuilder.cli import flags
        from imagebuilder.core.safepath import safe_join

        modules = [m for m in flags.comma_list(mutation, "--mutation") if m != "guarded"]
        root = paths.require_checkout("test")
        for module in modules:
            if not module.endswith(".py") or not safe_join(root, module, what="--mutation module").is_file():
                raise InputError(f"not a module of the checkout: {module[:80]!r}", field="--mutation",
                                 expected="paths like imagebuilder/core/grammar.py, or 'guarded'")  # fmt: skip
        with c.cd(str(root)):
            done = c.run(f"{BIN}/python -m tests.support.mutation {' '.join(modules)}", pty=False, warn=True)
        if done is None or not done.ok:
            raise ExternalError("the mutation score is under 90% (or mutmut failed)", hint="its report is above")
        return
    select = f" -k '{k}'" if k else ""
    if no_lint:
        select += f" --ignore={STATIC_MODULE}"
    env = {}
    if quick:
        select += f" -n auto tests/unit {HARNESS}"
        env["IMAGE_BUILDER_HARNESS_SAMPLE"] = "10"
    elif fast:
        # light tests are independent of each other: spread them over the cores
        select += f" -m 'not ({' or '.join(HEAVY_MARKERS)})' -n auto"
    else:
        # one module per worker at a time (module fixtures such as the offline namespace stay together), in the
        # collection's order (tests/conftest.py puts the end-to-end builds first, so each starts at once on its own
        # worker; xdist's default reorder would start them last). A worker per core for the modules that boot
        # guests or build images, and one more at a low CPU priority for the rest, which mostly wait (DHCP, vcsim,
        # timeouts) and so wait beside the guests instead of after them (tests/support/schedule.py; a third worker
        # at normal priority, measured, put a third guest beside the two builds and slowed every guest far beyond
        # its share: docs/testing.md). The slowest tests are listed at the end, so a CI log shows where the time
        # went.
        workers = (os.cpu_count() or 1) + 1
        select += f" -n {workers} --filler-worker --dist loadfile --no-loadscope-reorder --durations=15"
    with tempfile.TemporaryDirectory(prefix="image-builder-test-") as tmp, c.cd(str(paths.require_checkout("test"))):
        # the failed tests' names, for the last lines of the output (tests/conftest.py writes them)
        failed = Path(tmp) / "failed"
        result = c.run(f"{BIN}/python -m pytest{select}", pty=False, warn=True,
                       env={"IMAGE_BUILDER_FAILED_TESTS": str(failed), **env})  # fmt: skip
        names = failed.read_text().split() if failed.is_file() else []
    if result is None or not result.ok:
        code = "?" if result is None else result.exited
        listed = "".join(f"\n  failed: {n}" for n in names[:20])
        listed += f"\n  ... and {len(names) - 20} more" if len(names) > 20 else ""
        # a failing test is a finding, not a bug in this task: pytest's report is above
        raise ExternalError(f"the test suite failed (pytest exit {code}){listed}", hint="pytest's report is above")
