"""Hostile input against a real vCenter simulator (vcsim): nothing of vCenter's own is touched, a broken OVA creates
nothing, a dry run refuses what the real run would, and no password appears in any output."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.integration.test_vsphere import DC, NEW_PASSWORD, role_privileges, roles, user_yaml
from tests.support.common import run
from tests.support.vcsim import Vcsim

SECRETS = ["S3cret#pw", "pa/ss@word", "p%40ss:w0rd", "tab\there"]


def test_system_roles_are_never_rewritten_even_with_force(vcsim: Vcsim, tmp_path: Path) -> None:
    before = {name: role_privileges(vcsim, name) for name in ("ReadOnly", "Admin", "NoAccess")}
    for spec in ({"globalRole": "ReadOnly"}, {"userRole": "Admin"}, {"adminRole": "NoAccess"},
                 {"globalRole": "Same", "userRole": "Same", "adminRole": "Same"}):  # fmt: skip
        path = user_yaml(tmp_path, vcsim, **spec)
        for args in (["--force"], ["--password", "env:NEW_PW"], ["--force", "--dry-run"]):
            res = run("vsphere.setup-user", "-f", str(path), *args, env={**vcsim.env, "NEW_PW": NEW_PASSWORD})
            assert res.code == 2, (spec, args, res.err)
    assert {name: role_privileges(vcsim, name) for name in before} == before
    assert "Same" not in roles(vcsim)


def _ova(tmp_path: Path, small: Path, mutate: str) -> Path:
    out = tmp_path / f"{mutate}.ova"
    data = small.read_bytes()
    if mutate == "truncated":
        out.write_bytes(data[: len(data) // 2])
    elif mutate == "not-tar":
        out.write_bytes(b"MZ" + data[:1000])
    elif mutate == "flipped":
        with tarfile.open(small) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
        with tarfile.open(out, "w") as tar:
            for m, body in members:
                if m.name.endswith(".vmdk"):
                    body = body[:600] + b"\xa5" * 64 + body[664:]  # still starts like a VMDK; the manifest differs
                m.size = len(body)
                tar.addfile(m, io.BytesIO(body))
    elif mutate in ("no-ovf-first", "traversal", "bad-xml", "no-disk"):
        with tarfile.open(small) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
        if mutate == "no-ovf-first":
            members.reverse()
        with tarfile.open(out, "w") as tar:
            for m, body in members:
                if mutate == "traversal" and m.name.endswith(".mf"):
                    m.name = "../../evil.mf"
                if mutate == "bad-xml" and m.name.endswith(".ovf"):
                    body = b"<Envelope><unclosed>"
                if mutate == "no-disk" and m.name.endswith(".vmdk"):
                    continue
                m.size = len(body)
                tar.addfile(m, io.BytesIO(body))
    return out


@pytest.mark.parametrize(
    "mutate", ["truncated", "not-tar", "flipped", "no-ovf-first", "traversal", "bad-xml", "no-disk"]
)
def test_a_broken_ova_creates_nothing_on_vcenter(
    vcsim: Vcsim, tmp_path: Path, small_ovas: dict[str, Path], mutate: str
) -> None:
    ova = _ova(tmp_path, small_ovas["ubuntu"], mutate)
    for dry in (["--dry-run"], []):
        res = run("template.import", "--ova", str(ova), "--os", "ubuntu", "--kubernetes", "1.24", *dry, env=vcsim.env)
        assert res.code == 2, (mutate, res.err)
        assert str(ova) in res.err
    assert vcsim.govc("library.ls").strip() == "", "no library, no item"
    assert "Templates" not in vcsim.govc("ls", f"/{DC}/vm")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--datastore", f"/{DC}/datastore/NoSuchDS"), ("--resource-pool", f"/{DC}/host/NoSuchCluster")],
)
def test_dry_run_refuses_what_the_real_run_would(
    vcsim: Vcsim, small_ovas: dict[str, Path], flag: str, value: str
) -> None:
    args = [
        "template.import",
        "--ova",
        str(small_ovas["ubuntu"]),
        "--os",
        "ubuntu",
        "--kubernetes",
        "1.24",
        flag,
        value,
    ]
    dry = run(*args, "--dry-run", env=vcsim.env)
    real = run(*args, env=vcsim.env)
    assert dry.code == real.code == 2 and flag in dry.err and flag in real.err
    assert vcsim.govc("library.ls").strip() == ""


@pytest.mark.parametrize("name", ["a/b", "..", ".", "x" * 81, "tab\tname", "%2f"])
def test_template_names_that_read_as_paths(vcsim: Vcsim, small_ovas: dict[str, Path], name: str) -> None:
    args = ["template.import", "--ova", str(small_ovas["ubuntu"]), "--os", "ubuntu", "--kubernetes", "1.24"]
    res = run(*args, "--name", name, env=vcsim.env)
    assert res.code == 2 and "--name" in res.err, res.err
    assert vcsim.govc("library.ls").strip() == ""


def test_a_plain_vm_is_not_tagged_as_a_template(vcsim: Vcsim) -> None:
    vm = f"/{DC}/vm/DC0_H0_VM0"
    res = run("template.tag", "--template", vm, "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert res.code == 2 and "not a template" in res.err
    assert vcsim.govc("tags.attached.ls", "-r", vm, check=False).strip() == ""


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("form", ["{user}:{secret}@", "https://{user}:{secret}@{server}/sdk", "{user}:{secret}@host:x"])
def test_passwords_in_govc_url_are_never_printed(vcsim: Vcsim, tmp_path: Path, secret: str, form: str) -> None:
    url = form.format(user="admin", secret=secret, server="127.0.0.1:1")
    env = {"GOVC_URL": url, "GOVC_USERNAME": "", "GOVC_PASSWORD": ""}
    for args in (["vsphere.thumbprint"], ["template.validate", "--template", "/x/vm/y", "--os", "ubuntu",
                                          "--kubernetes", "1.24"]):  # fmt: skip
        res = run(*args, env=env)
        assert res.code in (1, 2), res.err
        assert secret not in res.out + res.err, (url, res.err)
    report = tmp_path / "user.yaml"
    report.write_text(json.dumps({"apiVersion": "eks-anywhere.amazon.com/v1", "kind": "vSphereUser",
                                  "spec": {"connection": {"server": url, "insecure": True}}}))  # fmt: skip
    res = run("vsphere.setup-user", "-f", str(report), "--force", env=env)
    assert res.code == 2 and secret not in res.out + res.err
