"""What the in-process tests (tests/unit/adversarial/test_names.py) and the integration tests
(tests/integration/adversarial/test_names.py) of names share."""

from __future__ import annotations

import hashlib

import yaml

HOSTILE_NAMES = ["../../x", "/abs/x", "a/../../x", "..", ".", "", "a\0b", "a\nb", "x" * 300, "a/" + "b" * 256,
                 "a\\..\\..\\x", "./../x", "\x1b[31mred"]  # fmt: skip


def bundle(base: str, name: str, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    entry = {"amd": {"uri": f"{base}/hook.bin", "name": name, "sha256": sha}}
    hook = {"vmlinuz": entry, "initramfs": entry}
    doc = {"spec": {"versionsBundles": [{"tinkerbell": {"tinkerbellStack": {"hook": hook}}}]}}
    return yaml.safe_dump(doc)
