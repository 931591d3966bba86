"""OpenSCAP's scan of a system offline: the image's root filesystem mounted read-only (``oscap-chroot``), evaluated
on the tailored profile, with the ARF results, an HTML report and a short summary written beside the image.

The pass rate is over the rules that apply: those that passed, against those that passed or failed (OpenSCAP's
own count). Rules it could not decide offline (error, unknown), rules that do not apply, are not checked
automatically (manual ones) or are informational are counted apart. A hardened build fails when the rate is under
its threshold, naming the failing rules."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.untrusted import xml_elements
from imagebuilder.hardening.model import NAME, RULE_PREFIX

#: the results that count as applicable, and of those the ones that pass. ``error`` and ``unknown`` are counted apart
#: as undecided: offline, OpenSCAP cannot ask a running system (its services, its loaded modules), and a rule it
#: could not decide is neither passed nor failed (the pass rate is OpenSCAP's own: pass / (pass + fail))
APPLICABLE = ("pass", "fixed", "fail")
PASSED = ("pass", "fixed")
UNDECIDED = ("error", "unknown")


@dataclass(frozen=True)
class Evidence:
    """The scan's files beside an image: ``<stem>.hardening-arf.xml``, ``-report.html``, ``.json``."""

    arf: Path
    report: Path
    summary: Path

    @classmethod
    def beside(cls, stem: Path) -> Evidence:
        return cls(stem.with_name(stem.name + ".hardening-arf.xml"),
                   stem.with_name(stem.name + ".hardening-report.html"),
                   stem.with_name(stem.name + ".hardening.json"))  # fmt: skip


@dataclass(frozen=True)
class ScanResult:
    profile_id: str
    counts: dict[str, int]
    failing: tuple[str, ...]
    evidence: Evidence | None = None
    #: the rules OpenSCAP could not decide offline
    undecided: tuple[str, ...] = ()

    @property
    def applicable(self) -> int:
        return sum(self.counts.get(r, 0) for r in APPLICABLE)

    @property
    def passed(self) -> int:
        return sum(self.counts.get(r, 0) for r in PASSED)

    @property
    def pass_rate(self) -> float:
        return round(100.0 * self.passed / self.applicable, 1) if self.applicable else 0.0

    def describe(self) -> str:
        c = self.counts
        return (f"{self.pass_rate}% of the applicable rules pass: {self.passed} pass, {c.get('fail', 0)} fail;"
                f" {len(self.undecided)} undecided offline, {c.get('notapplicable', 0)} do not"
                f" apply, {c.get('notchecked', 0)} not checked automatically")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile_id, "pass_rate": self.pass_rate, "applicable": self.applicable,
                "passed": self.passed, "counts": dict(sorted(self.counts.items())), "failing": list(self.failing),
                "undecided": list(self.undecided)}  # fmt: skip


def read_results(arf: Path) -> tuple[dict[str, int], tuple[str, ...], tuple[str, ...]]:
    """The count of each result in an ARF file, the rules that failed and those OpenSCAP could not decide (short
    names)."""
    counts: Counter[str] = Counter()
    failing: list[str] = []
    undecided: list[str] = []
    try:
        for element in xml_elements(arf, "}rule-result", "OpenSCAP's results"):
            result = next((c.text or "" for c in element if c.tag.endswith("}result")), "").strip()
            counts[result] += 1
            if result in ("fail", *UNDECIDED):
                short = str(element.get("idref", "")).removeprefix(RULE_PREFIX)
                named = short if NAME.fullmatch(short) else "(a rule with an unreadable id)"
                (failing if result == "fail" else undecided).append(named)
    except InputError as exc:
        raise ExternalError(f"OpenSCAP's results cannot be read: {exc}") from None
    return dict(counts), tuple(sorted(failing)), tuple(sorted(undecided))


def scan_root(root: Path, datastream: Path, profile_id: str, tailoring: Path | None, evidence: Evidence) -> ScanResult:
    """Evaluate the system whose root filesystem is mounted at ``root``; the evidence files are written atomically
    (a failed scan leaves none)."""
    oscap_chroot = require_tools("oscap-chroot")["oscap-chroot"]
    work = evidence.arf.with_name(f".{evidence.arf.name}.scan")
    work.mkdir(parents=True, exist_ok=True)
    try:
        arf, report = work / "arf.xml", work / "report.html"
        args = [oscap_chroot, str(root), "xccdf", "eval", "--profile", profile_id,
                *(["--tailoring-file", str(tailoring)] if tailoring else []),
                "--results-arf", str(arf), "--report", str(report), str(datastream)]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=3600)
        # 0: every rule passed, 2: some failed; anything else is OpenSCAP's own failure
        if proc.returncode not in (0, 2) or not arf.is_file():
            raise ExternalError(f"OpenSCAP's scan failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}",
                                hint="run the same oscap-chroot command by hand to see why")  # fmt: skip
        counts, failing, undecided = read_results(arf)
        result = ScanResult(profile_id, counts, failing, evidence, undecided)
        for src, dest in ((arf, evidence.arf), (report, evidence.report)):
            with atomic_write(dest, "wb") as fh:
                fh.write(src.read_bytes())
        with atomic_write(evidence.summary) as fh:
            fh.write(json.dumps(result.to_json(), indent=2) + "\n")
        return result
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
