"""The runtime a line's images get when their release names none (issue 42): containerd, runc and crictl from their
projects' own releases at the catalog's versions, vouched for by the checksum files published beside them."""

from __future__ import annotations

import dataclasses
import hashlib
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError
from tests.support.runtime_cases import standin_upstream_runtime

# --- the checksum files as the projects publish them ------------------------------------------------------------

HEX = "0123456789abcdef"
digests = st.text(HEX, min_size=64, max_size=64)
names = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=60)


@given(digest=digests, name=names, star=st.booleans(), others=st.lists(st.tuples(digests, names), max_size=4))
def test_a_sums_line_naming_the_file_gives_its_digest(
    digest: str, name: str, star: bool, others: list[tuple[str, str]]
) -> None:
    lines = [f"{d}  {n}" for d, n in others if n != name] + [f"{digest} {'*' if star else ' '}{name}"]
    assert grammar.digest_in_sums("\n".join(lines) + "\n", name) == digest


@given(digest=digests, name=names)
def test_a_lone_digest_is_the_files_and_upper_case_reads_as_lower(digest: str, name: str) -> None:
    assert grammar.digest_in_sums(digest.upper() + "\n", name) == digest


@given(text=st.text(max_size=300), name=names)
def test_any_text_gives_a_digest_or_none_never_anything_else(text: str, name: str) -> None:
    got = grammar.digest_in_sums(text, name)
    assert got is None or (len(got) == 64 and set(got) <= set(HEX))


@pytest.mark.parametrize(
    "text",
    [
        "",
        f"{'a' * 64}  other.tar.gz\n",  # another file's line
        f"{'a' * 63}  runc.amd64\n",  # one digit short
        f"{'a' * 64}  runc.amd64x\n",
        f"{'a' * 64}\n{'b' * 64}\n",  # two lone digests: which one?
        f"{'g' * 64}  runc.amd64\n",
        "<html>Not Found</html>",
    ],
)
def test_a_sums_file_that_does_not_vouch_for_the_file_gives_none(text: str) -> None:
    assert grammar.digest_in_sums(text, "runc.amd64") is None


# --- the catalog's upstream runtime -------------------------------------------------------------------------------


def test_every_line_names_its_runtime_at_its_projects_releases() -> None:
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.upstream import upstream_files

    catalog = load_catalog()
    for channel in catalog.channels.values():
        parts = {p.name: p for p in upstream_files(channel.runtime)}
        assert set(parts) == {"containerd", "runc", "crictl"}
        c, version = parts["containerd"], channel.runtime.containerd
        tag = f"https://github.com/containerd/containerd/releases/download/{version}"
        assert c.url == f"{tag}/containerd-{version[1:]}-linux-amd64.tar.gz"
        assert c.sums_url == c.url + ".sha256sum" and c.kind == "archive"
        assert parts["runc"].kind == "binary" and parts["runc"].url.endswith(f"/{parts['runc'].version}/runc.amd64")
        assert parts["crictl"].url.endswith(f"/crictl-{channel.runtime.crictl}-linux-amd64.tar.gz")
    # the runc each line's containerd pins, as its source says (tests/integration/test_upstream_runtime.py reads it)
    pins = dict(catalog.upstream_runtime.runc_pins)
    assert pins["v2.3.1"] == "v1.4.2" and pins["v1.7.28"] == "v1.3.0"
    assert {p.version for p in upstream_files(catalog.channels["1-36"].runtime) if p.name == "runc"} == {"v1.4.2"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"upstream_runtime": {"containerd": {"url": "https://x/{version}", "sums": "{url}.sha256sum"}}},
         "upstream_runtime"),
        ({"upstream_runtime.runc.url": "http://github.com/{version}/runc.{arch}"}, "upstream_runtime.runc.url"),
        ({"upstream_runtime.runc.url": "https://h/{version}/runc.{home}"}, "upstream_runtime.runc.url"),
        ({"upstream_runtime.crictl.sums": "https://h/{version}/c\nInjected: 1"}, "upstream_runtime.crictl.sums"),
        ({"upstream_runtime.crictl.url": "{url}/crictl"}, "upstream_runtime.crictl.url"),
        ({"runc_pins": {"v1.7.28": "v1.3.0"}}, "runc_pins"),  # a line's containerd without a pin
        ({"runc_pins": {"v1.7.28": "1.3", "v2.1.4": "v1.3.0", "v2.2.1": "v1.3.4", "v2.3.1": "v1.4.2"}},
         "runc_pins"),
    ],
)  # fmt: skip
def test_a_broken_upstream_runtime_section_is_named_with_its_field(change: dict[str, object], field: str) -> None:
    import yaml

    from imagebuilder.core.paths import config_dir
    from imagebuilder.release.catalog import _upstream_runtime

    path = config_dir() / "release-channels.yaml"
    doc = yaml.safe_load(path.read_text())
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        target = doc
        for key in parents:
            target = target[key]
        target[last] = value
    with pytest.raises(InputError) as exc:
        _upstream_runtime(doc, path, {"v1.7.28", "v2.1.4", "v2.2.1", "v2.3.1"})
    assert exc.value.field == field and "\nInjected" not in str(exc.value)


# --- a build from the distro's manifest: planned with the line's upstream runtime -----------------------------


def _plan(mirror: Path, channel: str = "1-34", **kw: object) -> object:
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    return make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel=channel, offline=True,
                                  mirror=str(mirror), **kw))  # type: ignore[arg-type]  # fmt: skip


def test_a_release_without_a_runtime_gets_the_lines_own_from_upstream(tmp_path: Path) -> None:
    from imagebuilder.builder.packer import ansible_vars
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path, load_catalog().channel("1-34"))  # the distro's kind: no runtime in it
    data = standin_upstream_runtime(tmp_path, "1-34")
    plan = _plan(tmp_path)
    rt = plan.runtime  # type: ignore[attr-defined]
    assert (rt.source, rt.containerd, rt.runc, rt.crictl) == ("release", "v2.1.4", "v1.3.0", "v1.36.0")
    assert rt.config_version == 3 and "own releases" in rt.why
    got = {a.name: a for a in plan.artifacts if a.name in data}  # type: ignore[attr-defined]
    assert {n: a.sha256 for n, a in got.items()} == {n: hashlib.sha256(b).hexdigest() for n, b in data.items()}
    assert (got["containerd"].kind, got["runc"].kind, got["crictl"].kind) == ("archive", "binary", "archive")
    variables = ansible_vars(plan)  # type: ignore[arg-type]
    assert "runc" not in [b["name"] for b in variables["kubernetes_binaries"]], "the containerd role installs it"
    assert variables["kubernetes_runtime_binaries"] == ["runc"]
    assert "runc" in [s["stage"] for s in variables["kubernetes_stage_items"]], "checked with the others"
    # asked for, the OS's package: nothing of upstream's is staged
    os_plan = _plan(tmp_path, runtime="os")
    assert os_plan.runtime.source == "os" and not {"runc", "containerd"} & {a.name for a in os_plan.artifacts}  # type: ignore[attr-defined]  # fmt: skip


def test_a_mirror_without_the_lines_runtime_names_the_fix(tmp_path: Path) -> None:
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path, load_catalog().channel("1-34"))
    with pytest.raises(InputError) as exc:
        _plan(tmp_path)
    assert exc.value.field == "--mirror" and "mirror.create" in str(exc.value) and "--runtime os" in str(exc.value)


@pytest.mark.parametrize(
    "sums",
    [
        {"runc": f"{'a' * 64}  runc.arm64\n"},  # no line for this architecture
        {"containerd": "\x1b[31mnot a digest\x1b[0m " + "s3cr3t" * 40},
        {"crictl": ""},
    ],
)
def test_a_checksum_file_that_vouches_for_nothing_stops_the_build_without_quoting_it(
    tmp_path: Path, sums: dict[str, str]
) -> None:
    """As an unreachable manifest: the dry run shows the runtime unresolved and why, the real build stops (exit 1)
    before anything is written, and neither quotes the file."""
    from imagebuilder.builder.packer import check_buildable
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path, load_catalog().channel("1-34"))
    standin_upstream_runtime(tmp_path, "1-34", sums)
    plan = _plan(tmp_path)
    said = plan.runtime.unresolved  # type: ignore[attr-defined]
    assert "gives no SHA-256" in said and "s3cr3t" not in said and "\x1b" not in said
    assert "not resolved" in plan.runtime.describe()  # type: ignore[attr-defined]
    assert not {"containerd", "runc"} & {a.name for a in plan.artifacts}  # type: ignore[attr-defined]
    with pytest.raises(ExternalError, match="runtime's files are unknown") as exc:
        check_buildable(plan)  # type: ignore[arg-type]
    assert "s3cr3t" not in str(exc.value) and "--runtime os" in str(exc.value)


# --- a minor upstream has and the distro has not (1-37): built from release.build's release only -----------------


def test_a_minor_only_upstream_has_is_a_line_built_from_source_only(tmp_path: Path) -> None:
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import ReleaseRuntime, make_standin_release
    from tests.support.runtime_cases import REFERENCE, runtime_tarball

    catalog = load_catalog()
    newest = catalog.newest_channel()
    line = catalog.channel(f"1.{catalog.upstream_newest}")
    assert line.upstream_only and line.name == f"1-{catalog.upstream_newest}" and line.support == "supported"
    assert line.runtime == newest.runtime and line.os_versions == newest.os_versions
    for beyond in (f"1-{catalog.upstream_newest + 1}", "1-370", "1-"):
        with pytest.raises(InputError, match="not a supported release channel"):
            catalog.channel(beyond)
    with pytest.raises(InputError, match=r"release\.build") as exc:  # the distro has no manifest of it to fetch
        make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel=line.name, offline=True,
                               mirror=str(tmp_path)))  # fmt: skip
    assert exc.value.field == "--release-manifest"
    # a release of it (as release.build writes one: a runtime in it) is planned, on the newest line's OS versions
    containerd = runtime_tarball(tmp_path / "c.tar.gz", REFERENCE).read_bytes()
    runtime = ReleaseRuntime(containerd, b"crictl", "v2.3.1", "v1.4.2", "v1.36.0")
    version = f"v1.{catalog.upstream_newest}.2"
    as_written = dataclasses.replace(line, kubernetes_version=version, release=3, upstream_only=False)
    release = make_standin_release(tmp_path / "m", as_written, runtime)
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel=line.name, offline=True,
                                  mirror=str(tmp_path / "m"), release_manifest=release.manifest_url))  # fmt: skip
    assert plan.kubernetes_version == version and plan.runtime.containerd == "v2.3.1"
    assert plan.os_version.version in dict(newest.os_versions)["ubuntu"]
