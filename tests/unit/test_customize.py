"""The customization file (spec 4.8): checked before anything boots, every problem at once, secrets only read."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.errors import InputErrors
from imagebuilder.customization.model import (
    _public_key,
    load_customization,
    seed_documents,
)
from tests.support.customize import write
from tests.support.pki import make_ca

if TYPE_CHECKING:
    pass


def test_an_empty_file_means_defaults(tmp_path: Path) -> None:
    c = load_customization(write(tmp_path, "{}\n"))
    assert c.user.name == "image-builder" and c.user.ssh_public_key is None
    assert c.registries == [] and c.ca_certificates == [] and c.packages == []


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "not-a-cert.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    path = write(
        tmp_path,
        """
usr: {}
ca_certificates: [not-a-cert.pem, missing.pem]
registries:
  "bad host!": {username: u}
  ok.example:5000: {username: u, password_env: NOT_SET}
""",
    )
    with pytest.raises(InputErrors) as info:
        load_customization(path, env={})
    text = str(info.value) + "\n".join(str(e) for e in info.value.errors)
    assert "usr" in text and "did you mean 'user'" in text
    assert "registries" in text and "bad host!" in text
    # the second pass (certificates, secrets) runs once the file's shape is right
    path = write(
        tmp_path,
        """
ca_certificates: [not-a-cert.pem, missing.pem]
registries:
  ok.example:5000: {username: u, password_env: NOT_SET}
""",
    )
    with pytest.raises(InputErrors) as info:
        load_customization(path, env={})
    fields = [e.field for e in info.value.errors]
    assert fields == ["ca_certificates[0]", "ca_certificates[1]", "registries.ok.example:5000.password_env"]
    assert all(e.source == str(path) for e in info.value.errors)


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ("{password: p}", "a password needs a username"),
        ("{username: u, password: p, password_env: P}", "one way only"),
        ("{username: u, password_env: 'A B'}", "environment variable name"),
        ("{identitytoken: t, identitytoken_file: f}", "one way only"),
        ("{username: u, token: t}", "unknown field"),
    ],
)
def test_registry_credentials_are_given_one_way(tmp_path: Path, registry: str, message: str) -> None:
    with pytest.raises(InputErrors) as info:
        load_customization(write(tmp_path, f"registries:\n  r.example: {registry}\n"), env={})
    assert message in "\n".join(str(e) for e in info.value.errors)


@pytest.mark.parametrize(
    "hostile",
    [
        "user: {name: 'root; rm -rf /'}",
        "user: {name: '../../etc'}",
        "user: {ssh_public_key: 'ssh-ed25519 AAAA\\nssh-ed25519 BBBB'}",
        "user: {ssh_public_key: 'command=\"sh\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJxsROT0JCyLLJsjFpJDQa+hZLU4m'}",
        "packages: ['jq; curl evil']",
        "packages: ['-oDir::Etc=/tmp']",
        "registries: {'evil.example/../x': {}}",
        "registries: {'host\\n  auth: x': {}}",
    ],
)
def test_hostile_values_are_refused(tmp_path: Path, hostile: str) -> None:
    with pytest.raises(InputErrors):
        load_customization(write(tmp_path, hostile + "\n"), env={})


@given(st.text(max_size=200))
def test_the_key_parser_returns_one_clean_line_or_refuses(text: str) -> None:
    try:
        key = _public_key(text)
    except ValueError:
        return
    kind, blob = key.split(" ")
    assert "\n" not in key and kind in text and blob in text


# --- the cloud-init documents (spec 4.8 steps 2 and 3) -------------------------------------------------------------


def test_role_variables_hold_no_secret_and_safe_certificate_names(tmp_path: Path) -> None:
    make_ca(tmp_path / "../ca name;$(x).pem".replace("../", ""))
    path = write(
        tmp_path,
        """
ca_certificates: ["ca name;$(x).pem"]
registries:
  registry.local:5000: {username: robot, password_env: REG_PASSWORD}
  other.local: {identitytoken: "tok-MARK-1"}
packages: [jq]
""",
    )
    c = load_customization(path, env={"REG_PASSWORD": "pw-MARK-2"})
    role = c.role_vars(user="builder")
    text = repr(role)
    assert "MARK" not in text
    [ca] = role["customize_ca_certificates"]
    # our name on the node: the file's stem made safe, and the bundle's digest (customizing again converges; a second
    # customization's same-named CA lands beside the first)
    assert re.fullmatch(r"image-builder-ca-name-x--[0-9a-f]{12}\.crt", ca["name"]), ca["name"]
    again = load_customization(path, env={"REG_PASSWORD": "x"}).role_vars(user="b")
    assert again["customize_ca_certificates"][0]["name"] == ca["name"]
    assert role["customize_registries"] == ["registry.local:5000", "other.local"]
    env = c.secret_env()
    auth = {r["host"]: r for r in __import__("json").loads(env["IMAGE_BUILDER_REGISTRY_AUTH"])}
    assert auth["registry.local:5000"]["password"] == "pw-MARK-2"
    assert base64.b64decode(auth["registry.local:5000"]["auth"]).decode() == "robot:pw-MARK-2"
    assert auth["other.local"]["identitytoken"] == "tok-MARK-1"
    assert set(c.secret_values()) >= {"pw-MARK-2", "tok-MARK-1"}


@given(
    user=st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True) | st.sampled_from(["yes", "no", "null", "on", "y"]),
    hostname=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True) | st.sampled_from(["true", "off", "no"]),
)
def test_any_valid_user_and_hostname_render_to_exactly_themselves(user: str, hostname: str) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHBsy6ISxdwfSJP1mjm9GeBDtpPT1Lcw1NlsoOLLHWs2"
    docs = seed_documents(user, [key], hostname=hostname)
    assert yaml.safe_load(docs.meta_data)["local-hostname"] == hostname
    (entry,) = yaml.safe_load(docs.user_data)["users"]
    assert entry["name"] == entry["primary_group"] == user and entry["ssh_authorized_keys"] == [key]


# --- image.customize: what is checked before a VM boots ------------------------------------------------------------
