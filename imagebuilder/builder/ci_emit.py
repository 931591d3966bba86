"""``build.matrix --emit``: the CI definition that runs a matrix on the user's own runners, shaped like the matrix.

Why: one machine builds a matrix with bounded parallelism; a release team with a pool of runners wants each image
on its own runner, the OS layer built once for all of them, and one publish at the end. The pipeline is one model
(:func:`pipeline`: jobs, what each needs, its commands, its secrets by name) written out by two renderers, so the
GitHub workflow and the GitLab pipeline are the same graph running the same commands:

- ``os-layer`` jobs, one per OS layer (``build.matrix --layer-only``), cached by the CI under the layer's inputs
  digest (the key ``build.matrix`` files the layer under), so a rerun with unchanged inputs finds it and builds
  nothing; the layer goes to the image jobs as the job's artifact;
- ``build`` jobs, one per OS, provider, firmware and engine, fanned out over the release lines with the CI's own
  matrix syntax (``strategy.matrix``, ``parallel: matrix:``), each image on the layer its ``needs`` hands it;
- ``publish``, when asked (``--publish``): every image with its SBOM and provenance in one ``image.publish``, so a
  fleet sees one new repository version per pipeline.

Every job installs image-builder from the pipeline's own checkout (``./scripts/setup.sh``) and runs ``preflight``
first. Every value comes from the user's flags and lands in a shell command (quoted with :func:`shlex.quote`) inside
YAML (written by the YAML emitter, which escapes it), and in a GitHub workflow with ``${{`` made literal (GitHub
evaluates its expressions before the shell runs). No secret is ever written: the signing key, the repository's keys,
a provider config that holds a password and cloud credentials come from the CI's secret store by name, are written
to 0600 files in the job and removed after it; the file's header lists them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from imagebuilder.builder.inputs import digest, layer_inputs
from imagebuilder.core import untrusted
from imagebuilder.core.errors import InputError
from imagebuilder.plan.model import BuildPlan, BuildRequest
from imagebuilder.providers import registry

LAYER_DIR = "layers"
OUTPUT_DIR = "output"
IMAGE_BUILDER = ".venv/bin/image-builder"
#: the matrix variable the image jobs fan out over
CHANNEL_VAR = "RELEASE_CHANNEL"
#: GitLab's failures a retry can help with (the runner, not the build); a failing build is not retried
RETRY_WHEN = ("runner_system_failure", "stuck_or_timeout_failure", "scheduler_failure", "api_failure")


@dataclass(frozen=True)
class Secret:
    """A value the jobs take from the CI's secret store, by name: a file's content (a key, a config holding a
    password), made a 0600 file whose path is ``$<name>_FILE`` in the job, or a variable of the environment."""

    name: str
    kind: Literal["file", "env"]
    why: str


@dataclass(frozen=True)
class CiOptions:
    runs_on: tuple[str, ...] = ("self-hosted", "linux", "x64")
    #: where the publish job publishes (a folder, or s3://bucket/prefix); None: no publish job
    publish: str | None = None
    #: image jobs at once (GitHub's max-parallel); None: as many as there are runners
    concurrency: int | None = None
    #: the jobs sign each provenance with the key in the secret store
    sign: bool = False
    #: free disk the jobs' preflight asks for (build.matrix's --min-disk-gb)
    min_disk_gb: int | None = None
    retries: int = 1

    def __post_init__(self) -> None:
        if self.publish and not self.sign:  # image.publish takes signed provenance only
            raise InputError(
                "a published image's provenance must be signed",
                field="--ci-publish",
                expected="--ci-sign too (the jobs sign with the secret IMAGE_BUILDER_SIGNING_KEY)",
            )


@dataclass(frozen=True)
class CiJob:
    id: str
    stage: Literal["os-layer", "build", "publish"]
    commands: tuple[str, ...]
    needs: tuple[str, ...] = ()
    #: values of $RELEASE_CHANNEL the job fans out over (empty: one job)
    channels: tuple[str, ...] = ()
    #: the OS layer's cache key (the layer's inputs digest): the layer job's cache
    cache_key: str | None = None
    #: the folder this job hands to the jobs that need it
    hands: str | None = None
    secrets: tuple[Secret, ...] = field(default=())
    comment: str = ""


def _job_id(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(parts))


def _config_secret(provider: str) -> Secret:
    return Secret(f"IMAGE_BUILDER_{provider.upper()}_CONFIG", "file",
                  f"the {provider} build config (it holds the password)")  # fmt: skip


SIGNING_KEY = Secret("IMAGE_BUILDER_SIGNING_KEY", "file", "the PEM key every build signs its provenance with")
#: the repository's keys image.publish reads (role -> the secret holding its PEM)
TUF_KEYS = {role: Secret(f"IMAGE_BUILDER_TUF_{role.upper()}_KEY", "file", f"the repository's {role} key (PEM)")
            for role in ("targets", "snapshot", "timestamp")}  # fmt: skip
S3_SECRETS = (Secret("AWS_ACCESS_KEY_ID", "env", "the S3 repository's credentials"),
              Secret("AWS_SECRET_ACCESS_KEY", "env", "the S3 repository's credentials"))  # fmt: skip


def _config_args(plan: BuildPlan, request: BuildRequest) -> tuple[list[str | Var], tuple[Secret, ...]]:
    """The provider config flag of ``plan``'s entry: its path (a file in the repository), or, for a provider whose
    config holds a password, the secret file the job writes."""
    path = request.for_arch(plan.arch).configs.get(plan.provider)
    if not path:
        return [], ()
    if registry.get(plan.provider).secret_variables:
        secret = _config_secret(plan.provider)
        return [f"--{plan.provider}-config", _file_of(secret)], (secret,)
    return [f"--{plan.provider}-config", path], ()


#: ``$NAME`` or ``${NAME}``: a CI variable the job's shell expands (a value that carries a token lives there)
VARIABLE_REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]{0,63})\}?")


def manifest_secret(request: BuildRequest) -> Secret | None:
    """The CI secret variable ``--release-manifest`` names (``$IMAGE_BUILDER_RELEASE_MANIFEST``), when it names one."""
    found = VARIABLE_REFERENCE.fullmatch(request.release_manifest or "")
    return Secret(found[1], "env", "the release manifest's URL (it carries a token)") if found else None


def _flags(plan: BuildPlan, request: BuildRequest, customize: str | None) -> list[str | Var]:
    """The shared flags of one entry's command, and the engine this entry resolved to (pinned, so that a runner with
    another KVM answer than this host builds what the jobs expect). No value that carries a credential is written
    (exit 2 naming the flag); the release manifest may be a CI variable, expanded by the job's shell."""
    out: list[str | Var] = []
    for flag, value in (
        ("--os-version", request.os_version),
        ("--release-manifest", request.release_manifest),
        ("--mirror", request.mirror),
        ("--disk-gb", str(request.disk_gb) if request.disk_gb is not None else None),
        ("--firmware", plan.firmware),
        ("--engine", plan.engine),
        ("--runtime", request.runtime),
        ("--files-config", request.files_config),
        ("--customize", customize),
        ("--hardening", request.hardening.profile if request.hardening else None),
        (
            "--hardening-content",
            str(request.hardening.content) if request.hardening and request.hardening.content else None,
        ),
        ("--hardening-min-pass", f"{request.hardening.min_pass:g}" if request.hardening else None),
    ):
        secret = manifest_secret(request) if flag == "--release-manifest" else None
        if secret is not None:
            out += [flag, Var(secret.name)]
        elif value and untrusted.carries_credentials(value):
            raise InputError(f"{untrusted.shown(value)} carries a credential, and the pipeline is a file anyone with "
                             "the repository reads", field=flag,
                             expected="the value in a CI secret variable: --release-manifest "
                             "'$IMAGE_BUILDER_RELEASE_MANIFEST' (set here too: the plan reads it)"
                             if flag == "--release-manifest" else "a value without credentials")  # fmt: skip
        elif value:
            out += [flag, value]
    if request.offline:
        out.append("--offline")
    return out


@dataclass(frozen=True)
class Var:
    """An argument the job's shell expands: the variable ``name`` (``"$name"``). Only this module makes one, from
    names it chose; a flag's text is always a plain string, quoted."""

    name: str

    def expand(self) -> str:
        return f'"${self.name}"'


def _file_of(secret: Secret) -> Var:
    """The variable holding the path of ``secret``'s 0600 file in the job (:func:`_materialize` makes it)."""
    return Var(f"{secret.name}_FILE")


def _github_file(secret: Secret) -> str:
    """Where a GitHub job writes ``secret``'s file (removed by the job's last step)."""
    return f"$RUNNER_TEMP/{secret.name.lower()}"


def _command(args: list[str | Var]) -> str:
    """``args`` as one shell command line: strings shell-quoted, :class:`Var` expanded by the shell."""
    return " ".join(a.expand() if isinstance(a, Var) else shlex.quote(a) for a in args)


def layer_key(plan: BuildPlan) -> str | None:
    """The cache key of ``plan``'s OS layer: the layer's file stem in ``build.matrix``'s layer cache (its OS, version
    and inputs digest); None for a build that makes no layer (the Packer engine)."""
    if plan.engine != "chroot":
        return None
    return f"os-{plan.os}-{plan.os_version.version}-{digest(layer_inputs(plan))[:32]}"


def pipeline(plans: list[BuildPlan], request: BuildRequest, customize: str | None, options: CiOptions) -> list[CiJob]:
    """The jobs that build ``plans`` (see the module), in order: layers, image jobs, publish."""
    jobs: list[CiJob] = []
    layer_jobs: dict[str, str] = {}
    preflight_min = ["--min-disk-gb", str(options.min_disk_gb)] if options.min_disk_gb else []
    sign: list[str | Var] = ["--signing-key", _file_of(SIGNING_KEY)] if options.sign else []
    groups: dict[tuple[str, str, str, str, str, str | None], list[BuildPlan]] = {}
    for plan in plans:
        group = (plan.os, plan.provider, plan.arch, plan.firmware, plan.engine, layer_key(plan))
        groups.setdefault(group, []).append(plan)
    for (os_name, provider, arch, _fw, _engine, key), members in groups.items():
        first = members[0]
        config, secrets = _config_args(first, request)
        # an amd64 entry's command is as it was before architectures (the default); another's names its own
        arch_args = ["--arch", arch] if arch != "amd64" else []
        arch_id = (arch,) if arch != "amd64" else ()
        base = [IMAGE_BUILDER, "build.matrix", "--pairs", f"{os_name}:{provider}", *arch_args]
        preflight = _command([IMAGE_BUILDER, "preflight", "--os", os_name, "--hypervisor", provider, *preflight_min])
        flags = _flags(first, request, customize)
        manifest = manifest_secret(request)
        secrets += (manifest,) if manifest else ()
        needs: tuple[str, ...] = ()
        if key is not None:
            layer_id = _job_id("os-layer", os_name, first.os_version.version, *arch_id)
            if key in layer_jobs:
                layer_id = layer_jobs[key]
            else:
                if layer_id in layer_jobs.values():
                    layer_id = _job_id("os-layer", key)
                layer_jobs[key] = layer_id
                command = _command([*base, "--release-channel", first.channel.name, *config, *flags,
                                    "--layer-cache", LAYER_DIR, "--layer-only"])  # fmt: skip
                jobs.append(CiJob(layer_id, "os-layer", (preflight, command), cache_key=key, hands=LAYER_DIR,
                                  secrets=secrets, comment=f"the {os_name} {first.os_version.version} OS layer, "
                                  "built once (a rerun with the same inputs finds it in the cache)"))  # fmt: skip
            needs = (layer_id,)
        command = _command([*base, "--release-channel", Var(CHANNEL_VAR), *config, *flags, "--layer-cache",
                            LAYER_DIR, "--output-dir", OUTPUT_DIR, *sign])  # fmt: skip
        job_id = _job_id("build", os_name, provider, *arch_id, first.firmware, first.engine)
        engine = "root and loop devices (chroot engine)" if first.engine == "chroot" else "QEMU (Packer engine)"
        jobs.append(CiJob(job_id, "build", (preflight, command), needs=needs,
                          channels=tuple(p.channel.name for p in members), hands=OUTPUT_DIR,
                          secrets=secrets + ((SIGNING_KEY,) if options.sign else ()),
                          comment=f"{os_name} on {provider}{' for ' + arch if arch_id else ''}, one image per release "
                          f"line; needs {engine}"))  # fmt: skip
    if options.publish:
        images = [a for p in plans if p.output_name for a in ("--image", f"{OUTPUT_DIR}/{p.output_name}")]
        secrets = tuple(TUF_KEYS.values()) + (S3_SECRETS if options.publish.startswith("s3://") else ())
        keys = ('keys=$(mktemp -d) && trap \'rm -rf -- "$keys"\' EXIT && '
                + " && ".join(f'install -m 0600 {_file_of(s).expand()} "$keys/{role}.pem"'
                              for role, s in TUF_KEYS.items()))  # fmt: skip
        publish = _command([IMAGE_BUILDER, "image.publish", *images, "--repo", options.publish, "--keys", Var("keys")])
        jobs.append(CiJob("publish", "publish", (f"{keys} && {publish}",),
                          needs=tuple(j.id for j in jobs if j.stage == "build"), secrets=secrets,
                          comment="every image, its SBOM and provenance, in one new repository version"))  # fmt: skip
    return jobs


# --- the two renderers ----------------------------------------------------------------------------------------------

INSTALL = "./scripts/setup.sh"


def _header(kind: str, jobs: list[CiJob], options: CiOptions) -> str:
    secrets: dict[str, Secret] = {}
    for job in jobs:
        for s in job.secrets:
            secrets.setdefault(s.name, s)
    lines = [f"written by image-builder build.matrix --emit {kind}: the matrix as a pipeline (docs/ci.md)",
             "each job installs image-builder from this checkout (./scripts/setup.sh) and runs preflight first;",
             "a chroot-engine job needs a runner with root and loop devices, a Packer job QEMU"]  # fmt: skip
    if secrets:
        store = "repository secrets" if kind == "github-actions" else "CI/CD variables (masked; 'File' for files)"
        lines.append(f"secrets it needs, from the {store}; none is written here:")
        lines += [f"  {s.name} ({'a file' if s.kind == 'file' else 'a value'}): {s.why}" for s in secrets.values()]
    if options.concurrency and kind == "gitlab-ci":
        lines.append(f"at most {options.concurrency} image jobs at once: set the runners' 'limit' (GitLab has no "
                     "per-pipeline limit)")  # fmt: skip
    return "".join(f"# {ln}\n" for ln in lines)


def _materialize(job: CiJob, kind: str) -> list[str]:
    """Shell lines that make each file secret a 0600 file at ``$<NAME>_FILE`` (GitLab hands a path, GitHub the
    content in the environment)."""
    out = []
    for s in job.secrets:
        if s.kind != "file":
            continue
        path = _file_of(s)
        if kind == "gitlab-ci":
            out.append(f'export {path.name}="${s.name}" && chmod 0600 {path.expand()}')
        else:
            out.append(f'export {path.name}="{_github_file(s)}" && (umask 077 && printf \'%s\\n\' "${s.name}" > '
                       f'{path.expand()})')  # fmt: skip
    return out


def _gitlab(jobs: list[CiJob], options: CiOptions) -> dict[str, Any]:
    doc: dict[str, Any] = {"stages": [s for s in ("os-layer", "build", "publish") if any(j.stage == s for j in jobs)]}
    for job in jobs:
        entry: dict[str, Any] = {"stage": job.stage, "tags": list(options.runs_on)}
        if job.cache_key:
            entry["cache"] = {"key": job.cache_key, "paths": [f"{LAYER_DIR}/"]}
        entry["needs"] = [{"job": n, "artifacts": True} for n in job.needs]
        if job.channels:
            entry["parallel"] = {"matrix": [{CHANNEL_VAR: list(job.channels)}]}
        entry["retry"] = {"max": options.retries, "when": list(RETRY_WHEN)}
        # GitLab writes a file variable to a temporary file of the job's and removes it when the job ends
        entry["script"] = [INSTALL, *_materialize(job, "gitlab-ci"), *job.commands]
        if job.hands:
            entry["artifacts"] = {"paths": [f"{job.hands}/"], "expire_in": "1 day"}
        doc[job.id] = entry
    return doc


def _github(jobs: list[CiJob], options: CiOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    checkout = {"uses": "actions/checkout@v4"}
    for job in jobs:
        steps: list[dict[str, Any]] = [checkout]
        if job.cache_key:
            steps.append({"uses": "actions/cache@v4", "with": {"path": LAYER_DIR, "key": job.cache_key}})
        for need in job.needs if job.stage == "build" else ():  # the OS layer its layer job uploaded
            steps.append({"uses": "actions/download-artifact@v4", "with": {"name": need, "path": LAYER_DIR}})
        if job.stage == "publish":
            steps.append({"uses": "actions/download-artifact@v4",
                          "with": {"pattern": "images-*", "path": OUTPUT_DIR, "merge-multiple": True}})  # fmt: skip
        steps.append({"name": "install image-builder", "run": INSTALL})
        env = {s.name: f"${{{{ secrets.{s.name} }}}}" for s in job.secrets}
        if job.channels:
            env[CHANNEL_VAR] = "${{ matrix.release-channel }}"
        # the commands carry the user's values: made literal here, before the workflow's own expressions go in
        lines = [*_materialize(job, "github-actions"), *(_github_literal(c) for c in job.commands)]
        run: dict[str, Any] = {"name": job.stage, "run": "\n".join(lines)}
        if env:
            run["env"] = env
        steps.append(run)
        if job.hands and job.stage == "os-layer":
            steps.append({"uses": "actions/upload-artifact@v4", "with": {"name": job.id, "path": job.hands}})
        elif job.hands:
            name = f"images-{job.id}-${{{{ matrix.release-channel }}}}" if job.channels else f"images-{job.id}"
            steps.append({"uses": "actions/upload-artifact@v4", "with": {"name": name, "path": job.hands}})
        files = [s for s in job.secrets if s.kind == "file"]
        if files:
            remove = "rm -f -- " + " ".join(f'"{_github_file(s)}"' for s in files)
            steps.append({"name": "remove the secret files", "if": "always()", "run": remove})
        entry: dict[str, Any] = {"runs-on": [_github_literal(label) for label in options.runs_on]}
        if job.needs:
            entry["needs"] = list(job.needs)
        if job.channels:
            strategy: dict[str, Any] = {"fail-fast": False, "matrix": {"release-channel": list(job.channels)}}
            if options.concurrency:
                strategy["max-parallel"] = options.concurrency
            entry["strategy"] = strategy
        entry["steps"] = steps
        out[job.id] = entry
    return out


def emit_ci(
    kind: str,
    plans: list[BuildPlan],
    *,
    request: BuildRequest,
    customize: str | None,
    options: CiOptions | None = None,
) -> str:
    """The ``github-actions`` workflow or ``.gitlab-ci.yml`` (text) that builds ``plans``."""
    options = options or CiOptions()
    jobs = pipeline(plans, request, customize, options)
    if kind == "github-actions":
        doc = {"name": "node images", "on": {"workflow_dispatch": {}}, "jobs": _github(jobs, options)}
    else:
        doc = _gitlab(jobs, options)
    text = yaml.dump(doc, Dumper=_Plain, sort_keys=False, width=100_000)
    return _header(kind, jobs, options) + _job_comments(text, jobs, "  " if kind == "github-actions" else "")


def _job_comments(text: str, jobs: list[CiJob], indent: str) -> str:
    """Each job's comment (what it builds and what its runner needs) on the line above the job's key. The comments
    are this module's own text of catalog names (no flag's text), one line each."""
    lines = text.split("\n")
    for job in jobs:
        key = f"{indent}{job.id}:"
        if job.comment and key in lines and "\n" not in job.comment:
            i = lines.index(key)
            lines.insert(i, f"{indent}# {job.comment}")
    return "\n".join(lines)


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
