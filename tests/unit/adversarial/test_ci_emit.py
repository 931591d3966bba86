"""Property test of the CI definitions build.matrix --emit writes: whatever text a flag carries, each job's command
gives it back as one argument (shell-quoted) and the YAML parses to exactly that command (no injected keys, steps
or jobs)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from imagebuilder.builder.ci_emit import CiOptions, emit_ci, pipeline
from imagebuilder.builder.resolve import make_plan
from imagebuilder.core.untrusted import carries_credentials
from tests.support.harness import offline_chroot_request

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=60)
#: values with GitHub's expression opener in them too (issue 43: ${{ secrets.X }} in a flag was evaluated)
VALUES = TEXT | st.builds(lambda a, b: f"{a}${{{{ {b} }}}}", st.text(st.characters(blacklist_categories=("Cs",),
                          blacklist_characters="\x00"), max_size=10),
                          st.sampled_from(["secrets.TOKEN", "github.event.issue.title", "'x'"]))  # fmt: skip
LITERAL = "${{ '${{' }}"


def evaluated_by_github(value: str) -> str:
    """What GitHub makes of a workflow string: the one expression the emitter writes (it yields ``${{``), and no
    other (any other expression would be evaluated: the test fails on it)."""
    held = value.replace(LITERAL, "\x00")
    assert "${{" not in held, f"an expression GitHub would evaluate: {value!r}"
    return held.replace("\x00", "${{")


def _scripts(doc: dict[str, object], kind: str) -> dict[str, str]:
    """Each job's commands as the shell gets them (GitHub's ``run:`` as GitHub evaluates it), without the install
    and the secret files' lines (the renderer's own): job id -> its lines."""
    out: dict[str, str] = {}
    own = ("rm -f -- ", "./scripts/setup.sh", "export ")
    if kind == "github-actions":
        for job_id, job in doc["jobs"].items():  # type: ignore[attr-defined]
            runs = [evaluated_by_github(step["run"]) for step in job["steps"] if "run" in step]
            text = "\n".join(r for r in runs if not r.startswith(own[:2]))
            out[job_id] = "\n".join(ln for ln in text.split("\n") if not ln.startswith(own[2]))
    else:
        for job_id, job in doc.items():
            if job_id != "stages":
                out[job_id] = "\n".join(c for c in job["script"] if not c.startswith(own))  # type: ignore[index]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mirror=VALUES, kind=st.sampled_from(["github-actions", "gitlab-ci"]), label=VALUES, folder=VALUES)
def test_emitted_commands_carry_any_value_inertly(
    tmp_path: Path, mirror: str, kind: str, label: str, folder: str
) -> None:
    """The file says exactly the pipeline's commands (no key, step or job injected; GitHub evaluates nothing of a
    flag's), and each command gives every value back as one argument. (A value that carries a credential is never
    written: tests/unit/adversarial/test_untrusted.py.)"""
    assume(not carries_credentials(mirror))
    request = offline_chroot_request(tmp_path)
    plan = make_plan(dataclasses.replace(request, os="ubuntu", hypervisor="baremetal", release_channel="1-24"))
    options = CiOptions(runs_on=(label,), publish=folder, sign=True)  # a published image is signed
    hostile = dataclasses.replace(request, mirror=mirror)
    text = emit_ci(kind, [plan], request=hostile, customize=None, options=options)
    doc = yaml.safe_load(text)
    if kind == "github-actions":
        assert set(doc) == {"name", "on", "jobs"} and len(doc["jobs"]) == 3  # layer, image, publish
        assert all([evaluated_by_github(x) for x in j["runs-on"]] == [label] for j in doc["jobs"].values())
    else:
        assert len(doc) == 4  # stages and the three jobs
        assert all(j["tags"] == [label] for k, j in doc.items() if k != "stages")
    jobs = pipeline([plan], hostile, None, options)
    assert _scripts(doc, kind) == {j.id: "\n".join(j.commands) for j in jobs}
    matrix = [c for j in jobs for c in j.commands if " build.matrix " in c]
    assert len(matrix) == 2  # the layer's and the image's
    for command in matrix:
        argv = shlex.split(command)
        assert argv[argv.index("--mirror") + 1] == mirror
    (publish,) = [c for j in jobs for c in j.commands if " image.publish " in c]
    argv = shlex.split(publish)  # the keys' folder first, then the command: one shell line, split as the shell does
    assert argv[argv.index("--repo") + 1] == folder
