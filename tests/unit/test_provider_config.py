"""Every rule of the provider config models, positive and negative (spec 2.3, 7.3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.core.errors import InputErrors
from imagebuilder.plan.config import (
    BuildExtras,
    ConfigContext,
    ProviderConfig,
    json_schema,
    load_provider_config,
    validate_provider_config,
)
from imagebuilder.providers.registry import config_models
from imagebuilder.release.catalog import load_catalog
from tests.support.common import EXAMPLES, PAIRS

MODELS = config_models()

catalog = load_catalog()
SHA256 = "a" * 64


def ctx(os_name: str, source: Path = EXAMPLES / "x.json", version: str | None = None) -> ConfigContext:
    return ConfigContext(os=os_name, os_version=catalog.os(os_name).version(version), source=source)


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    return data


def ok(provider: str, os_name: str, data: dict[str, Any], **kw: Any) -> ProviderConfig:
    return validate_provider_config(MODELS[provider], data, ctx(os_name, **kw))


def problems(provider: str, os_name: str, data: dict[str, Any], **kw: Any) -> dict[str, str]:
    """field -> message of every problem reported for ``data``."""
    with pytest.raises(InputErrors) as exc:
        validate_provider_config(MODELS[provider], data, ctx(os_name, **kw))
    return {e.field or "": str(e) for e in exc.value.errors}


@pytest.mark.parametrize(("pair", "config"), [(p, c) for p, c in PAIRS.items() if c])
def test_examples_are_valid(pair: tuple[str, str], config: str) -> None:
    os_name, provider = pair
    cfg = load_provider_config(MODELS[provider], EXAMPLES / config, ctx(os_name, EXAMPLES / config))
    assert cfg.provider == provider


def test_every_provider_and_os_that_needs_a_config_has_an_example() -> None:
    for pair in catalog.builds:
        if pair.config == "required":
            assert PAIRS[(pair.os.name, pair.provider.name)], pair


# --- vsphere ---------------------------------------------------------------------------------------------------


def test_vsphere_has_the_14_spec_fields() -> None:
    extra = {*MODELS["vsphere"].os3_fields, "source_image_url", "source_image_checksum", "template"}  # type: ignore[attr-defined]
    extra |= set(BuildExtras.model_fields)  # the reference tool's build options, shared by every provider
    assert set(MODELS["vsphere"].model_fields) - extra == {
        "cluster",
        "convert_to_template",
        "create_snapshot",
        "datacenter",
        "datastore",
        "folder",
        "insecure_connection",
        "linked_clone",
        "network",
        "username",
        "password",
        "resource_pool",
        "platform_server",
        "platform_library_name",
    }


def test_vsphere_booleans_normalised() -> None:
    data = example("vsphere-ubuntu.json") | {"linked_clone": True, "insecure_connection": "true"}
    cfg = ok("vsphere", "ubuntu", data)
    assert cfg.public_dict()["linked_clone"] == "true"
    assert cfg.public_dict()["create_snapshot"] == "true"
    assert cfg.public_dict()["convert_to_template"] == "false"


@pytest.mark.parametrize("bad", ["yes", "True", "1", 1, None])
def test_vsphere_bad_booleans(bad: Any) -> None:
    got = problems("vsphere", "ubuntu", example("vsphere-ubuntu.json") | {"linked_clone": bad})
    assert "linked_clone" in got
    assert '"true" or "false"' in got["linked_clone"]


def test_vsphere_aliases_of_the_reference_tool() -> None:
    data = example("vsphere-ubuntu.json")
    data["vcenter_server"] = data.pop("platform_server")
    data["vsphere_library_name"] = data.pop("platform_library_name")
    cfg = ok("vsphere", "ubuntu", data)
    assert cfg.public_dict()["platform_server"] == "vcenter.example.com"
    assert cfg.public_dict()["platform_library_name"] == "image-builder"


def test_vsphere_field_given_twice() -> None:
    data = example("vsphere-ubuntu.json") | {"vcenter_server": "other.example.com"}
    got = problems("vsphere", "ubuntu", data)
    assert "given twice" in got["vcenter_server"]


def test_unknown_key_did_you_mean() -> None:
    data = example("vsphere-ubuntu.json") | {"datastor": "x", "nonsense_key_zz": 1}
    got = problems("vsphere", "ubuntu", data)
    assert "did you mean 'datastore'" in got["datastor"]
    assert "unknown field" in got["nonsense_key_zz"]


def test_vsphere_missing_fields_all_reported_with_file_and_expectation() -> None:
    got = problems("vsphere", "ubuntu", {"username": "u"})
    for field in ("platform_server", "password", "datacenter", "datastore", "network", "folder"):
        assert field in got, field
        assert "required field is missing" in got[field]
        assert "x.json" in got[field]
    assert "(expected vCenter FQDN or IP)" in got["platform_server"]
    assert "cluster" in got


def test_vsphere_cluster_or_resource_pool() -> None:
    data = example("vsphere-ubuntu.json")
    ok("vsphere", "ubuntu", {k: v for k, v in data.items() if k != "cluster"})
    ok("vsphere", "ubuntu", {k: v for k, v in data.items() if k != "resource_pool"})
    got = problems("vsphere", "ubuntu", {k: v for k, v in data.items() if k not in ("cluster", "resource_pool")})
    assert "neither cluster nor resource_pool" in got["cluster"]


@pytest.mark.parametrize("server", ["https://vc.example.com", "vc..example", "-bad.example.com", ""])
def test_vsphere_server_must_be_host(server: str) -> None:
    assert "platform_server" in problems(
        "vsphere", "ubuntu", example("vsphere-ubuntu.json") | {"platform_server": server}
    )


@pytest.mark.parametrize("server", ["10.0.0.5", "vc.example.com", "vcenter", "fd00::1"])
def test_vsphere_server_ip_or_fqdn(server: str) -> None:
    ok("vsphere", "ubuntu", example("vsphere-ubuntu.json") | {"platform_server": server})


def test_non_string_value_rejected() -> None:
    assert (
        "must be a string"
        in problems("vsphere", "ubuntu", example("vsphere-ubuntu.json") | {"datacenter": 5})["datacenter"]
    )


# --- OS-3 fields -----------------------------------------------------------------------------------------------


OS3 = {
    "iso_url": "https://mirror.example.com/rhel.iso",
    "iso_checksum": SHA256,
    "iso_checksum_type": "sha256",
    "enterprise_username": "u",
    "enterprise_password": "p",
}


@pytest.mark.parametrize("provider", ["vsphere", "cloudstack", "baremetal"])
def test_os3_fields_required_for_redhat(provider: str) -> None:
    base = example("vsphere-ubuntu.json") if provider == "vsphere" else {}
    got = problems(provider, "redhat", base)
    for field in ("iso_url", "iso_checksum", "enterprise_username", "enterprise_password"):
        assert "required for --os redhat" in got[field]
    ok(provider, "redhat", base | OS3)


def test_subscription_fields_rejected_for_ubuntu_but_its_own_iso_is_not() -> None:
    got = problems("vsphere", "ubuntu", example("vsphere-ubuntu.json") | OS3)
    assert "applies only to --os redhat" in got["enterprise_username"]
    assert "iso_url" not in got  # the reference's air-gapped example gives an Ubuntu build its own ISO
    iso = {k: v for k, v in OS3.items() if k.startswith("iso_")}
    ok("vsphere", "ubuntu", example("vsphere-ubuntu.json") | iso)
    assert (
        "go together"
        in problems("vsphere", "ubuntu", example("vsphere-ubuntu.json") | {"iso_url": OS3["iso_url"]})["iso_checksum"]
    )


def test_os3_aliases() -> None:
    data = dict(OS3)
    data["rhel_username"] = data.pop("enterprise_username")
    data["rhel_password"] = data.pop("enterprise_password")
    cfg = ok("baremetal", "redhat", data)
    assert cfg.public_dict()["enterprise_username"] == "u"
    assert cfg.public_dict()["enterprise_password"] == "********"


def test_iso_checksum_matches_type() -> None:
    assert "64 hex digits" in problems("baremetal", "redhat", OS3 | {"iso_checksum": "abc"})["iso_checksum"]
    got = problems("baremetal", "redhat", OS3 | {"iso_checksum_type": "sha512"})
    assert "128 hex digits" in got["iso_checksum"]
    ok("baremetal", "redhat", OS3 | {"iso_checksum_type": "sha512", "iso_checksum": "b" * 128})
    assert "iso_checksum_type" in problems("baremetal", "redhat", OS3 | {"iso_checksum_type": "md5"})
    cfg = ok("baremetal", "redhat", {k: v for k, v in OS3.items() if k != "iso_checksum_type"})
    assert cfg.public_dict()["iso_checksum_type"] == "sha256"


def test_iso_url_https_or_existing_file(tmp_path: Path) -> None:
    # http is what the reference's air-gapped example uses: iso_checksum (always required) guards the download
    assert ok("baremetal", "redhat", OS3 | {"iso_url": "http://mirror.example.com/x.iso"})
    assert "iso_url" in problems("baremetal", "redhat", OS3 | {"iso_url": "ftp://mirror.example.com/x.iso"})
    assert "does not exist" in problems("baremetal", "redhat", OS3 | {"iso_url": "missing.iso"})["iso_url"]
    iso = tmp_path / "rhel.iso"
    iso.write_bytes(b"\0" * 10)
    cfg = ok("baremetal", "redhat", OS3 | {"iso_url": "rhel.iso"}, source=tmp_path / "bm.json")
    assert cfg.public_dict()["iso_url"] == str(iso)


def test_extra_packages_per_os_on_every_provider() -> None:
    cfg = ok("baremetal", "redhat", OS3 | {"extra_rpms": "  kmod-foo   lldpad "})
    assert cfg.public_dict()["extra_rpms"] == "kmod-foo lldpad"
    assert "extra_rpms" in problems("baremetal", "redhat", OS3 | {"extra_rpms": "bad;rm -rf"})
    assert "only to --os redhat" in problems("baremetal", "ubuntu", {"extra_rpms": "foo"})["extra_rpms"]
    assert "only to --os ubuntu" in problems("baremetal", "redhat", OS3 | {"extra_debs": "foo"})["extra_debs"]
    # the reference reads them from every provider's config, not only bare metal's
    ok("vsphere", "redhat", example("vsphere-redhat.json") | {"extra_rpms": "wget"})
    ok("cloudstack", "redhat", example("cloudstack-redhat.json") | {"extra_rpms": "wget"})
    ok("baremetal", "ubuntu", {"extra_debs": "wget nfs-common"})


def test_baremetal_ubuntu_empty_config() -> None:
    ok("baremetal", "ubuntu", {})


# --- cloudstack ------------------------------------------------------------------------------------------------


def test_cloudstack_access_fields_all_or_none() -> None:
    cfg = ok("cloudstack", "redhat", dict(OS3))
    assert not cfg.registers_template  # type: ignore[attr-defined]
    got = problems("cloudstack", "redhat", OS3 | {"cloudstack_zone": "z1"})
    assert {"cloudstack_api_url", "cloudstack_api_key", "cloudstack_secret_key"} <= set(got)
    assert "cloudstack_api_url" in problems(
        "cloudstack", "redhat", example("cloudstack-redhat.json") | {"cloudstack_api_url": "ftp://x"}
    )
    full = ok("cloudstack", "redhat", example("cloudstack-redhat.json"))
    assert full.registers_template  # type: ignore[attr-defined]
    assert full.public_dict()["cloudstack_secret_key"] == "********"


# --- ami -------------------------------------------------------------------------------------------------------


def test_ami_has_the_13_spec_fields() -> None:
    assert len(set(MODELS["ami"].model_fields) - set(BuildExtras.model_fields)) == 13


def test_ami_defaults() -> None:
    cfg = ok("ami", "ubuntu", {}).public_dict()
    assert cfg["image_filter_name"] == "ubuntu/images/*ubuntu-focal-20.04-amd64-server-*"
    assert cfg["image_filter_owners"] == "679593333241"
    assert cfg["builder_instance_type"] == "t3.small"
    assert cfg["cloud_region"] == "us-west-2"
    assert cfg["image_regions"] == ["us-west-2"]
    assert cfg["volume_size"] == 25
    assert cfg["volume_type"] == "gp3"
    jammy = ok("ami", "ubuntu", {}, version="22.04").public_dict()
    assert "jammy-22.04" in jammy["image_filter_name"]


def test_ami_aliases_and_region_string() -> None:
    cfg = ok(
        "ami",
        "ubuntu",
        {
            "ami_filter_name": "x*",
            "ami_filter_owners": "amazon",
            "ami_regions": "us-east-1, eu-west-1",
            "aws_region": "us-east-1",
        },
    ).public_dict()
    assert cfg["image_filter_name"] == "x*"
    assert cfg["image_regions"] == ["us-east-1", "eu-west-1"]
    assert cfg["cloud_region"] == "us-east-1"


def test_ami_custom_roles_mutually_exclusive(tmp_path: Path) -> None:
    got = problems(
        "ami", "ubuntu", {"custom_role": "true", "custom_role_names": "a", "custom_role_name_list": [str(tmp_path)]}
    )
    assert "mutually exclusive" in got["custom_role_names"]
    assert "custom_role" in problems("ami", "ubuntu", {"custom_role": "true"})
    ok("ami", "ubuntu", {"custom_role": "true", "custom_role_names": "a b"})
    ok("ami", "ubuntu", {"custom_role": "true", "custom_role_name_list": [str(tmp_path)]})
    assert "not absolute" in problems("ami", "ubuntu", {"custom_role_name_list": ["rel/role"]})["custom_role_name_list"]
    assert (
        "does not exist"
        in problems("ami", "ubuntu", {"custom_role_name_list": [str(tmp_path / "no")]})["custom_role_name_list"]
    )


def test_ami_extra_vars(tmp_path: Path) -> None:
    vars_file = tmp_path / "vars.yaml"
    vars_file.write_text("a: 1\n")
    ok("ami", "ubuntu", {"config_mgmt_extra_vars": f"@{vars_file}"})
    assert "config_mgmt_extra_vars" in problems("ami", "ubuntu", {"config_mgmt_extra_vars": str(vars_file)})
    assert "ansible_extra_vars" in problems("ami", "ubuntu", {"ansible_extra_vars": "@relative.yaml"})
    assert (
        "does not exist"
        in problems("ami", "ubuntu", {"config_mgmt_extra_vars": f"@{tmp_path}/no.yaml"})["config_mgmt_extra_vars"]
    )


def test_ami_manifest_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGE_BUILDER_WORKSPACE", str(tmp_path / "ws"))
    ok("ami", "ubuntu", {"manifest_output": str(tmp_path / "manifest.json")})
    assert "absolute" in problems("ami", "ubuntu", {"manifest_output": "manifest.json"})["manifest_output"]
    got = problems("ami", "ubuntu", {"manifest_output": str(tmp_path / "ws" / "b1" / "manifest.json")})
    assert "build workspace" in got["manifest_output"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("volume_size", "0"),
        ("volume_size", "-5"),
        ("volume_size", "big"),
        ("volume_size", 2.5),
        ("volume_type", "ssd"),
        ("image_regions", ["us-west-2", "Mars"]),
        ("image_regions", 5),
        ("cloud_region", "uswest2"),
        ("builder_instance_type", "small"),
        ("image_filter_owners", "someone"),
        ("root_device_name", "sda1"),
    ],
)
def test_ami_bad_values(field: str, value: Any) -> None:
    assert field in problems("ami", "ubuntu", {field: value})


def test_ami_numbers_as_strings_or_numbers() -> None:
    assert ok("ami", "ubuntu", {"volume_size": 40}).public_dict()["volume_size"] == 40
    assert ok("ami", "ubuntu", {"volume_size": "40"}).public_dict()["volume_size"] == 40


# --- nutanix ---------------------------------------------------------------------------------------------------


def test_nutanix_fields_and_aliases() -> None:
    # the spec's 9, and the reference's image_url and image_export
    assert set(MODELS["nutanix"].model_fields) - set(BuildExtras.model_fields) >= {"image_url", "image_export"}
    assert len(set(MODELS["nutanix"].model_fields) - set(BuildExtras.model_fields)) == 11
    data = example("nutanix-ubuntu.json")
    renamed = {("nutanix_" + k[4:] if k.startswith("hci_") else k): v for k, v in data.items()}
    assert ok("nutanix", "ubuntu", renamed).public_dict() == ok("nutanix", "ubuntu", data).public_dict()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hci_port", "0"),
        ("hci_port", "65536"),
        ("hci_port", "http"),
        ("hci_insecure", "no"),
        ("hci_endpoint", "https://x"),
    ],
)
def test_nutanix_bad_values(field: str, value: Any) -> None:
    assert field in problems("nutanix", "ubuntu", example("nutanix-ubuntu.json") | {field: value})


def test_nutanix_port_default() -> None:
    data = {k: v for k, v in example("nutanix-ubuntu.json").items() if k != "hci_port"}
    assert ok("nutanix", "ubuntu", data).public_dict()["hci_port"] == 9440


# --- secrets and schema ----------------------------------------------------------------------------------------


def test_secrets_masked_and_listed() -> None:
    cfg = ok(
        "vsphere", "redhat", example("vsphere-redhat.json") | {"password": "pw-123", "enterprise_password": "rh-9"}
    )
    text = json.dumps(cfg.public_dict())
    assert "pw-123" not in text and "rh-9" not in text
    assert sorted(cfg.secret_values()) == ["pw-123", "rh-9"]


@pytest.mark.parametrize("provider", list(MODELS))
def test_json_schema(provider: str) -> None:
    schema = json_schema(MODELS[provider])
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(MODELS[provider].model_fields) <= set(schema["properties"])


def test_errors_name_the_key_as_written() -> None:
    data = example("vsphere-ubuntu.json")
    data["vcenter_server"] = "https://vc.example.com"
    del data["platform_server"]
    got = problems("vsphere", "ubuntu", data)
    assert "vcenter_server" in got
    assert "not a URL" in got["vcenter_server"]
    got = problems("ami", "ubuntu", {"ami_regions": ["us-west-2", "Mars"]})
    assert "ami_regions[1]" in got or "ami_regions" in got


# --- OS-2 source image and the local OVA ------------------------------------------------------------------------


def test_source_image_for_ubuntu(tmp_path: Path) -> None:
    image = tmp_path / "base.qcow2"
    image.write_bytes(b"QFI")
    src = {"source_image_url": "base.qcow2", "source_image_checksum": "A" * 64}
    cfg = ok("baremetal", "ubuntu", src, source=tmp_path / "bm.json")
    assert cfg.public_dict()["source_image_url"] == str(image)
    assert cfg.public_dict()["source_image_checksum"] == "sha256:" + "a" * 64
    ok("baremetal", "ubuntu", src | {"source_image_checksum": "sha512:" + "b" * 128}, source=tmp_path / "bm.json")
    assert "source_image_checksum" in problems("baremetal", "ubuntu", {"source_image_url": "https://x/y.img"})
    assert "source_image_url" in problems("baremetal", "ubuntu", {"source_image_checksum": "a" * 64})
    assert "source_image_checksum" in problems(
        "baremetal", "ubuntu", src | {"source_image_checksum": "md5:abc"}, source=tmp_path / "bm.json"
    )
    assert "does not exist" in problems("baremetal", "ubuntu", src)["source_image_url"]
    remote = {"source_image_url": "https://images.example.com/base.qcow2", "source_image_checksum": "a" * 64}
    assert "applies only to --os ubuntu" in problems("baremetal", "redhat", OS3 | remote)["source_image_url"]


def test_local_ova_needs_no_vcenter(tmp_path: Path) -> None:
    (tmp_path / "base.qcow2").write_bytes(b"QFI")
    src = {"source_image_url": "base.qcow2", "source_image_checksum": "a" * 64}
    cfg = ok("vsphere", "ubuntu", src, source=tmp_path / "vs.json")
    assert cfg.is_local  # type: ignore[attr-defined]
    remote = ok("vsphere", "ubuntu", example("vsphere-ubuntu.json"))
    assert not remote.is_local  # type: ignore[attr-defined]
    # with a vCenter server, every vCenter field is required again
    got = problems("vsphere", "ubuntu", src | {"platform_server": "vc.example.com"}, source=tmp_path / "vs.json")
    assert {"username", "password", "datacenter", "datastore", "network", "folder", "cluster"} <= set(got)


@pytest.mark.parametrize(("pair", "config"), [(p, c) for p, c in PAIRS.items() if c])
def test_an_empty_optional_field_is_not_set(pair: tuple[str, str], config: str) -> None:
    """The reference tool's "": every optional field of every provider config given as "" (or blank) validates to
    the same config as the field left out; a required field given "" is refused, naming it."""
    os_name, provider = pair
    model = MODELS[provider]
    data = example(config)
    base = ok(provider, os_name, data)
    accepted = model.accepted_keys()
    optional = [k for k, name in accepted.items() if k == name and k not in data]
    assert optional, "every config has optional fields"
    for key in optional:
        for blank in ("", "  "):
            try:
                same = ok(provider, os_name, {**data, key: blank})
            except InputErrors as exc:  # a field that only some builds take (a RHEL field on ubuntu) stays refused
                assert all("empty" not in str(e) for e in exc.errors), (key, exc)
                continue
            assert same == base, key
    for key in [k for k in data if k in accepted]:
        emptied = {**data, key: ""}
        try:
            ok(provider, os_name, emptied)
        except InputErrors as exc:  # refused: the error names the field (as empty, or as a rule it now breaks)
            assert key in {e.field for e in exc.errors}, exc
            assert all("required field is missing" not in str(e) for e in exc.errors if e.field == key), exc
