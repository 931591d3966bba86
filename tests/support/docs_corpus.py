"""What the in-process tests (tests/unit/test_build_docs_corpus.py) and the integration tests
(tests/integration/test_build_docs_corpus.py) of build docs corpus share."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.common import reference
from tests.support.inproc import cli

#: file -> (os, provider, fields the verbatim example is refused for; "json" for a syntax error)
VERDICTS: dict[str, tuple[str, str, set[str]]] = {
    # its empty optional fields are "not set" (template, resource_pool, the booleans): only the required ones
    "vsphere.json": ("ubuntu", "vsphere", {"vcenter_server", "username", "password", "datacenter", "datastore",
                                           "network", "folder", "cluster"}),
    "baremetal-rhel.json": ("redhat", "baremetal", {"iso_url", "iso_checksum_type", "extra_rpms"}),
    "ami.json": ("ubuntu", "ami", {"json"}),
    "nutanix.json": ("ubuntu", "nutanix", {"image_url", "image_export", "nutanix_endpoint"}),
    "proxy.json": ("ubuntu", "baremetal", {"http_proxy", "https_proxy", "no_proxy"}),
    "proxy-extra-packages.json": ("ubuntu", "baremetal", {"json"}),
    "satellite.json": ("redhat", "baremetal", {"rhsm_server_hostname", "rhsm_server_release_version", "iso_url",
                                               "iso_checksum"}),
    "airgapped.json": ("ubuntu", "baremetal", {"extra_repos", "iso_url", "iso_checksum"}),
    "files.json": ("ubuntu", "baremetal", {"json"}),
}  # fmt: skip


def dry_run(os_name: str, provider: str, path: Path, *extra: str) -> Any:
    flag = "--files-config" if path.name.startswith("files") else f"--{provider}-config"
    return cli("build", "--os", os_name, "--hypervisor", provider, "--release-channel", "1-24", "--offline",
               "--dry-run", flag, str(path), *extra)  # fmt: skip


def fixed(name: str) -> str:
    """The docs' JSON with its slips mended: a trailing comma, a '...' entry, '#' comments."""
    text = reference("build-docs", name).read_text()
    text = re.sub(r",(\s*)}", r"\1}", text)
    text = re.sub(r",\s*\.\.\.\s*", "", text)
    text = re.sub(r'("[^"]*")\s*#[^\n]*', r"\1,", text)
    return re.sub(r",(\s*)}", r"\1}", text)
