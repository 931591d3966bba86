"""The rules of a build request hold wherever it comes from (issue 61): the library refuses what the command line
refuses, and the flags build and build.matrix share are declared once."""

from __future__ import annotations

import inspect

import pytest

from imagebuilder.builder.ci_emit import CiOptions
from imagebuilder.cli import build as build_tasks
from imagebuilder.core.errors import InputError
from imagebuilder.plan.model import BuildRequest
from imagebuilder.plan.request import arch_configs, check_matrix, config_files, matrix_pairs


def test_a_published_pipeline_signs_whoever_makes_its_options() -> None:
    with pytest.raises(InputError, match="must be signed") as exc:
        CiOptions(publish="s3://bucket/prefix", sign=False)
    assert exc.value.field == "--ci-publish"
    assert CiOptions(publish="s3://bucket/prefix", sign=True).publish == "s3://bucket/prefix"


def test_one_manifest_is_one_channel_in_the_library_too() -> None:
    from imagebuilder.builder.matrix import expand

    request = BuildRequest(os=None, hypervisor=None, release_channel=None, release_manifest="m.yaml", offline=True)
    with pytest.raises(InputError, match="one release manifest names one release") as exc:
        expand(request, [("ubuntu", "baremetal")], ["1-35", "1-36"])
    assert exc.value.field == "--release-manifest"
    check_matrix("m.yaml", ["1-36"])  # one channel: the manifest's
    check_matrix(None, ["1-35", "1-36"])


def test_pairs_or_oses_times_providers_never_both() -> None:
    assert matrix_pairs([], ["ubuntu", "redhat"], ["baremetal"]) == [("ubuntu", "baremetal"), ("redhat", "baremetal")]
    assert matrix_pairs(["ubuntu:vsphere"], [], []) == [("ubuntu", "vsphere")]
    with pytest.raises(InputError, match="both list what to build"):
        matrix_pairs(["ubuntu:vsphere"], ["ubuntu"], [])
    with pytest.raises(InputError, match="is not os:provider"):
        matrix_pairs(["ubuntu"], [], [])


def test_a_config_per_architecture_and_a_provider_given_once() -> None:
    assert arch_configs("bm.json,arm64=bm-arm64.json", "--baremetal-config") == {None: "bm.json",
                                                                                 "arm64": "bm-arm64.json"}  # fmt: skip
    assert arch_configs("a,b.json", "--baremetal-config") == {None: "a,b.json"}  # a path with a comma is a path
    with pytest.raises(InputError, match="did you mean 'arm64'"):
        arch_configs("bm.json,aarch64=x.json", "--baremetal-config")
    configs, per_arch = config_files({"platform": "vs.json", "baremetal": "bm.json,arm64=a.json"})
    assert configs == {"vsphere": "vs.json", "baremetal": "bm.json"} and per_arch == {"arm64": {"baremetal": "a.json"}}
    with pytest.raises(InputError, match="given twice"):
        config_files({"vsphere": "a.json", "platform": "b.json"})


def test_the_shared_flags_are_declared_once_for_both_tasks() -> None:
    for task in (build_tasks.build, build_tasks.matrix):
        parameters = inspect.signature(task.body).parameters
        assert set(build_tasks.SHARED) <= set(parameters), task.name
        assert all(parameters[name].default == default for name, default in build_tasks.SHARED.items())
    source = inspect.getsource(build_tasks)
    assert source.count("vsphere_config: str | None") == 0, "a shared flag is declared in a signature by hand"
