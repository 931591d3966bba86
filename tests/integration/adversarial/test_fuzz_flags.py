"""Every task, every flag, any text (Hypothesis): the program answers with 0, 1 or 2 and a message, never an internal
error or a traceback. Tasks that would reach the network or change this host are run with --dry-run or pointed at
a closed port, so a generated value cannot do harm."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuilder.cli import namespace
from imagebuilder.core.untrusted import masked
from tests.support.inproc import cli

#: tasks left out: they run the whole suite, rebuild the docs, or serve forever
SKIP = {"test", "lint", "docs", "serve", "demo", "image.base", "dhcp.install", "host.prepare", "dhcp.verify"}
#: extra flags per task so a fuzzed run stays harmless and quick
SAFE = {
    "build": ["--dry-run", "--offline"],
    "mirror.create": ["--dry-run"],
    "download.bottlerocket": ["--dry-run", "--metadata-url", "http://127.0.0.1:9/m", "--root", "http://127.0.0.1:9/r"],
    "download.hook": ["--dry-run", "--manifest", "http://127.0.0.1:9/manifest.yaml"],
    "vsphere.setup-user": ["--dry-run"],
    "template.import": ["--dry-run"],
    "template.tag": ["--dry-run"],
}
ENV = {"GOVC_URL": "https://127.0.0.1:9/sdk", "GOVC_USERNAME": "u", "GOVC_PASSWORD": "fuzz-S3CRET"}

TASKS = sorted(name for name in namespace.task_names if name not in SKIP)


def _flags(task: str) -> list[str]:
    # on a copy: Invoke pops a task's help texts when it builds its arguments, and other tests read them
    arguments = copy.deepcopy(namespace[task]).get_arguments()
    return sorted(a.name.replace("_", "-") for a in arguments if a.kind is not bool)


values = st.text(max_size=60) | st.sampled_from(
    ["", "-1", "0", "65536", "../../etc/passwd", "/", ".", "ftp://x/y", "https://u:fuzz-S3CRET@h/x", "a\nb", "%00",
     "1.24", "ubuntu", "vsphere", "1-24", "*", "{{x}}", "${x}", "\x1b[2J"]
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.sampled_from(TASKS), data=st.data())
def test_any_flag_value_gets_an_answer_not_a_crash(tmp_path: Path, task: str, data: st.DataObject) -> None:
    names = _flags(task)
    chosen = data.draw(st.lists(st.sampled_from(names), max_size=4, unique=True)) if names else []
    args = [task, *SAFE.get(task, [])]
    for flag in chosen:
        args += [f"--{flag}", data.draw(values)]
    res = cli(*args, env=ENV, cwd=tmp_path)
    assert res.code in (0, 1, 2), (args, res.code, res.text)
    assert "internal error" not in res.text, (args, res.text)
    # a secret typed as a plain value (what the redactor would not hide as a URL's password) is echoed as such
    typed_bare = any("fuzz-S3CRET" in masked(a) for a in args)
    assert typed_bare or "fuzz-S3CRET" not in res.text, (args, res.text)


@pytest.mark.parametrize("value", ["://:fuzz-S3CRET@", "https://user:fuzz-S3CRET@host/list.yaml"])
def test_a_url_with_a_password_given_as_a_file_is_not_echoed(tmp_path: Path, value: str) -> None:
    """Found by the fuzzer above: a path quoted in a message is normalised (``://`` folds to ``:/``), and the
    password in it must still be hidden."""
    res = cli("template.import", "--dry-run", "--from-file", value, env=ENV, cwd=tmp_path)
    assert res.code == 2 and "fuzz-S3CRET" not in res.text, res.text
