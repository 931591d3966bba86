"""The OS x provider x channel model: names, aliases, channels, the support matrix."""

from __future__ import annotations

import pytest

from imagebuilder.core.errors import InputError
from imagebuilder.release.catalog import load_catalog
from tests.support.common import PAIRS

catalog = load_catalog()


@pytest.mark.parametrize(
    ("value", "name"),
    [("ubuntu", "ubuntu"), ("os2", "ubuntu"), ("OS3", "redhat"), ("redhat", "redhat"), ("os1", "bottlerocket")],
)
def test_os_names_and_aliases(value: str, name: str) -> None:
    assert catalog.os(value).name == name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("vsphere", "vsphere"),
        ("platform", "vsphere"),
        ("orchestrator", "cloudstack"),
        ("hci", "nutanix"),
        ("baremetal", "baremetal"),
        ("ami", "ami"),
    ],
)
def test_provider_names_and_aliases(value: str, name: str) -> None:
    assert catalog.provider(value).name == name


def test_unknown_os_suggests() -> None:
    with pytest.raises(InputError) as exc:
        catalog.os("ubunt")
    assert "did you mean 'ubuntu'" in str(exc.value)
    assert exc.value.field == "--os"


def test_channels_match_the_spec() -> None:
    got = {c.name: (c.kubernetes_version, c.release, c.release_name) for c in catalog.channels.values()}
    assert {k: v for k, v in got.items() if k <= "1-24"} == {
        "1-21": ("v1.21.14", 22, "kubernetes-1-21-eks-22"),
        "1-22": ("v1.22.16", 15, "kubernetes-1-22-eks-15"),
        "1-23": ("v1.23.14", 10, "kubernetes-1-23-eks-10"),
        "1-24": ("v1.24.8", 5, "kubernetes-1-24-eks-5"),
    }
    assert (
        catalog.channel("1-24").manifest_url
        == "https://distro.eks.amazonaws.com/kubernetes-1-24/kubernetes-1-24-eks-5.yaml"
    )


def test_the_distros_current_lines() -> None:
    """Release numbers and Kubernetes versions as aws/eks-distro publishes them (RELEASE and GIT_TAG per line)."""
    got = {c.name: (c.kubernetes_version, c.release) for c in catalog.channels.values() if c.name >= "1-25"}
    assert got == {
        "1-25": ("v1.25.16", 40), "1-26": ("v1.26.15", 39), "1-27": ("v1.27.16", 41), "1-28": ("v1.28.15", 66),
        "1-29": ("v1.29.15", 60), "1-30": ("v1.30.14", 59), "1-31": ("v1.31.14", 48), "1-32": ("v1.32.13", 41),
        "1-33": ("v1.33.13", 31), "1-34": ("v1.34.9", 22), "1-35": ("v1.35.6", 13),
    }  # fmt: skip
    assert catalog.channel("1.34").release_name == "kubernetes-1-34-eks-22"


def test_each_channel_names_the_os_versions_it_builds() -> None:
    ubuntu, redhat = catalog.os("ubuntu"), catalog.os("redhat")
    assert catalog.channel("1-31").default_os_version(redhat) is None  # RHEL 8, the default, still built
    assert catalog.channel("1-32").default_os_version(redhat) == "9"
    assert catalog.channel("1-34").default_os_version(ubuntu) == "22.04"
    assert catalog.channel("1-24").default_os_version(ubuntu) is None
    with pytest.raises(InputError) as exc:
        catalog.channel("1-32").check_os_version("redhat", "8")
    assert exc.value.field == "--os-version" and "one of 9" in str(exc.value)
    catalog.channel("1-31").check_os_version("redhat", "8")


@pytest.mark.parametrize("bad", ["1.36", "124", "1-20", "", "v1-24", "1.24.8"])
def test_bad_channels_list_the_valid_ones(bad: str) -> None:
    with pytest.raises(InputError) as exc:
        catalog.channel(bad)
    assert "1-21, 1-22, 1-23, 1-24, 1-25" in str(exc.value)


def test_the_reference_tools_dotted_channel_is_the_same_channel() -> None:
    assert catalog.channel("1.24") is catalog.channel("1-24")


def test_exactly_the_seven_buildable_pairs() -> None:
    pairs = {(p.os.name, p.provider.name) for p in catalog.builds}
    assert pairs == set(PAIRS)
    for os_name in catalog.operating_systems:
        for provider in catalog.providers:
            ok = (os_name, provider) in PAIRS
            if ok:
                catalog.build_pair(catalog.os(os_name), catalog.provider(provider))
            else:
                with pytest.raises(InputError):
                    catalog.build_pair(catalog.os(os_name), catalog.provider(provider))


def test_bottlerocket_points_to_the_download_task() -> None:
    with pytest.raises(InputError) as exc:
        catalog.build_pair(catalog.os("os1"), catalog.provider("vsphere"))
    assert "download.bottlerocket" in str(exc.value)


def test_unsupported_pair_lists_valid_providers() -> None:
    with pytest.raises(InputError) as exc:
        catalog.build_pair(catalog.os("ubuntu"), catalog.provider("cloudstack"))
    assert "vsphere, baremetal, ami, nutanix" in str(exc.value)
    with pytest.raises(InputError) as exc:
        catalog.build_pair(catalog.os("redhat"), catalog.provider("nutanix"))
    assert "vsphere, baremetal, cloudstack" in str(exc.value)


def test_os_versions() -> None:
    ubuntu, redhat = catalog.os("ubuntu"), catalog.os("redhat")
    assert ubuntu.version(None).version == "20.04"
    assert ubuntu.version("22.04").version == "22.04"
    assert redhat.version(None).version == "8"
    with pytest.raises(InputError) as exc:
        ubuntu.version("18.04")
    assert "20.04, 22.04, 24.04" in str(exc.value)
    with pytest.raises(InputError):
        redhat.version("10")


@pytest.mark.parametrize(
    ("os_name", "version", "provider", "ok"),
    [
        ("ubuntu", "24.04", "baremetal", True),
        ("ubuntu", "24.04", "vsphere", True),
        ("ubuntu", "24.04", "nutanix", False),  # the reference builds 24.04 on bare metal and vSphere only
        ("ubuntu", "24.04", "ami", False),
        ("ubuntu", "22.04", "ami", True),
        ("redhat", "9", "vsphere", True),
        ("redhat", "9", "baremetal", True),
        ("redhat", "9", "cloudstack", True),
    ],
)
def test_os_versions_per_provider(os_name: str, version: str, provider: str, ok: bool) -> None:
    if ok:
        assert catalog.os(os_name).version_for(version, provider).version == version
        return
    with pytest.raises(InputError) as exc:
        catalog.os(os_name).version_for(version, provider)
    assert f"not {provider}" in str(exc.value) and "20.04, 22.04" in str(exc.value)


def test_config_need_per_pair() -> None:
    need = {(p.os.name, p.provider.name): p.config for p in catalog.builds}
    assert need.pop(("ubuntu", "baremetal")) == "optional"
    assert set(need.values()) == {"required"}


def test_kubernetes_version_to_channel() -> None:
    assert catalog.channel_for_kubernetes("1.24").name == "1-24"
    assert catalog.channel_for_kubernetes("v1.21").name == "1-21"
    with pytest.raises(InputError):
        catalog.channel_for_kubernetes("1.36")
