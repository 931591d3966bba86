"""``image.rebuild``: build an image again from what its provenance records, and say whether the bytes are the same.

Why: a provenance is the builder's claim about what made an image. With the chroot engine's reproducible images
(:mod:`imagebuilder.image.reproducible`) anyone holding the inputs can check the claim: the provenance records
every input by digest (the release manifest, the source image, each node artifact) and every choice the build made
(OS, provider, release line, firmware, disk size, runtime, the provider config's fields without secrets,
SOURCE_DATE_EPOCH and the filesystem's hash seed). The rebuild takes the inputs from the mirror (or where the
provenance says they were read), refuses an input it cannot find or whose digest differs, naming it, builds, and
compares the result with the provenance's subject digest.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuilder.attest import provenance
from imagebuilder.builder.chroot import Reproducible
from imagebuilder.core.arch import ARCH_NAMES
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.grammar import is_hex_digest
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.untrusted import printable
from imagebuilder.flows.build import prepare_build, run_build
from imagebuilder.image.diff import FileDifference, first_difference
from imagebuilder.plan.model import BuildRequest

if TYPE_CHECKING:
    from securesystemslib.signer import Key

    from imagebuilder.builder.runner import BuildResult
    from imagebuilder.plan.model import BuildPlan


@dataclass(frozen=True)
class Recorded:
    """What a provenance records of a build, checked to be enough for a rebuild."""

    subject: str
    sha256: str
    params: dict[str, Any]
    #: resolved dependency name -> (uri, where it was read from, sha256)
    inputs: dict[str, tuple[str | None, str | None, str | None]]


@dataclass(frozen=True)
class Rebuilt:
    """What :func:`rebuild` found: the expected digest, the rebuilt image and its digest, and where the two first
    differ (when they do and the original image is at hand)."""

    recorded: Recorded
    image: Path | None
    sha256: str | None
    build: BuildResult | None
    difference: FileDifference | None = None
    diffoscope: str | None = None

    @property
    def reproduced(self) -> bool:
        return self.sha256 == self.recorded.sha256


def _need(condition: bool, path: Path, detail: str, expected: str) -> None:
    if not condition:
        raise InputError(detail, source=path, field="--provenance", expected=expected)


def read_recorded(path: Path, public_key: Key | None = None) -> Recorded:
    """The build ``path`` records (exit 2 naming what is missing for a rebuild)."""
    statement = provenance.read_statement(path, public_key)
    subject = statement["subject"]
    _need(len(subject) == 1 and isinstance(subject[0], dict), path, "does not name one image",
          "the provenance of one image")  # fmt: skip
    name = subject[0].get("name")
    digests = subject[0].get("digest")
    digest = digests.get("sha256") if isinstance(digests, dict) else None
    _need(isinstance(name, str) and bool(name), path, "names no image", "subject[0].name")
    _need(isinstance(digest, str) and is_hex_digest(digest, "sha256"), path, "names no SHA-256 of its image",
          "subject[0].digest.sha256")  # fmt: skip
    definition = statement["predicate"].get("buildDefinition")
    definition = definition if isinstance(definition, dict) else {}
    params = definition.get("externalParameters")
    _need(isinstance(params, dict), path, "has no external parameters", "buildDefinition.externalParameters")
    assert isinstance(params, dict)
    _need(params.get("engine") == "chroot", path,
          f"records a build by the {printable(str(params.get('engine')), 40)} engine, whose images are not"
          " reproducible (a VM boot writes the run into them; image.diff tells what differs)",
          "the provenance of a chroot-engine build")  # fmt: skip
    _need(not params.get("hardening"), path,
          "records a hardened build, whose remediation installs packages from the OS's archive as it is that day"
          " (its AIDE database records the files of that moment): it is not rebuilt to the same bytes",
          "the provenance of a build without --hardening (a hardened image is checked by image.verify"
          " --hardening)")  # fmt: skip
    kinds: dict[str, tuple[type, ...]] = {"os": (str,), "provider": (str,), "release_channel": (str,),
                                          "source_date_epoch": (int,), "hash_seed": (str,), "runtime": (str,),
                                          "disk_gb": (int,)}  # fmt: skip
    for key, kind in kinds.items():
        _need(key in params, path, f"does not record {key}",
              "a provenance written by image-builder 0.1.2 or later (it records what a rebuild needs)")  # fmt: skip
        value = params[key]
        _need(isinstance(value, kind) and not isinstance(value, bool) and (not isinstance(value, int) or
              0 <= value < 2**32) and (not isinstance(value, str) or 0 < len(value) <= 100),
              path, f"records {key} as {printable(repr(value), 60)}", f"{key} as the build wrote it")  # fmt: skip
    for key in ("os_version", "firmware"):
        _need(params.get(key) is None or isinstance(params.get(key), str), path, f"records {key} oddly",
              f"{key} as a text")  # fmt: skip
    machine = params.get("arch", "amd64")  # provenance before issue 46 records none: its images are amd64
    _need(machine in ARCH_NAMES, path, f"records arch as {printable(repr(machine), 40)}", " or ".join(ARCH_NAMES))
    _need(isinstance(params.get("config", {}), dict), path, "records config oddly", "the config's fields")
    layered = params.get("layered", False)
    _need(isinstance(layered, bool), path, f"records layered as {printable(repr(layered), 40)}",
          "true (an image on its OS layer, build.matrix's) or false")  # fmt: skip
    inputs: dict[str, tuple[str | None, str | None, str | None]] = {}
    deps = definition.get("resolvedDependencies", [])
    for dep in deps if isinstance(deps, list) else []:
        if not isinstance(dep, dict) or not isinstance(dep.get("name"), str):
            continue
        notes, dep_digests = dep.get("annotations"), dep.get("digest")
        read_from = notes.get("readFrom") if isinstance(notes, dict) else None
        sha = dep_digests.get("sha256") if isinstance(dep_digests, dict) else None
        uri = dep.get("uri")
        inputs[dep["name"]] = (uri if isinstance(uri, str) else None, read_from if isinstance(read_from, str) else None,
                               sha if isinstance(sha, str) and is_hex_digest(sha, "sha256") else None)  # fmt: skip
    return Recorded(str(name), str(digest), params, inputs)


def _source_image(recorded: Recorded, given: Path | None, path: Path) -> Path:
    uri, _, digest = recorded.inputs.get("source-image", (None, None, None))
    _need(digest is not None, path, "names no source image by digest", "a source-image dependency")
    location = given or (Path(uri.removeprefix("file://")) if uri and "://" not in uri.removeprefix("file://")
                         else None)  # fmt: skip
    if location is None or not location.is_file():
        raise InputError(f"the source image {printable(str(uri), 200)} (sha256 {digest}) is not available here",
                         field="--source-image", expected="the source image file")  # fmt: skip
    got = sha256_file(location)
    if got != digest:
        raise InputError(f"{location} has sha256 {got}; the provenance records {digest}", field="--source-image",
                         expected="the source image the build started from")  # fmt: skip
    return location


def _config(recorded: Recorded, given: Path | None, source: Path, work: Path) -> Path:
    """The provider config the rebuild runs with: the given file (its digest must be one the provenance names), or
    one written from the recorded fields when the original held no secret."""
    digests = {d for n, (_, _, d) in recorded.inputs.items() if n.startswith("config:") and d}
    others = sorted(n for n in recorded.inputs if n.startswith("config:"))
    if given is not None:
        got = sha256_file(given)
        if got not in digests:
            raise InputError(f"has sha256 {got}; the provenance names {', '.join(sorted(digests)) or 'no config'}",
                             source=given, field="--config", expected="the config file the build read")  # fmt: skip
        return given
    secrets = recorded.params.get("config_secrets") or []
    if secrets:
        raise InputError(f"the build's config held secrets ({', '.join(map(str, secrets))}) the provenance does not"
                         " record", field="--config", expected="the config file the build read")  # fmt: skip
    if len(others) > 1:
        raise InputError(f"the build read {len(others)} config files ({', '.join(others)}); only the provider's is "
                         "recorded field by field", field="--config",
                         expected="a build without --customize or --files-config")  # fmt: skip
    config = dict(recorded.params.get("config") or {})
    config["source_image_url"] = str(source)
    out = work / f"{recorded.params['provider']}-config.json"
    with atomic_write(out) as fh:
        fh.write(json.dumps(config, indent=2) + "\n")
    return out


def _check_inputs(recorded: Recorded, plan: BuildPlan) -> None:
    """The release the rebuild resolved is the recorded one: the manifest and every node artifact by digest."""
    _, _, manifest = recorded.inputs.get("release-manifest", (None, None, None))
    if manifest and plan.manifest.sha256 != manifest:
        raise InputError(f"the release manifest {plan.manifest.source} has sha256 {plan.manifest.sha256}; the "
                         f"provenance records {manifest}", field="--mirror",
                         expected="the mirror of the release the build used")  # fmt: skip
    for artifact in plan.artifacts:
        _, _, want = recorded.inputs.get(f"{artifact.kind}:{artifact.name}", (None, None, None))
        if want and artifact.sha256 != want:
            raise InputError(f"{artifact.kind} {artifact.name} is {artifact.sha256} in this release; the provenance"
                             f" records {want}", field="--mirror", expected="the release the build used")  # fmt: skip


def _diffoscope(difference: FileDifference) -> str | None:
    """diffoscope's report of the first differing file's two copies, when diffoscope is installed."""
    tool = shutil.which("diffoscope")
    if tool is None or difference.copies is None:
        return None
    a, b = difference.copies
    proc = subprocess.run([tool, "--text", "-", str(a), str(b)], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    return proc.stdout[-20000:] or proc.stderr[-2000:]


def rebuild(
    path: Path,
    *,
    output_dir: Path,
    mirror: str | None = None,
    source_image: Path | None = None,
    config: Path | None = None,
    public_key: Key | None = None,
    dry_run: bool = False,
    say: Say = silent,
    status: Say = silent,
) -> Rebuilt:
    """Rebuild the image ``path`` (a provenance) records into ``output_dir`` and compare (see the module
    docstring). Bad or missing inputs exit 2 before anything is built."""
    recorded = read_recorded(path, public_key)
    params = recorded.params
    source = _source_image(recorded, source_image, path)
    manifest_uri, read_from, _ = recorded.inputs.get("release-manifest", (None, None, None))
    with tempfile.TemporaryDirectory(prefix=".image-rebuild-") as tmp:
        work = Path(tmp)
        provider_config = _config(recorded, config, source, work)
        request = BuildRequest(
            os=str(params["os"]),
            hypervisor=str(params["provider"]),
            release_channel=str(params["release_channel"]),
            os_version=str(params["os_version"]) if params.get("os_version") else None,
            configs={str(params["provider"]): str(provider_config)},
            release_manifest=manifest_uri if mirror or not read_from or not Path(read_from).exists() else read_from,
            mirror=mirror,
            output_dir=str(output_dir),
            offline=bool(mirror),
            disk_gb=int(params["disk_gb"]),
            firmware=str(params["firmware"]) if params.get("firmware") else None,
            engine="chroot",
            runtime=str(params["runtime"]),
            arch=str(params.get("arch", "amd64")),
        )
        prepared = prepare_build(request, dry_run=dry_run, say=say)
        _check_inputs(recorded, prepared.plan)
        if prepared.plan.output_name != recorded.subject:
            say(f"note: the rebuild is named {prepared.plan.output_name}, the provenance's image {recorded.subject}")
        if dry_run:
            return Rebuilt(recorded, None, None, None)
        reproducible = Reproducible(int(params["source_date_epoch"]), str(params["hash_seed"]),
                                    layered=params.get("layered") is True)  # fmt: skip
        result = run_build(prepared, say=say, status=status, reproducible=reproducible)
        rebuilt = Rebuilt(recorded, result.artifact, result.sha256, result)
        if rebuilt.reproduced or result.artifact is None:
            return rebuilt
        original = path.parent / Path(recorded.subject).name
        if not original.is_file() or sha256_file(original) != recorded.sha256:
            return rebuilt
        difference = first_difference(original, result.artifact, work_dir=work, copy_to=work)
        report = _diffoscope(difference) if difference else None
        return Rebuilt(recorded, result.artifact, result.sha256, result, difference, report)
