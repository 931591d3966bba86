"""A hardened build's part, as the build runs it (:class:`Hardening`): before the image is provisioned, the
content for the image's OS, the node's tailoring and the remediation; in the chroot, the remediation (the command
:meth:`Hardening.command` gives the chroot build); after, the scan of the finished disk and its verdict.

The content's product is read from the image itself (its os-release, with debugfs: no mount), not from the
build's OS name: the demo's "ubuntu" image is made from a Debian base, and the scan must judge what is there."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.attest.provenance import Dependency
from imagebuilder.core import disk
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.hostinfo import parse_os_release, tool_search_path
from imagebuilder.core.progress import Say, silent
from imagebuilder.hardening.content import Content, available_content, check_profile, check_source_profile, content_for
from imagebuilder.hardening.model import HardeningRequest, installed_os_release, load_settings, product_of
from imagebuilder.hardening.remediate import Remediation, node_playbook, remediation_playbook
from imagebuilder.hardening.scan import Evidence, ScanResult, scan_root
from imagebuilder.hardening.tailoring import Tailoring, write_tailoring
from imagebuilder.image.bootcheck import debugfs

#: how many failing rules a failed verdict names in its message (the summary file names them all)
SHOWN_FAILURES = 12


def disk_os_release(raw: Path) -> dict[str, str]:
    """The os-release of the root filesystem of the raw disk ``raw``, read with debugfs (no mount, no root)."""
    part = disk.root_partition(raw)
    for path in ("/usr/lib/os-release", "/etc/os-release"):
        found = parse_os_release(debugfs(raw, part, f"cat {path}").stdout[:65536].decode("utf-8", "replace"))
        if found.get("ID"):
            return found
    return {}


@dataclass
class Hardening:
    """One build's hardening: ``stem`` is the image's output path without its extension (the evidence's names)."""

    request: HardeningRequest
    stem: Path
    #: the build's mirror: its data stream is used when it carries one
    mirror: Mirror | None = None
    content: Content | None = None
    title: str | None = None
    tailoring: Tailoring | None = None
    remediation: Remediation | None = None
    scan: ScanResult | None = None

    def choose(self, raw: Path, source: str | Path, say: Say = silent) -> str:
        """The content and the tailoring for the OS on the raw disk ``raw`` (``source`` names it in errors): exit
        2 for a disk without an os-release, an OS the content has no product for, or a profile its product lacks.
        Returns the product."""
        release = disk_os_release(raw)
        if not release:
            raise InputError("the image has no os-release in its root filesystem", source=source,
                             expected="a Linux system image")  # fmt: skip
        return self._choose_product(product_of(release, source), say)

    def _choose_product(self, product: str, say: Say) -> str:
        self.content = content_for(product, self.request.content, mirror=self.mirror, say=say)
        self.title = check_profile(self.content, self.request.profile)
        self.tailoring = write_tailoring(self.request, self.content, self.tailoring_path)
        return product

    def prepare(self, raw: Path, directory: Path, say: Say = silent) -> None:
        """Everything the remediation needs, for the OS on the disk ``raw`` (before it is provisioned)."""
        self._remediation(self.choose(raw, "the source image", say), directory, say)

    def prepare_packer(self, source: Path | None, os_name: str, os_version: str, directory: Path,
                       say: Say = silent) -> Path:  # fmt: skip
        """A Packer build's part before its VM starts: the content, the tailoring and the remediation for the OS of
        the source image ``source`` (its os-release), or for the OS an ISO installs (``os_name`` ``os_version``,
        the catalog's), and the playbook Packer's Ansible runs instead of the node's: the node's provisioning, the
        remediation, the node's finish. Returns that playbook."""
        if source is not None:
            with disk.raw_view(source, work_dir=directory) as raw:
                product = self.choose(raw, source, say)
        else:
            product = self._choose_product(product_of(installed_os_release(os_name, os_version), os_name), say)
        remediation = self._remediation(product, directory, say)
        return node_playbook(directory / "node-hardened.yml", remediation)

    def _remediation(self, product: str, directory: Path, say: Say) -> Path:
        assert self.content is not None and self.tailoring is not None
        self.remediation = remediation_playbook(self.request, self.content, self.tailoring,
                                                directory / f"hardening-{self.request.profile}.yml")  # fmt: skip
        say(f"hardening: {self.request.profile} ({self.title}) for {product}: {self.remediation.tasks} tasks,"
            f" {len(self.tailoring.turned_off)} rules tailored out for a node,"
            f" {len(self.remediation.dropped)} tasks left out as they act on the running system")  # fmt: skip
        return self.remediation.path

    @property
    def tailoring_path(self) -> Path:
        return self.stem.with_name(self.stem.name + ".hardening-tailoring.xml")

    def command(self, root: Path, playbook_args: list[str]) -> list[str]:
        """The command the chroot build runs for the remediation: ``playbook_args`` (the node playbook's command
        line, its playbook last) with the remediation's playbook instead, in a mount namespace of its own where the
        image's /proc/sys and /sys are read-only."""
        assert self.remediation is not None
        unshare = shutil.which("unshare", path=tool_search_path()) or "unshare"
        return [unshare, "--mount", "--propagation", "private", sys.executable, "-m", "imagebuilder.hardening.apply",
                str(root), "--", *playbook_args[:-1], str(self.remediation.path)]  # fmt: skip

    def scan_root(self, root: Path, say: Say = silent) -> ScanResult:
        """Scan the system mounted (read-only) at ``root``; the evidence is written beside :attr:`stem`."""
        assert self.content is not None and self.tailoring is not None
        say(f"scanning {self.stem.name} with OpenSCAP ({self.request.profile}, tailored for a node)")
        self.scan = scan_root(root, self.content.datastream, self.tailoring.profile_id, self.tailoring.path,
                              Evidence.beside(self.stem))  # fmt: skip
        return self.scan

    def check(self, image: Path, work_dir: Path, say: Say = silent) -> ScanResult:
        """Scan the finished disk ``image``. Fails (exit 1) naming the failing rules when the pass rate is under
        the threshold."""
        with disk.raw_view(image, work_dir=work_dir) as raw, disk.mounted_root(raw) as root:
            scan = self.scan_root(root, say)
        say(f"hardening scan: {scan.describe()}")
        verdict(scan, self.request.min_pass)
        return scan

    def dependencies(self) -> list[Dependency]:
        """The provenance's resolved dependencies this hardening adds: the data stream and the tailoring."""
        assert self.content is not None and self.tailoring is not None
        settings = load_settings().content
        uri = f"https://{settings.module}/releases/tag/{settings.version}" if self.request.content is None else None
        return [Dependency(f"hardening-content:{self.content.datastream.name}", {"sha256": self.content.sha256}, uri),
                Dependency(f"hardening-tailoring:{self.tailoring.path.name}",
                           {"sha256": self.tailoring.sha256})]  # fmt: skip

    def record(self) -> dict[str, Any]:
        """What the build manifest records."""
        assert self.content and self.tailoring and self.remediation
        evidence = self.scan.evidence if self.scan else None
        return {
            "profile": self.request.profile, "title": self.title, "tailored_profile": self.tailoring.profile_id,
            "min_pass": self.request.min_pass, "content": self.content.to_json(),
            "tailoring": {"name": self.tailoring.path.name, "sha256": self.tailoring.sha256,
                          "turned_off": self.tailoring.turned_off},
            "remediation": {"tasks": self.remediation.tasks, "sha256": self.remediation.sha256,
                            "left_out": list(self.remediation.dropped)},
            "scan": self.scan.to_json() if self.scan else None,
            "evidence": [p.name for p in (evidence.arf, evidence.report, evidence.summary)] if evidence else [],
        }  # fmt: skip


def verdict(scan: ScanResult, min_pass: float) -> None:
    """Exit 1 naming the failing rules when ``scan``'s pass rate is under ``min_pass``."""
    if scan.pass_rate >= min_pass:
        return
    shown = ", ".join(scan.failing[:SHOWN_FAILURES]) + (" ..." if len(scan.failing) > SHOWN_FAILURES else "")
    where = scan.evidence.report if scan.evidence else None
    raise ExternalError(
        f"the hardening scan passes {scan.pass_rate}% of the applicable rules, under the"
        f" {min_pass:g}% asked for; failing: {shown}",
        hint=f"read {where} for each rule's finding (--hardening-min-pass sets the threshold)",
    )


def check_ahead(request: HardeningRequest, source: Path, *, mirror: Mirror | None = None,
                work_dir: Path | None = None) -> str:  # fmt: skip
    """A dry run's look at what the real run checks before provisioning: the source image's product (its
    os-release) and the profile in the content (the user's folder's data stream, the mirror's, the cached one, or
    the profile file of the content's source release, downloaded from the Go module proxy without building it).
    Returns what was checked."""
    with disk.raw_view(source, work_dir=work_dir) as raw:
        product = product_of(disk_os_release(raw), source)
    content = available_content(product, request.content, mirror)
    if content is not None:
        title = check_profile(content, request.profile)
        return f"hardening: {request.profile} ({title}) in {content.origin}, for {product} (the image's os-release)"
    origin = check_source_profile(product, request.profile)
    return (
        f"hardening: {request.profile} is a {product} profile of {origin}; its data stream is built on the real"
        " run (about two minutes, then cached)"
    )


def scan_any_image(image: Path, request: HardeningRequest, evidence_stem: Path, *, work_dir: Path | None = None,
                   say: Say = silent) -> tuple[ScanResult, Content]:  # fmt: skip
    """``image.verify --hardening``: any image, ours or not, scanned the way a hardened build scans its own (its
    tailoring and evidence beside ``evidence_stem``)."""
    hardening = Hardening(request, evidence_stem)
    with disk.raw_view(image, work_dir=work_dir) as raw:
        hardening.choose(raw, image, say)
        with disk.mounted_root(raw) as root:
            result = hardening.scan_root(root, say)
    assert hardening.content is not None
    return result, hardening.content
