"""Hostile build options (the reference tool's fields): files.json entries, package source files, proxies and
package lists. Each is refused before anything runs, naming the file and field, or passes through inert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.core.errors import InputErrors
from imagebuilder.customization.model import AdditionalFile
from imagebuilder.plan.config import ConfigContext, validate_provider_config
from imagebuilder.providers.baremetal.provider import BaremetalConfig
from imagebuilder.release.catalog import load_catalog
from tests.support.inproc import cli

UBUNTU = load_catalog().os("ubuntu")


def check(data: dict[str, object], tmp_path: Path) -> dict[str, str]:
    ctx = ConfigContext("ubuntu", UBUNTU.version(None), tmp_path / "baremetal.json")
    try:
        validate_provider_config(BaremetalConfig, data, ctx)
    except InputErrors as exc:
        return {e.field or "": str(e) for e in exc.errors}
    return {}


@pytest.mark.parametrize(
    "text",
    [
        "deb [trusted=yes] http://repo.local/{{ lookup('pipe', 'id') }} ./\n",
        "# {{ lookup('pipe', 'touch /tmp/pwned') }}\ndeb http://repo.local/ ./\n",
        "deb http://repo.local/ ./ {% raw %}\n",
        "deb http://repo.local/ ./\x1b[2J\n",
        "http://repo.local/ focal main\n",
        "deb http://repo.local/\n",
        "",
    ],
)
def test_a_hostile_sources_list_is_refused(text: str, tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(text)
    problems = check({"extra_repos": "sources.list"}, tmp_path)
    assert "extra_repos" in problems and str(tmp_path / "baremetal.json") in problems["extra_repos"]


@pytest.mark.parametrize(
    "value",
    [
        "http://u:p@proxy.local:3128/path",
        "socks5://proxy.local:1080",
        "http://proxy.local:3128\nX-Injected: 1",
        "http://proxy.local:99999",
        "http://{{ lookup('env', 'HOME') }}:3128",
    ],
)
def test_a_hostile_proxy_is_refused_and_its_password_is_not_repeated(value: str, tmp_path: Path) -> None:
    problems = check({"http_proxy": value}, tmp_path)
    assert "http_proxy" in problems
    assert ":p@" not in problems["http_proxy"]


@pytest.mark.parametrize("value", ["wget;id", "wget $(id)", "-o", "wget\x00", "{{x}}"])
def test_a_hostile_package_list_is_refused(value: str, tmp_path: Path) -> None:
    assert "extra_debs" in check({"extra_debs": value}, tmp_path)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_every_accepted_destination_is_a_plain_absolute_path(dest: str) -> None:
    try:
        entry = AdditionalFile(src="x", dest=dest)
    except ValueError:
        return
    assert entry.dest.startswith("/") and "/../" not in entry.dest + "/" and "//" not in entry.dest
    assert not any(c in entry.dest for c in "{}\n\r\x00")


def test_a_hostile_files_json_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    files = tmp_path / "files.json"
    out = tmp_path / "out"
    for hostile in (
        '{"additional_files_list": [{"src": "x", "dest": "/etc/x", "src": "y"}]}',
        '{"additional_files_list": ' + "[" * 500 + "]" * 500 + "}",
        json.dumps({"additional_files_list": [{"src": "x", "dest": "/../../etc/shadow"}]}),
        json.dumps({"additional_files_list": [{"src": "x", "dest": "/etc/x", "mode": "4755x"}]}),
        json.dumps({"additional_files_list": [{"src": "/etc/shadow-missing", "dest": "/etc/x"}]}),
        json.dumps({"additional_files_list": "x"}),
        json.dumps({"files": []}),
    ):
        files.write_text(hostile)
        res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
                  "--files-config", str(files), "--offline", "--output-dir", str(out))  # fmt: skip
        assert res.code == 2, (hostile[:80], res.err)
        assert str(files) in res.err and "Traceback" not in res.err
        assert not out.exists()


@settings(max_examples=200, deadline=None)
@given(value=st.text(max_size=30), provider=st.sampled_from(["baremetal", "vsphere", "cloudstack", "nutanix", "ami"]))
def test_firmware_is_bios_or_efi_where_the_matrix_allows_it_and_nothing_else(value: str, provider: str) -> None:
    from imagebuilder.core.errors import InputError

    for os_ in (o for o in load_catalog().operating_systems.values() if o.buildable):
        if value == "bios" or (value == "efi" and provider in os_.efi_providers):
            assert os_.firmware_for(value, provider) == value
            continue
        with pytest.raises(InputError) as caught:
            os_.firmware_for(value, provider)
        assert caught.value.field == "--firmware" and "bios" in str(caught.value.expected)
        assert "\n" not in caught.value.detail  # the value is quoted (repr), never laid out raw
