"""What the in-process tests (tests/unit/test_preflight.py) and the integration tests
(tests/integration/test_preflight.py) of preflight share."""

from __future__ import annotations

from pathlib import Path

from imagebuilder.builder.packer_plugins import PackerInfo, PluginCheck, PluginState, Version, requirements_for
from imagebuilder.core.hostinfo import KvmStatus
from imagebuilder.host.preflight import GIB, HostFacts
from imagebuilder.release.catalog import load_catalog

catalog = load_catalog()


UBUNTU_BM = catalog.build_pair(catalog.os("ubuntu"), catalog.provider("baremetal"))


GOOD = HostFacts(
    os_release={"ID": "ubuntu", "VERSION_ID": "22.04", "PRETTY_NAME": "Ubuntu 22.04.4 LTS"},
    machine="x86_64",
    cpus=2,
    memory_bytes=int(7.7 * GIB),
    disk_path=Path("/var"),
    disk_free_bytes=60 * GIB,
    tools={"packer": "Packer v1.9.4", "ansible-playbook": "2.15", "ssh-keygen": "/usr/bin/ssh-keygen"},
    kvm=KvmStatus(True, "usable"),
    ssh_config="Host *\nHostKeyAlgorithms +ssh-rsa\nPubkeyAcceptedKeyTypes +ssh-rsa\n",
    packer=PluginCheck(
        PackerInfo("/usr/bin/packer", (1, 9, 4)),
        Path("/root/.config/packer/plugins"),
        (
            PluginState(requirements_for(["qemu"])[0], "installed", (Version.parse("1.1.4"),)),
            PluginState(requirements_for(["qemu"])[1], "installed", (Version.parse("1.1.6"),)),
        ),
    ),
)
