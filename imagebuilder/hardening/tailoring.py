"""The node's tailoring: one XCCDF 1.2 tailoring file that turns off, in a profile, the rules a Kubernetes node
cannot live with (``config/hardening.yaml``), each with its reason as the selection's remark.

The remediation and the scan both read it, so what is applied and what is measured agree, and an auditor reads
why in the file itself. It is made with ElementTree, which escapes every value; its bytes depend only on the
profile, the rules the content has and the reasons (no time stamp: its digest is recorded and reproducible)."""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.files import atomic_write
from imagebuilder.core.untrusted import read_bytes
from imagebuilder.hardening.content import DATASTREAM_LIMIT, Content
from imagebuilder.hardening.model import RULE_PREFIX, HardeningRequest, load_settings

XCCDF = "http://checklists.nist.gov/xccdf/1.2"
TAILORING_ID = "xccdf_org.imagebuilder_tailoring_kubernetes_node"
#: a rule's id in a data stream (the rule element's ``id``, whatever the namespace prefix)
_RULE = re.compile(rb"<(?:[\w.-]+:)?Rule\s[^>]*?\bid=\"" + re.escape(RULE_PREFIX.encode()) + rb"([a-z0-9_.-]+)\"")


@dataclass(frozen=True)
class Tailoring:
    path: Path
    profile_id: str
    #: the rules turned off, each with its reason (only those the content has)
    turned_off: dict[str, str]
    #: the file's SHA-256 (the manifest and the provenance record it)
    sha256: str


def content_rules(content: Content) -> set[str]:
    """The short names of the rules the data stream defines."""
    data = read_bytes(content.datastream, "data stream", limit=DATASTREAM_LIMIT, field="--hardening-content")
    return {m.group(1).decode() for m in _RULE.finditer(data)}


def tailoring_document(request: HardeningRequest, content: Content, rules: set[str] | None = None,
                       reasons: dict[str, str] | None = None) -> bytes:  # fmt: skip
    """The tailoring file's bytes for ``request``'s profile in ``content`` (``rules``: the content's rules, read
    from it when not given; ``reasons``: each rule a node keeps, with its reason, config/hardening.yaml's when not
    given)."""
    have = content_rules(content) if rules is None else rules
    ET.register_namespace("xccdf", XCCDF)
    root = ET.Element(f"{{{XCCDF}}}Tailoring", {"id": TAILORING_ID})
    ET.SubElement(root, f"{{{XCCDF}}}benchmark", {"href": content.datastream.name})
    ET.SubElement(root, f"{{{XCCDF}}}version", {"time": "2026-12-07T00:00:00"}).text = "1"
    profile = ET.SubElement(root, f"{{{XCCDF}}}Profile", {"id": request.tailored_id, "extends": request.profile_id})
    ET.SubElement(profile, f"{{{XCCDF}}}title").text = f"{request.profile}, for a Kubernetes node"
    ET.SubElement(profile, f"{{{XCCDF}}}description").text = (
        f"The profile {request.profile} with the rules a Kubernetes node cannot live with turned off, each with its"
        " reason (image-builder's config/hardening.yaml).")  # fmt: skip
    for rule, reason in sorted((load_settings().reasons() if reasons is None else reasons).items()):
        if rule in have:
            select = ET.SubElement(profile, f"{{{XCCDF}}}select", {"idref": RULE_PREFIX + rule, "selected": "false"})
            ET.SubElement(select, f"{{{XCCDF}}}remark").text = reason
    ET.indent(root)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n").encode()


def write_tailoring(request: HardeningRequest, content: Content, dest: Path) -> Tailoring:
    """The tailoring file written atomically at ``dest``."""
    rules = content_rules(content)
    document = tailoring_document(request, content, rules)
    with atomic_write(dest, "wb") as fh:
        fh.write(document)
    reasons = load_settings().reasons()
    turned_off = {r: reasons[r] for r in sorted(reasons) if r in rules}
    return Tailoring(dest, request.tailored_id, turned_off, hashlib.sha256(document).hexdigest())
