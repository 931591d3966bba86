"""The kubernetes role stages a directory mirror's artifacts with one cp (issue 18): every path reaches cp as one
argument of its own, whatever its characters. The task is taken from the real role file and run by the real
ansible-playbook with paths that a shell would act on; the staging directory is the task's own to create."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests.support.common import BIN, ROOT

HOSTILE = ["kube let", "$(touch pwned)", "`touch pwned2`", "-rf", "a;b", "quote'\"s", "new\nline", "*"]


def staging_task() -> dict[str, object]:
    tasks = yaml.safe_load((ROOT / "ansible/roles/kubernetes/tasks/main.yml").read_text())
    (task,) = [t for t in tasks if t["name"].startswith("Stage the artifacts on the build host")]
    return dict(task)


def test_every_mirror_path_is_one_argument(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror dir"
    mirror.mkdir()
    items = []
    for n, name in enumerate(HOSTILE):
        (mirror / name).write_text(f"artifact {n}\n")
        stage = f"images/{name}.tar" if n % 2 else f"bin-{n}"
        items.append({"stage": stage, "src": str(mirror / name), "sha256": "0" * 64})
    items.append({"stage": "downloaded", "url": "http://127.0.0.1:9/never", "sha256": "0" * 64})
    cache = tmp_path / "cache"
    cache.mkdir()
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"artifact_cache": str(cache), "kubernetes_stage_items": items,
                 "ansible_python_interpreter": str(BIN / "python")},
        "tasks": [staging_task()],
    }]  # fmt: skip
    playbook = tmp_path / "stage.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    res = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:]
    for n, item in enumerate(items[:-1]):
        assert (cache / "stage" / item["stage"]).read_text() == f"artifact {n}\n"
    staged = sorted(str(p.relative_to(cache / "stage")) for p in (cache / "stage").rglob("*") if p.is_file())
    assert staged == sorted(i["stage"] for i in items[:-1])  # nothing else, and the download is not a copy
    assert not list(tmp_path.rglob("pwned*")) and not list(Path.cwd().glob("pwned*"))
    assert sorted(p.name for p in mirror.iterdir()) == sorted(HOSTILE)  # the mirror is untouched
