"""A build's SBOM and signed provenance (issue 31), written beside its image once the image is packaged.

The package list comes from the sbom role (``ansible/roles/sbom``), which the node playbook runs last before
sysprep on every engine and provider: it hands the image's package database to this host as
``sbom-inventory.json`` in the build's working folder. An image that stays on its platform (an AMI) gets its SBOM
too; the provenance needs a file to name by digest, so it is written for a local artifact only.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuilder.attest import provenance, sbom
from imagebuilder.attest.packages import load_inventory
from imagebuilder.attest.provenance import Dependency
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.customization.model import Customization
from imagebuilder.plan.config import Os3Fields, SourceImageFields
from imagebuilder.plan.model import BuildPlan

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

#: what the sbom role writes into the build's working folder (the ``sbom_inventory`` variable)
INVENTORY = "sbom-inventory.json"


def _digest(checksum: str, default: str = "sha256") -> dict[str, str]:
    algorithm, sep, value = checksum.partition(":")
    return {algorithm.lower(): value.lower()} if sep else {default: checksum.lower()}


def source_of(plan: BuildPlan) -> Dependency | None:
    """The image or ISO a build starts from, with the digest the build verified it by."""
    config = plan.config
    if isinstance(config, SourceImageFields) and config.source_image_url and config.source_image_checksum:
        return Dependency("source-image", _digest(config.source_image_checksum), config.source_image_url)
    if isinstance(config, Os3Fields) and config.iso_url and config.iso_checksum:
        return Dependency("source-iso", _digest(config.iso_checksum, config.iso_checksum_type or "sha256"),
                          config.iso_url)  # fmt: skip
    version = plan.os_version
    if version.iso_url and version.iso_checksum:
        return Dependency("source-iso", _digest(version.iso_checksum), version.iso_url)
    return None


def _dependencies(plan: BuildPlan, customization: Customization | None) -> list[Dependency]:
    deps = []
    manifest = plan.manifest
    if manifest.sha256:
        deps.append(Dependency("release-manifest", {"sha256": manifest.sha256}, manifest.upstream or manifest.source,
                               read_from=manifest.source))  # fmt: skip
    source = source_of(plan)
    if source is not None:
        deps.append(source)
    # the config files by digest only: they may hold secrets, and their paths say nothing to a verifier
    configs = [Path(plan.config_path)] if plan.config_path else []
    for c in (plan.extras, customization):
        if c is not None:
            configs.append(c.source)
    for path in dict.fromkeys(configs):
        if path.is_file():
            deps.append(Dependency(f"config:{path.name}", {"sha256": sha256_file(path)}))
    deps.extend(Dependency(f"{a.kind}:{a.name}", {"sha256": a.sha256}, a.uri) for a in plan.artifacts if a.sha256)
    return deps


#: what a masked secret reads as in a config's public form
_MASKED = "********"


def build_parameters(
    plan: BuildPlan, epoch: int | None, hash_seed: str | None, layered: bool = False
) -> dict[str, Any]:
    """The provenance's external parameters: everything ``image.rebuild`` needs besides the inputs named by digest
    (the release manifest, the source image): the build's choices, the provider config's fields without its secrets
    (a config that holds one is given again to a rebuild), SOURCE_DATE_EPOCH, the filesystem's hash seed, and
    whether the filesystem is its OS layer's with the build's changes (``build.matrix``)."""
    config = {k: v for k, v in (plan.config.public_dict() if plan.config else {}).items()
              if v is not None and v != _MASKED}  # fmt: skip
    secrets = sorted(k for k, v in (plan.config.public_dict() if plan.config else {}).items() if v == _MASKED)
    return {
        "os": plan.os, "os_version": plan.os_version.version, "provider": plan.provider,
        "release_channel": plan.channel.name, "kubernetes_version": plan.kubernetes_version,
        "engine": plan.engine, "firmware": plan.firmware, "arch": plan.arch, "name": plan.output_name,
        "disk_gb": plan.disk_gb,
        "runtime": plan.runtime.source, "config": config,
        **({"config_secrets": secrets} if secrets else {}),
        **({"source_date_epoch": epoch} if epoch is not None else {}),
        **({"hash_seed": hash_seed} if hash_seed else {}),
        **({"layered": True} if layered else {}),
        **({"hardening": plan.hardening.to_json()} if plan.hardening else {}),
    }  # fmt: skip


def write_attestations(
    plan: BuildPlan,
    *,
    directory: Path,
    out_dir: Path,
    artifact: Path | None,
    sha256: str | None,
    build_id: str,
    started: dt.datetime,
    tools: dict[str, str | None],
    customization: Customization | None,
    signer: Signer | None,
    epoch: int | None = None,
    hash_seed: str | None = None,
    layered: bool = False,
    inputs: Sequence[Dependency] = (),
) -> dict[str, Any]:
    """Write ``<stem>.spdx.json`` and (for a local artifact) ``<stem>.intoto.json``; returns what the build
    manifest records of them."""
    inventory_file = directory / INVENTORY
    if not inventory_file.is_file():
        raise ExternalError(
            f"the build left no package inventory ({inventory_file}): the sbom role did not run",
            hint="see the build log; the node playbook runs the sbom role before sysprep",
        )
    inventory = load_inventory(inventory_file)
    name = artifact.name if artifact else plan.output_name
    components = [sbom.Component(a.name, a.kind, a.uri, a.sha256) for a in plan.artifacts]
    # the build's other inputs (the hardening content and tailoring): in the SBOM as what the image was made with
    components += [
        sbom.Component(
            d.name,
            "input",
            d.uri or "",
            d.digests.get("sha256"),
            f"a build input, not in the image: {d.name.partition(':')[0]}",
        )
        for d in inputs
    ]
    source = source_of(plan)
    origin = sbom.Origin(source.uri or source.name, source.digests, f"the {source.name} the build started from") \
        if source else None  # fmt: skip
    rt = plan.runtime
    versions = {k: v for k, v in (("containerd", rt.containerd), ("runc", rt.runc), ("crictl", rt.crictl)) if v}
    doc = sbom.document(name=name, sha256=sha256 or "", inventory=inventory, components=components, origin=origin,
                        runtime_versions=versions, arch=plan.arch)  # fmt: skip
    if not sha256:
        doc["packages"][0].pop("checksums")
        doc["packages"][0]["comment"] += f"; it stays on its platform ({plan.provider}): see the build manifest"
    sbom_path = out_dir / f"{plan.output_stem}.spdx.json"
    with atomic_write(sbom_path) as fh:
        fh.write(json.dumps(doc, indent=1) + "\n")
    recorded: dict[str, Any] = {"sbom": {"name": sbom_path.name, "sha256": sha256_file(sbom_path),
                                         "packages": len(inventory.packages)}}  # fmt: skip
    if artifact is None or sha256 is None:
        recorded["provenance"] = None
        return recorded
    statement = provenance.statement(
        image=artifact, sha256=sha256,
        parameters=build_parameters(plan, epoch, hash_seed, layered),
        dependencies=[*_dependencies(plan, customization), *inputs], tools=tools, invocation=build_id,
        started=started, finished=dt.datetime.now(dt.UTC), sbom=sbom_path,
    )  # fmt: skip
    envelope = provenance.sign(statement, signer) if signer else provenance.unsigned(statement)
    path = out_dir / f"{plan.output_stem}{provenance.SUFFIX}"
    provenance.write(path, envelope)
    recorded["provenance"] = {"name": path.name, "signed_by": signer.public_key.keyid if signer else None}
    return recorded
