"""``build.matrix --emit``: the CI definition that runs a matrix on the user's own runners, one build per job.

Why: one machine builds a matrix with bounded parallelism; a release team with a pool of runners wants each image
on its own runner. The emitted definition has one job per OS layer (``build.matrix --layer-only``, the layer cache
uploaded as a job artifact) and one job per image that downloads its OS layer and runs ``build.matrix`` for that
single entry, so each job is the same command a user runs by hand and the layer is built once, not per job. Builds
the chroot engine does not make (a VM is needed) get a job of their own without a layer.

Every value comes from the user's flags and lands in a shell command (quoted with :func:`shlex.quote`) inside YAML
(written by the YAML emitter, which escapes it), and in a GitHub workflow with ``${{`` made literal (GitHub
evaluates its expressions before the shell runs); job names are made of the OS, provider and channel, whose grammar
the catalog enforces. No secret is ever written: config files are referred to by path, credentials stay in the
runner's environment. The output is checked against the official schemas in the tests (check-jsonschema).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from imagebuilder.build.plan import BuildPlan, BuildRequest

LAYER_DIR = "layers"
OUTPUT_DIR = "output"


def _job_id(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(parts))


def _flags(plan: BuildPlan, request: BuildRequest, customize: str | None) -> list[str]:
    """The flags of one entry's command: its own provider's config, the shared flags, and the engine this entry
    resolved to (pinned, so that a runner with another KVM answer than this host builds what the jobs expect)."""
    out: list[str] = []
    path = request.configs.get(plan.provider)
    if path:
        out += [f"--{plan.provider}-config", path]
    for flag, value in (
        ("--os-version", request.os_version),
        ("--mirror", request.mirror),
        ("--disk-gb", str(request.disk_gb) if request.disk_gb is not None else None),
        ("--firmware", request.firmware),
        ("--engine", plan.engine),
        ("--files-config", request.files_config),
        ("--customize", customize),
    ):
        if value:
            out += [flag, value]
    if request.offline:
        out.append("--offline")
    return out


def _command(plan: BuildPlan, request: BuildRequest, customize: str | None, *extra: str) -> str:
    args = ["image-builder", "build.matrix", "--pairs", f"{plan.os}:{plan.provider}",
            "--release-channel", plan.channel.name, *_flags(plan, request, customize), *extra]  # fmt: skip
    return " ".join(shlex.quote(a) for a in args)


def _layer_key(plan: BuildPlan) -> str | None:
    return _job_id("os-layer", plan.os, plan.os_version.version) if plan.engine == "chroot" else None


def emit_ci(
    kind: str,
    plans: list[BuildPlan],
    *,
    request: BuildRequest,
    customize: str | None,
    runs_on: list[str],
) -> str:
    """The ``github-actions`` workflow or ``.gitlab-ci.yml`` (text) that builds ``plans``."""
    layers: dict[str, BuildPlan] = {}
    for plan in plans:
        key = _layer_key(plan)
        if key and key not in layers:
            layers[key] = plan
    cache = ["--layer-cache", LAYER_DIR]
    doc: dict[str, Any]
    if kind == "github-actions":
        jobs: dict[str, Any] = {}
        checkout = {"uses": "actions/checkout@v4"}
        for key, plan in layers.items():
            jobs[key] = {
                "runs-on": list(runs_on),
                "steps": [
                    checkout,
                    {"name": "OS layer", "run": _command(plan, request, customize, *cache, "--layer-only")},
                    {"uses": "actions/upload-artifact@v4", "with": {"name": key, "path": LAYER_DIR}},
                ],
            }
        for plan in plans:
            key = _layer_key(plan)
            steps: list[dict[str, Any]] = [checkout]
            if key:
                steps.append({"uses": "actions/download-artifact@v4", "with": {"name": key, "path": LAYER_DIR}})
            build = _command(plan, request, customize, *cache, "--output-dir", OUTPUT_DIR)
            steps.append({"name": "build", "run": build})
            steps.append({"uses": "actions/upload-artifact@v4",
                          "with": {"name": plan.output_stem, "path": OUTPUT_DIR}})  # fmt: skip
            job: dict[str, Any] = {"runs-on": list(runs_on), "steps": steps}
            if key:
                job["needs"] = [key]
            jobs[_job_id("build", plan.os, plan.provider, plan.channel.name)] = job
        doc = _github_literal({"name": "node images", "on": {"workflow_dispatch": {}}, "jobs": jobs})
    else:
        doc = {"stages": ["os-layer", "build"]}
        for key, plan in layers.items():
            doc[key] = {
                "stage": "os-layer",
                "tags": list(runs_on),
                "script": [_command(plan, request, customize, *cache, "--layer-only")],
                "artifacts": {"paths": [f"{LAYER_DIR}/"], "expire_in": "1 day"},
            }
        for plan in plans:
            key = _layer_key(plan)
            job = {
                "stage": "build",
                "tags": list(runs_on),
                "script": [_command(plan, request, customize, *cache, "--output-dir", OUTPUT_DIR)],
                "artifacts": {"paths": [f"{OUTPUT_DIR}/"]},
            }
            job["needs"] = [{"job": key, "artifacts": True}] if key else []
            doc[_job_id("build", plan.os, plan.provider, plan.channel.name)] = job
    header = f"# written by image-builder build.matrix --emit {kind}; each job runs the command a user would\n"
    return header + yaml.dump(doc, Dumper=_Plain, sort_keys=False, width=100_000)


def _github_literal(value: Any) -> Any:
    """Every string of a workflow with GitHub's expression opener ``${{`` written as an expression that yields it
    (``${{ '${{' }}``): GitHub evaluates expressions in ``run:`` and most other values before a shell sees them, so a
    flag's ``${{ secrets.X }}`` would otherwise be evaluated, whatever the shell quoting around it."""
    if isinstance(value, str):
        return value.replace("${{", "${{ '${{' }}")
    if isinstance(value, dict):
        return {k: _github_literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_github_literal(v) for v in value]
    return value


class _Plain(yaml.SafeDumper):
    """YAML without anchors and aliases: each job reads whole, as a user writes one."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
