"""Static checks of the Packer bundle: every buildable pair rendered from config/examples, then Packer's own
``validate`` and ``fmt -check``. Run by ``invoke lint`` and by the test suite."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.builder.packer import EXTERNAL_ONLY, RenderedBuild, fmt_check, render_build, validate
from imagebuilder.builder.packer_plugins import PLUGINS, PackerInfo, prepare_plugins
from imagebuilder.builder.resolve import make_plan
from imagebuilder.core.arch import ARCH_NAMES
from imagebuilder.core.hostinfo import KvmStatus
from imagebuilder.core.paths import config_dir
from imagebuilder.core.progress import Say, silent
from imagebuilder.plan.model import BuildRequest
from imagebuilder.release.catalog import load_catalog

#: linting renders without probing KVM (the accelerator does not change what Packer validates)
LINT_KVM = KvmStatus(False, "not probed for linting")
#: another architecture's build starts from a disk image of it (image.base --arch): linting names one it never reads
LINT_SOURCE = "https://images.example/{arch}/base.qcow2"


@dataclass(frozen=True)
class LintResult:
    os: str
    provider: str
    arch: str
    rendered: RenderedBuild
    validate_ok: bool
    syntax_only: bool
    fmt_ok: bool
    output: str

    @property
    def ok(self) -> bool:
        return self.validate_ok and self.fmt_ok


def example_config(os_name: str, provider: str) -> Path | None:
    path = config_dir() / "examples" / f"{provider}-{os_name}.json"
    return path if path.is_file() else None


def render_pair(
    os_name: str, provider: str, directory: Path, packer: PackerInfo, arch: str = ARCH_NAMES[0]
) -> RenderedBuild:
    """The pair's build rendered from its example config; for another architecture than amd64, the example's fields
    with a source image of it (:data:`LINT_SOURCE`), as such a build needs."""
    config = example_config(os_name, provider)
    if arch != ARCH_NAMES[0]:
        fields = json.loads(config.read_text()) if config else {}
        fields.update(source_image_url=LINT_SOURCE.format(arch=arch), source_image_checksum="sha256:" + "0" * 64)
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / f"{provider}-{os_name}-{arch}.json"
        config.write_text(json.dumps(fields))
    plan = make_plan(
        BuildRequest(
            os=os_name,
            hypervisor=provider,
            release_channel=next(iter(load_catalog().channels)),
            configs={provider: str(config)} if config else {},
            offline=True,
            arch=arch,
            engine="packer",
        )
    )
    return render_build(plan, directory, packer, kvm=LINT_KVM, require_artifacts=False)


def lint_templates(
    workdir: Path, packer: PackerInfo | None = None, *, plugins: Path | None = None, say: Say = silent
) -> list[LintResult]:
    """Render every pair (for each architecture it is built for) and run ``packer validate`` and ``fmt -check`` on
    it. On Packer 1.7+ the plugins every template requires are checked first and the missing ones installed from
    ``plugins`` (``--packer-plugins``), else with ``packer init``: Packer validates a template only with its
    plugins."""
    packer = packer or PackerInfo.detect()
    pairs = load_catalog().builds
    prepare_plugins(packer, sorted(PLUGINS), binaries=plugins, say=say)
    results = []
    for pair, arch in ((p, a) for p in pairs for a in p.arches):
        os_name, provider = pair.os.name, pair.provider.name
        where = f"{os_name}-{provider}" + ("" if arch == ARCH_NAMES[0] else f"-{arch}")
        rendered = render_pair(os_name, provider, workdir / where, packer, arch)
        checked = validate(rendered, packer)
        fmt = fmt_check(rendered.template, packer)
        results.append(
            LintResult(
                os=os_name,
                provider=provider,
                arch=arch,
                rendered=rendered,
                validate_ok=checked.returncode == 0,
                syntax_only=rendered.builder in EXTERNAL_ONLY and not packer.has_plugin_blocks,
                fmt_ok=fmt.returncode == 0,
                output=(checked.stdout + checked.stderr + fmt.stdout + fmt.stderr).strip(),
            )
        )
    return results
