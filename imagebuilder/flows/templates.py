"""vSphere templates, as ``template.import`` and ``template.customize`` run them: every input checked before the
session opens (each local OVA read whole, the customization file, the tools), then one session that plans and, unless
it is a dry run, acts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.progress import Say, Transfers, silent
from imagebuilder.customization.model import Customization, load_customization
from imagebuilder.image.ova import check_ova
from imagebuilder.release.catalog import OperatingSystem, ReleaseChannel
from imagebuilder.vsphere import apply_customization, templates
from imagebuilder.vsphere.apply_customization import CustomizeOptions
from imagebuilder.vsphere.connection import Target
from imagebuilder.vsphere.session import connect
from imagebuilder.vsphere.templates import ImportEntry, Outcome, Placement


@dataclass
class TemplateRun:
    """What a template flow planned (each template's path and steps) and, unless a dry run, did."""

    plan: list[tuple[str, list[str]]]
    outcomes: list[Outcome] = field(default_factory=list)
    #: vCenter API calls made: (total, SOAP, REST)
    calls: tuple[int, int, int] = (0, 0, 0)


def import_templates(
    target: Target,
    entries: list[ImportEntry],
    where: Placement,
    *,
    jobs: int = 4,
    dry_run: bool = False,
    transfers: Transfers | None = None,
) -> TemplateRun:
    """OVAs as tagged templates (spec 3): every local OVA is read whole before anything is created on vCenter, then
    the imports are planned in one session and, unless ``dry_run``, made ``jobs`` at a time."""
    for entry in entries:
        if "://" not in entry.source:
            check_ova(Path(entry.source))
    with connect(target, f"importing {entries[0].source}") as vs:
        reqs = templates.plan_imports(vs, entries, where)
        run = TemplateRun([(req.path, templates.plan_text(req)) for req in reqs])
        if not dry_run:
            run.outcomes = templates.import_templates(vs, reqs, jobs, transfers)
        run.calls = (vs.calls.total, vs.calls.soap, vs.calls.rest)
    return run


def customize_template(
    target: Target,
    template: str,
    os: OperatingSystem,
    channel: ReleaseChannel,
    file: Path,
    options: CustomizeOptions,
    *,
    dry_run: bool = False,
    say: Say = silent,
) -> TemplateRun:
    """A customized template (spec 4.8): the customization file, the new name and the tools are checked first; then
    the clone is planned in one session and, unless ``dry_run``, made, customized over SSH, sealed and templated."""
    customization: Customization = load_customization(file)
    if options.name:
        templates.check_name(options.name)
    require_tools("ssh", "ssh-keygen", "ansible-playbook")
    with connect(target, f"customizing {template}") as vs:
        req = apply_customization.plan_customize(vs, template=template, os=os, channel=channel, options=options)
        run = TemplateRun([(f"{req.path} (from {req.template})", apply_customization.plan_text(req, customization))])
        if not dry_run:
            run.outcomes = [apply_customization.customize_template(vs, req, customization, say)]
        run.calls = (vs.calls.total, vs.calls.soap, vs.calls.rest)
    return run
