"""The reference tool's "" is "not set": an optional field given as an empty (or blank) string in user.yaml, the
DHCP config or customize.yaml reads as if it were left out; a required one given empty is refused, naming it
(provider configs: tests/unit/test_provider_config.py; the documented files:
tests/integration/test_build_docs_corpus.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.customization.model import load_customization
from imagebuilder.host.dhcp import load_dhcp_config
from imagebuilder.vsphere.userconfig import load_user_config
from tests.support.common import EXAMPLES


def _write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_user_yaml_empty_optional_fields_take_their_defaults(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "vsphere-user.yaml").read_text())
    base = load_user_config(EXAMPLES / "vsphere-user.yaml")
    spec = {**data["spec"], "username": "", "group": " ", "globalRole": "", "userRole": "", "adminRole": ""}
    same = load_user_config(_write(tmp_path / "user.yaml", {**data, "spec": spec}))
    assert same == type(base)(**{**base.__dict__, "source": str(tmp_path / "user.yaml")})
    spec = {**data["spec"], "datacenter": ""}
    with pytest.raises(InputErrors) as err:
        load_user_config(_write(tmp_path / "bad.yaml", {**data, "spec": spec}))
    assert [e.field for e in err.value.errors] == ["spec.datacenter"]


def test_dhcp_config_empty_optional_fields_are_not_set(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "dhcp.yaml").read_text())
    base = {**data, "control_plane_ips": data["control_plane_ips"][1:]}
    base.pop("domain_name")
    empty = {**base, "domain_name": "", "control_plane_ips": [{**base["control_plane_ips"][0], "method": " "},
                                                               *base["control_plane_ips"][1:]]}  # fmt: skip
    want = load_dhcp_config(_write(tmp_path / "base.yaml", base))
    assert load_dhcp_config(_write(tmp_path / "empty.yaml", empty)) == want
    with pytest.raises((InputError, InputErrors)) as err:
        load_dhcp_config(_write(tmp_path / "bad.yaml", {**data, "interface": ""}))
    assert "interface" in str(err.value)


def test_customize_empty_optional_fields_are_not_set(tmp_path: Path) -> None:
    plain = {"registries": {"reg.example.com:5000": {"username": "robot", "password_env": "REG_PW"}}}
    emptied = {
        "user": {"ssh_public_key": ""},
        "registries": {"reg.example.com:5000": {"username": "robot", "password_env": "REG_PW", "password": "",
                                                "password_file": " ", "auth": ""}},
    }  # fmt: skip
    env = {"REG_PW": "Pw-1"}
    a = load_customization(_write(tmp_path / "a.yaml", plain), env=env)
    b = load_customization(_write(tmp_path / "b.yaml", emptied), env=env)
    assert a.summary() == b.summary() and a.secret_values() == b.secret_values()
