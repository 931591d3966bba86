"""user.yaml through the one validation layer (issue 47): nested strict models with the checks of each value, the
checks across values after them, and every problem named by its field as the file spells it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuilder.core.errors import InputErrors
from imagebuilder.vsphere.userconfig import load_user_config
from tests.support.common import EXAMPLES


def problems(tmp_path: Path, **spec: Any) -> list[tuple[str | None, str]]:
    data = yaml.safe_load((EXAMPLES / "vsphere-user.yaml").read_text())
    data["spec"].update(spec)
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputErrors) as err:
        load_user_config(path)
    assert all(e.source == str(path) for e in err.value.errors)
    return [(e.field, e.detail) for e in err.value.errors]


def test_the_example_reads_with_the_profiles_defaults() -> None:
    config = load_user_config(EXAMPLES / "vsphere-user.yaml")
    assert config.datacenter and config.server and config.networks and "@" in config.principal


def test_values_are_checked_each_by_its_field(tmp_path: Path) -> None:
    found = problems(tmp_path, username="a b", adminRole="ReadOnly", vSphereDomain="-bad-",
                     connection={"server": "vc.example.com", "insecure": "yes"},
                     objects={"networks": ["/DC0/vm/x", 5], "datastores": "/DC0/datastore/d", "resourcePools": [],
                              "folders": [], "templates": [], "vms": []})  # fmt: skip
    fields = [f for f, _ in found]
    assert fields == ["spec.username", "spec.adminRole", "spec.vSphereDomain", "spec.connection.insecure",
                      "spec.objects.networks[0]", "spec.objects.networks[1]", "spec.objects.datastores",
                      "spec.objects.vms"], found  # fmt: skip
    assert dict(found)["spec.connection.insecure"] == "got 'yes'"
    assert dict(found)["spec.objects.vms"].startswith("unknown field")


def test_checks_across_values_run_once_each_value_is_good(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "vsphere-user.yaml").read_text())
    dc = data["spec"]["datacenter"]
    found = problems(tmp_path, userRole="same", adminRole="same",
                     objects={**data["spec"]["objects"], "networks": [f"/{dc}x/network/n"]})  # fmt: skip
    assert found == [
        ("spec.userRole", "'same' is also adminRole: the three roles hold different privileges"),
        ("spec.objects.networks[0]", f"'/{dc}x/network/n' is not in datacenter '{dc}'"),
    ]
