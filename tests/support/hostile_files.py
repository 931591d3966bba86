"""What the in-process tests (tests/unit/adversarial/test_files.py) and the integration tests
(tests/integration/adversarial/test_files.py) of files share."""

from __future__ import annotations

from tests.support.common import ROOT

EXAMPLES = ROOT / "config" / "examples"


def dhcp(**changes: object) -> str:
    import yaml

    data = yaml.safe_load((EXAMPLES / "dhcp.yaml").read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return yaml.safe_dump(data)


#: hostile values of the several-subnets form (issue 32): fixed leases and the inventory they come from
RACK = {"interface": "eth1", "subnet": "10.20.0.0/24", "range": {"start": "10.20.0.50", "end": "10.20.0.99"},
        "routers": ["10.20.0.1"]}  # fmt: skip


RACK_CASES: dict[str, dict[str, object]] = {
    "hostname with a block": {
        "fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": "10.20.0.5", "hostname": 'a"; }\nhost evil {'}]
    },
    "hostname with a JSON quote": {
        "fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": "10.20.0.5", "hostname": 'a", "ip-address": "10.20.0.1'}]
    },
    "mac with a statement": {"fixed_leases": [{"mac": "02:00:00:00:00:01; }", "ip": "10.20.0.5", "hostname": "a"}]},
    "fixed lease ip as a number": {"fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": 169083909, "hostname": "a"}]},
    "interface with a quote": {"subnets": [{**RACK, "interface": 'eth1"]'}]},
    # an alias label: the kernel takes no ':' in a name, and dhcpd -t refused it as a shared network's name
    "interface alias label": {
        "subnets": [{**RACK, "interface": "eth1:0"}, {**RACK, "interface": "eth1:0", "subnet": "10.21.0.0/24"}]
    },
    "interface dot-dot": {"subnets": [{**RACK, "interface": ".."}]},
    "csv that is not there": {"fixed_leases_csv": "no-such-hardware.csv"},
    "both forms": {"interface": "eth0"},
    "overlapping racks": {"subnets": [RACK, {**RACK, "subnet": "10.20.0.0/23"}]},
}
