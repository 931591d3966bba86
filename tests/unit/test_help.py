"""What a new user reads first tells the truth (issue 61): ``image-builder --help`` shows image-builder only, every
task's help is made from the facts the tasks run on, each names its values, and ``--list`` gives each task one whole
sentence. In-process: the help of all 43 tasks in a second. tests/integration/test_help_examples.py runs the
examples and checks the stated defaults against dry runs."""

from __future__ import annotations

import contextlib
import copy
import io
import re

import pytest

from imagebuilder import __version__
from imagebuilder.cli import _help as helptext
from imagebuilder.cli import namespace
from imagebuilder.cli.program import ImageBuilderProgram, short_name
from imagebuilder.release.catalog import load_catalog

#: Invoke's own options, which image-builder does not have (its letters are the tasks')
INVOKE_OPTIONS = ("--echo", "--dry", "--config", "--hide", "--write-pyc", "--prompt-for-sudo-password", "--debug",
                  "--pty", "--warn-only", "--command-timeout", "--list-depth", "--list-format", "--collection",
                  "--search-root", "--no-dedupe")  # fmt: skip
TASKS = sorted(namespace.task_names)


def run(*argv: str) -> tuple[int, str]:
    """``image-builder *argv`` in this process: (exit status, what it printed)."""
    # on a copy: Invoke pops a task's help texts when it builds its arguments, so a second run would show none
    program = ImageBuilderProgram(namespace=copy.deepcopy(namespace), name="image-builder", binary="image-builder",
                                  version=__version__)  # fmt: skip
    out = io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            program.run(["image-builder", *argv])
        except SystemExit as exc:
            code = exc.code
    return int(code or 0), out.getvalue()


def section(text: str, heading: str) -> list[str]:
    """The lines under ``heading`` up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_image_builder_help_shows_only_its_own_options() -> None:
    code, text = run("--help")
    assert code == 0
    options = [line.split()[0].rstrip(",") for line in section(text, "Options:") if line.startswith("  -")]
    assert sorted(options) == ["--complete", "--list[=NAMESPACE]", "--print-completion-script=SHELL", "--version",
                               "-h"], options  # fmt: skip
    for option in INVOKE_OPTIONS:
        assert option not in text, f"Invoke's {option} shows through"
    assert text.startswith("Usage: image-builder TASK [options]")
    assert "[--core-opts]" not in text and "subcommand" not in text.lower()


def test_version_is_image_builders() -> None:
    assert run("--version") == (0, f"image-builder {__version__}\n")


@pytest.mark.parametrize("option", ["-f", "--echo", "--dry", "-e", "-d"])
def test_invokes_options_are_unknown_and_exit_2(option: str) -> None:
    code, text = run(option, "dhcp.schema")
    assert code == 2, text
    assert f"No idea what '{option}' is" in text
    if option in ("-f", "-e", "-d"):  # no did-you-mean among image-builder's options: where a task's flag goes
        assert f"image-builder TASK {option} ..." in text, text


def test_a_tasks_letter_is_the_tasks_own() -> None:
    """``-f`` is ``--file`` of the tasks that take a file (the reference tool's spelling), never a config file."""
    code, text = run("vsphere.setup-user", "-f", "/nonexistent/user.yaml", "--dry-run")
    assert code == 2 and "--file" in text and "does not exist" in text, text


def _task_help(task: str) -> str:
    code, text = run(task, "--help")
    assert code == 0, text
    return text


@pytest.mark.parametrize("task", TASKS)
def test_every_tasks_help_reads_as_image_builders(task: str) -> None:
    text = _task_help(task)
    assert text.splitlines()[0] == f"Usage: image-builder {short_name(namespace, task)} [options]" or (
        not copy.deepcopy(namespace[task]).get_arguments() and text.startswith(f"Usage: image-builder {task}\n")
    ), text.splitlines()[0]
    assert "=STRING" not in text and "=INT" not in text, "a value placeholder says what the value is"
    assert "{=" not in text, "every fact field is filled in"
    assert "Docstring:" not in text and "[--core-opts]" not in text and "other tasks here" not in text


@pytest.mark.parametrize("task", TASKS)
def test_every_task_ends_with_examples_of_its_own_flags(task: str) -> None:
    examples = helptext.examples(namespace[task].__doc__)
    assert 1 <= len(examples) <= 3, f"{task}: one to three examples"
    text = _task_help(task)
    assert text.rstrip().splitlines()[-len(examples) :] == [f"  {helptext.render(e)}" for e in examples]
    own = {"--" + a.name.replace("_", "-") for a in copy.deepcopy(namespace[task]).get_arguments()}
    own |= {f"-{n}" for a in copy.deepcopy(namespace[task]).get_arguments() for n in a.names if len(n) == 1}
    for example in examples:
        words = helptext.render(example).split()
        assert words[1] in (task, short_name(namespace, task)), example
        named = {w for w in words if w.startswith("-")}
        assert named <= own, f"{example}: {sorted(named - own)} are not flags of {task}"


def test_list_gives_every_task_one_whole_sentence() -> None:
    code, text = run("--list")
    assert code == 0
    rows = section(text, "Tasks:")
    listed: dict[str, str] = {}
    for line in rows:
        if line.startswith("  ") and not line.startswith("   "):
            name, _, rest = line.strip().partition(" ")
            listed[name] = rest.strip()
        else:
            listed[name] += " " + line.strip()
    assert sorted(listed) == sorted(short_name(namespace, t) for t in TASKS)
    for name, sentence in listed.items():
        full = next(t for t in TASKS if short_name(namespace, t) == name)
        assert sentence == helptext.summary(namespace[full].__doc__), name
        assert re.search(r"[.!?]$", sentence), f"{name}: {sentence!r} stops mid-sentence"


def _all_help() -> str:
    return "\n".join(_task_help(task) for task in TASKS)


def test_every_fact_a_help_names_exists() -> None:
    fields = {m.group(1) for t in TASKS for m in helptext.FIELD.finditer(str(namespace[t].__doc__) + str(
        copy.deepcopy(namespace[t]).help))}  # fmt: skip
    assert fields <= set(helptext.FACTS), sorted(fields - set(helptext.FACTS))
    for name in helptext.FACTS:
        assert helptext.fact(name), name


def test_every_line_version_and_os_version_a_help_states_is_the_catalogs() -> None:
    """The channels, Kubernetes minors and versions and OS versions any help states are ones the catalog has: a
    help text that lists lines by hand (1.21 .. 1.24 while the tool takes 1.36) fails here."""
    catalog = load_catalog()
    text = " ".join(_all_help().split())  # one line: a wrapped help is read as it is meant
    channels = set(catalog.channels)
    minors = {c.minor for c in catalog.channels.values()}
    kubernetes = {c.kubernetes_version for c in catalog.channels.values()}
    from imagebuilder.builder.packer_plugins import TESTED_PACKERS
    from imagebuilder.flows.demo import DEMO_KUBERNETES
    from imagebuilder.release.k8sversion import OLDEST_MINOR

    kubernetes |= {DEMO_KUBERNETES, f"v1.{OLDEST_MINOR}.0", *TESTED_PACKERS}  # and the Packers it is tested with
    os_versions = {v.version for o in catalog.operating_systems.values() for v in o.versions}
    for m in re.finditer(r"(?<![\w.-])1-([0-9]+)(?![\w-])", text):
        assert m.group(0) in channels, f"line {m.group(0)} is not a channel: {text[m.start() - 80 : m.end()]!r}"
    # spec 4.6 is a section of the spec, Packer 1.7 a Packer
    unspec = re.sub(r"(spec|Packer) [0-9.]+(, [0-9.]+)*", r"\1", text)
    for m in re.finditer(r"(?<![\w.-])(v?1\.[0-9]+)(\.[0-9]+)?(?![\w.-]*[0-9])", unspec):
        if m.group(2):
            assert m.group(0) in kubernetes, f"{m.group(0)}: {unspec[m.start() - 80 : m.end()]!r}"
        else:
            assert m.group(1).lstrip("v") in minors, f"{m.group(0)}: {unspec[m.start() - 80 : m.end()]!r}"
    for m in re.finditer(r"(?<![\w.])[0-9]{2}\.04(?![\w.])", text):  # an Ubuntu release
        assert m.group(0) in os_versions, f"ubuntu {m.group(0)}: {text[m.start() - 80 : m.end()]!r}"


def test_the_stated_os_version_defaults_are_the_plans() -> None:
    """``build --help`` states each OS's default on the newest line: what the catalog plans for it."""
    catalog = load_catalog()
    newest = catalog.newest_channel()
    text = " ".join(_task_help("build.build").split())
    for name in ("ubuntu", "redhat"):
        os = catalog.os(name)
        planned = newest.default_os_version(os) or (os.default_version.version if os.default_version else None)
        assert f"{name} " in text and f"(default on {newest.name}: {planned})" in text, name


@pytest.mark.parametrize("flag", ["--os", "--hypervisor", "--arch", "--engine", "--runtime", "--output", "--firmware"])
def test_each_choice_build_refuses_names_what_its_help_lists(flag: str) -> None:
    """A bad value's error lists the accepted choices: each is in the flag's help (so help and check agree)."""
    base = {"--os": "ubuntu", "--hypervisor": "baremetal", "--release-channel": load_catalog().newest_channel().name}
    base[flag] = "zzz"
    args = [w for k, v in base.items() for w in (k, v)]
    code, text = run("build", *args, "--offline", "--dry-run")
    assert code == 2, text
    expected = re.search(r"\(expected (?:one of )?(.*)\)\s*$", text.strip(), re.S)
    assert expected, text
    choices = [c.split(" (")[0] for c in re.split(r",\s*|\s+or\s+", expected.group(1)) if c]
    help_line = " ".join(_task_help("build.build").split())
    described = help_line[help_line.index(flag + "=") :].split(" --", 1)[0]
    for choice in choices:
        assert re.search(rf"\b{re.escape(choice)}\b", described), f"{flag}: {choice} is accepted, not in its help"


_LINE_TOKEN = re.compile(r"(?<![\w.-])(?:1-([0-9]+)|v?1\.([0-9]+))(?![\w-]|\.[0-9])")


def test_a_help_that_lists_lines_lists_through_the_newest() -> None:
    """A flag's help that names two or more lines names the newest among them: a list typed once ("1.21, 1.22, 1.23
    or 1.24") goes stale when a line is added, while the tool takes it (issue 61)."""
    newest = load_catalog().newest_channel().minor_number
    for task in TASKS:
        for flag, text in copy.deepcopy(namespace[task]).help.items():
            rendered = re.sub(r"(default|e\.g\.|spec|Packer) \S+", "", helptext.render(text))
            minors = {int(a or b) for a, b in _LINE_TOKEN.findall(rendered)}
            if len(minors) >= 2:
                assert newest in minors, f"{task} --{flag}: {rendered!r} lists lines without 1.{newest}"


def test_command_examples_in_the_readme_and_docs_build_lines_that_are_not_end_of_life() -> None:
    """An example a user copies builds a line that still gets fixes: ``--release-channel 1-24`` warns "end of life"
    (the historic releases, ``1-24-eks-5``, are named to show that naming)."""
    from tests.support.common import ROOT

    catalog = load_catalog()
    dead = {c.minor_number for c in catalog.channels.values() if c.support == "end-of-life"}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if "image-builder " not in line and not line.startswith("| `"):
                continue
            for flag in re.finditer(r"--(?:release-channel|kubernetes) ([0-9v][0-9.,-]*)", line):
                for value in flag.group(1).split(","):
                    m = re.fullmatch(r"v?1[-.]([0-9]+)(?:\.[0-9]+)?", value.strip(".,"))
                    assert m is None or int(m.group(1)) not in dead, f"{doc.name}:{number}: {value} is end of life"


def test_an_old_spelling_does_what_the_new_name_does() -> None:
    """``--kubernetes 1.36`` (the old spelling in template.*) and ``--release-channel 1-36`` plan the same tags."""
    base = ("template.tag", "--template", "/DC0/vm/t", "--os", "ubuntu", "--dry-run")
    old, new = run(*base, "--kubernetes", "1.36"), run(*base, "--release-channel", "1-36")
    assert old == new and old[0] == 0, (old, new)


def test_every_list_flag_takes_commas_repetition_and_both() -> None:
    from imagebuilder.cli import flags

    assert flags.comma_list(["ubuntu", "redhat"], "--os") == flags.comma_list("ubuntu,redhat", "--os")
    assert flags.comma_list(["ubuntu,redhat", "x"], "--os") == ["ubuntu", "redhat", "x"]
    code, text = run("build.matrix", "--os", "ubuntu", "--os", "ubuntu", "--hypervisor", "baremetal",
                     "--release-channel", "1-36", "--dry-run")  # fmt: skip
    assert code == 2 and "--os: lists a value twice: ubuntu,ubuntu" in text, text


@pytest.mark.parametrize(("given", "expected"), [(True, True), ("false", False), ("TRUE", True), ("0", False),
                                                 (None, None)])  # fmt: skip
def test_a_switch_that_takes_a_value_reads_it(given: str | bool | None, expected: bool | None) -> None:
    """``--insecure=false`` was once read as on (a non-empty text); it is off."""
    from imagebuilder.cli import flags

    assert flags.switch(given, "--insecure") is expected


def test_a_switch_refuses_what_is_neither_on_nor_off() -> None:
    code, text = run("template.validate", "--template", "/DC0/vm/t", "--os", "ubuntu", "--release-channel", "1-36",
                     "--insecure=maybe")  # fmt: skip
    assert code == 2 and "--insecure" in text and "not on or off" in text, text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("env", "tty", "coloured"), [({}, True, True), ({"NO_COLOR": "1"}, True, False),
                                                      ({"TERM": "dumb"}, True, False), ({}, False, False)])  # fmt: skip
def test_status_words_are_coloured_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                      tty: bool, coloured: bool) -> None:  # fmt: skip
    from imagebuilder.cli._common import _Masked

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = _Terminal() if tty else io.StringIO()
    stream = _Masked(out)
    stream.write("[ok  ] arch x86_64\n[FAIL] kvm \x1b[2J gone\nplain https://u:S3CRET@h/x\n")
    text = out.getvalue()
    assert ("\x1b[32m[ok  ]\x1b[0m" in text) is coloured
    assert ("\x1b[1;31m[FAIL]\x1b[0m" in text) is coloured
    assert "\x1b[2J" not in text and "S3CRET" not in text, "the text's own escapes and secrets never pass"
    assert text.count("\x1b") == (4 if coloured else 0), "only the marks are coloured"


def test_a_dry_run_estimates_a_build_the_benchmarks_measured() -> None:
    """The estimate is bench/results.json's steps of the same engine and architecture, labelled as one; a build of
    another kind (an ISO install) gets none rather than a guess."""
    import json
    import types

    from imagebuilder.builder.estimate import RESULTS, build_estimate
    from tests.support.common import ROOT

    data = json.loads((ROOT / RESULTS).read_text())
    plan = types.SimpleNamespace(arch="amd64", engine="chroot")
    estimate = build_estimate(plan, image_based=True)  # type: ignore[arg-type]
    assert estimate is not None and dict(estimate.steps) == data["engines"]["chroot_steps"]
    assert estimate.describe().endswith("an estimate") and data["date"] in estimate.measured
    arm = build_estimate(types.SimpleNamespace(arch="arm64", engine="packer"), image_based=True)  # type: ignore[arg-type]
    assert arm is not None and dict(arm.steps) == data["arm64"]["packer_steps"]
    assert build_estimate(plan, image_based=False) is None  # type: ignore[arg-type]


def test_every_default_a_help_states_is_the_tasks() -> None:
    """Where a flag has a default in its task's signature and its help says "(default X", X is that default (or the
    help names the default as the choice it describes: ``auto (default: the fastest ...)``)."""
    checked = 0
    for task in TASKS:
        copied = copy.deepcopy(namespace[task])
        texts = dict(copied.help)
        for arg in copied.get_arguments():
            text = helptext.render(texts.get(arg.name, "") or "")
            m = re.search(r"\(default:? (\S+)", text)
            if not m or arg.default in (None, "", False, []):
                continue
            stated = m.group(1).rstrip(":,;)").strip("'\"")
            default = str(arg.default)
            assert stated in (default, f"./{default}") or f"{default} (default" in text, (task, arg.name, text)
            checked += 1
    assert checked >= 20, "the defaults were really read"


#: the tasks without --dry-run, each with why: they change nothing, or what they write is the whole of what they do
#: (a report or schema the user asked for). Every other task changes something, so it takes --dry-run.
NO_DRY_RUN = {
    "cluster.validate": "reads cluster specs and vCenter",
    "config.schema": "prints a schema (or writes it to --dest: the output is the task)",
    "dhcp.leases": "reads the lease file (--output: the report is the task)",
    "dhcp.schema": "prints a schema",
    "dhcp.verify": "captures packets",
    "image.diff": "reads two images (--output: the report is the task)",
    "image.verify": "reads an image; its boots run on copies",
    "lint": "checks the checkout",
    "preflight": "checks this host",
    "template.validate": "reads a template's tags",
    "test": "runs the suite",
    "vsphere.thumbprint": "reads a certificate",
}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_that_changes_something_takes_dry_run(task: str) -> None:
    names = {a.name for a in copy.deepcopy(namespace[task]).get_arguments()}
    assert ("dry_run" in names) != (task in NO_DRY_RUN), (
        f"{task}: a task that changes something takes --dry-run; one that changes nothing is in NO_DRY_RUN with why"
    )
