"""Property test of the CI definitions build.matrix --emit writes: whatever text a flag carries, each job's command
gives it back as one argument (shell-quoted) and the YAML parses to exactly that command (no injected keys, steps
or jobs)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuilder.build.ci_emit import emit_ci
from imagebuilder.build.plan import BuildRequest
from imagebuilder.build.resolve import make_plan

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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mirror=VALUES, kind=st.sampled_from(["github-actions", "gitlab-ci"]), label=VALUES)
def test_emitted_commands_carry_any_value_inertly(tmp_path: Path, mirror: str, kind: str, label: str) -> None:
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": "http://images.example/base.qcow2",
                                  "source_image_checksum": "sha256:" + "a" * 64}))  # fmt: skip
    request = BuildRequest(os=None, hypervisor=None, release_channel=None, offline=True, engine="chroot",
                           configs={"baremetal": str(config)})  # fmt: skip
    plan = make_plan(dataclasses.replace(request, os="ubuntu", hypervisor="baremetal", release_channel="1-24"))
    text = emit_ci(kind, [plan], request=dataclasses.replace(request, mirror=mirror), customize=None,
                   runs_on=[label])  # fmt: skip
    doc = yaml.safe_load(text)
    if kind == "github-actions":
        assert set(doc) == {"name", "on", "jobs"} and len(doc["jobs"]) == 2
        commands = [evaluated_by_github(s["run"]) for j in doc["jobs"].values() for s in j["steps"] if "run" in s]
        assert all([evaluated_by_github(x) for x in j["runs-on"]] == [label] for j in doc["jobs"].values())
    else:
        assert len(doc) == 3
        commands = [c for k, j in doc.items() if k != "stages" for c in j["script"]]
        assert all(j["tags"] == [label] for k, j in doc.items() if k != "stages")
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)
        assert argv[argv.index("--mirror") + 1] == mirror
