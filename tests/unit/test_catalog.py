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


def test_the_specs_historic_releases_stay_reachable_explicitly() -> None:
    """1-21 .. 1-24 default to the distro's current releases; the spec's numbers are named explicitly."""
    historic = {"1-21": ("v1.21.14", 22), "1-22": ("v1.22.16", 15), "1-23": ("v1.23.14", 10), "1-24": ("v1.24.8", 5)}
    for line, (version, number) in historic.items():
        for value in (f"{line}-eks-{number}", f"kubernetes-{line}-eks-{number}"):
            ch = catalog.channel(value)
            assert (ch.name, ch.kubernetes_version, ch.release) == (line, version, number), value
            assert ch.release_name == f"kubernetes-{line}-eks-{number}"
            assert ch.runtime == catalog.channel(line).runtime and ch.support == catalog.channel(line).support
    assert (
        catalog.channel("1-24-eks-5").manifest_url
        == "https://distro.eks.amazonaws.com/kubernetes-1-24/kubernetes-1-24-eks-5.yaml"
    )
    assert catalog.channel("1-24").manifest_url.endswith("/kubernetes-1-24/kubernetes-1-24-eks-36.yaml")
    assert catalog.channel("1-36-eks-7") == catalog.channel("1-36"), "the current release named explicitly"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1-24-eks-6", "one of 1-24-eks-5, 1-24-eks-36"),  # a release the catalog does not know: not guessed
        ("1-24-ek-5", "is not a release of line 1-24"),
        ("kubernetes-1-99-eks-1", "not a supported release channel"),
        ("1-24-eks-5\n", "not a supported release channel"),
        ("1-24-eks-" + "9" * 40, "not a supported release channel"),
        ("../1-24-eks-5", "not a supported release channel"),
    ],
)
def test_a_release_the_catalog_does_not_know_is_refused_with_the_ones_it_does(value: str, says: str) -> None:
    with pytest.raises(InputError) as exc:
        catalog.channel(value)
    assert says in str(exc.value) and exc.value.field == "--release-channel", str(exc.value)
    assert "\n" not in str(exc.value).split(":", 1)[0] + (exc.value.expected or "")


def test_the_distros_current_lines() -> None:
    """Release numbers and Kubernetes versions as aws/eks-distro publishes them (RELEASE and GIT_TAG per line)."""
    got = {c.name: (c.kubernetes_version, c.release) for c in catalog.channels.values()}
    assert got == {
        "1-18": ("v1.18.20", 17), "1-19": ("v1.19.16", 22), "1-20": ("v1.20.15", 22), "1-21": ("v1.21.14", 28),
        "1-22": ("v1.22.17", 28), "1-23": ("v1.23.17", 33), "1-24": ("v1.24.17", 36),
        "1-25": ("v1.25.16", 40), "1-26": ("v1.26.15", 39), "1-27": ("v1.27.16", 41), "1-28": ("v1.28.15", 66),
        "1-29": ("v1.29.15", 60), "1-30": ("v1.30.14", 59), "1-31": ("v1.31.14", 48), "1-32": ("v1.32.13", 41),
        "1-33": ("v1.33.13", 31), "1-34": ("v1.34.9", 22), "1-35": ("v1.35.6", 13), "1-36": ("v1.36.2", 7),
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


@pytest.mark.parametrize("bad", ["1.38", "124", "1-17", "", "v1-24", "1.24.8"])
def test_bad_channels_list_the_valid_ones(bad: str) -> None:
    with pytest.raises(InputError) as exc:
        catalog.channel(bad)
    assert "1-18, 1-19, 1-20, 1-21, 1-22, 1-23, 1-24, 1-25" in str(exc.value) and "1-36" in str(exc.value)


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
    assert catalog.channel_for_kubernetes("1.36").name == "1-36"
    with pytest.raises(InputError):
        catalog.channel_for_kubernetes("1.37")


def test_each_line_says_how_long_it_is_supported_by_the_stated_rule() -> None:
    """config/release-channels.yaml's rule: supported while the distro lists the line and upstream patches its minor
    (the three newest, 1.35..1.37), extended while only the distro does (1-30..1-34), end of life after."""
    support = {c.name: c.support for c in catalog.channels.values()}
    assert {n for n, s in support.items() if s == "supported"} == {"1-35", "1-36"}
    assert {n for n, s in support.items() if s == "extended"} == {"1-30", "1-31", "1-32", "1-33", "1-34"}
    assert all(support[f"1-{m}"] == "end-of-life" for m in range(18, 30))
    assert catalog.channel("1-24").support_warning and "end of life" in str(catalog.channel("1-24").support_warning)
    assert catalog.channel("1-36").support_warning is None and catalog.channel("1-30").support_warning is None


def test_each_line_carries_the_runtime_the_references_bundle_names() -> None:
    """The reference's main bundle: containerd v1.7.28 for 1-30..1-33, v2.1.4 for 1-34, v2.2.1 for 1-35, v2.3.1 for
    1-36, cri-tools v1.36.0 everywhere; read here from the bundle itself."""
    import yaml

    from tests.support.common import reference

    bundle = yaml.safe_load(reference("eksa", "main-bundle-release.yaml").read_text())
    for entry in bundle["spec"]["versionsBundles"]:
        eksd = entry["eksD"]
        line = catalog.channel(eksd["channel"])
        assert f"/containerd/{line.runtime.containerd}/" in eksd["containerd"]["uri"], (line.name, line.runtime)
        assert f"/cri-tools/{line.runtime.crictl}/" in eksd["crictl"]["uri"], (line.name, line.runtime)
    assert {c.name: c.runtime.config_version for c in catalog.channels.values()
            if c.name >= "1-33"} == {"1-33": 2, "1-34": 3, "1-35": 3, "1-36": 4}  # fmt: skip
    assert catalog.runtime_for_minor(37) == catalog.channel("1-36").runtime  # newer than every line: the newest's
    assert catalog.runtime_for_minor(12) == catalog.channel("1-18").runtime


@pytest.mark.parametrize(
    ("containerd", "minor", "refused"),
    [("v1.7.28", 36, True), ("1.6.20", 37, True), ("v2.0.0", 36, False), ("v1.7.28", 35, False),
     ("v2.3.1", 30, False), ("nonsense", 30, True)],
)  # fmt: skip
def test_a_runtime_that_cannot_run_the_lines_kubernetes_is_named(containerd: str, minor: int, refused: bool) -> None:
    from imagebuilder.release.catalog import runtime_problem

    problem = runtime_problem(containerd, minor)
    assert (problem is not None) == refused, problem
