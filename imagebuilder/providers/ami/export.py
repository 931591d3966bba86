"""``ami.export`` (spec 4.4): the AMI a build made, exported to a raw disk in S3 with EC2's ExportImage.

What the spec's steps become here:
1. ``builds[0].artifact_id`` is read from Packer's manifest (the file ``manifest_output`` names), validated like
   every file this tool reads. A multi-region value (``r1:ami-1,r2:ami-2``) names one AMI per region; with more
   than one, ``--region`` chooses (the spec's "part after the first colon" is the one-region case).
2. Before anything is started, what the export needs is checked in the region: the AMI exists and is available,
   the bucket exists and lives in that region (S3 refuses a cross-region export target), and the role EC2 assumes to
   write it (``vmimport``) exists. ``--dry-run`` stops there.
3. ``ExportImage`` with disk format RAW and the S3 location; the export task ID it returns names the file:
   ``s3://<bucket>/<prefix>/<task id>.raw``. The call carries a client token derived from the AMI and the
   location, so a rerun returns the export already started instead of starting a second one.
4. ``--wait`` polls ``DescribeExportImageTasks`` until the task completes, reporting its progress; a task that ends
   otherwise fails with the service's status message.

Credentials come from boto3's own chain (environment, profile, instance role), never from flags; boto3 retries
throttled calls itself (its standard retry mode).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import field_validator

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import parse_json, read_text
from imagebuilder.core.progress import Say, Transfers, poll, silent, start
from imagebuilder.core.validation import StrictModel, validated

if TYPE_CHECKING:
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_iam.client import IAMClient
    from mypy_boto3_s3.client import S3Client


class PackerBuild(StrictModel):
    """One entry of ``builds`` in Packer's manifest post-processor output (every field Packer writes)."""

    name: str = ""
    builder_type: str = ""
    build_time: int = 0
    files: list[dict[str, Any]] | None = None
    artifact_id: str
    packer_run_uuid: str = ""
    custom_data: dict[str, str] | None = None

    @field_validator("artifact_id")
    @classmethod
    def _pairs(cls, value: str) -> str:
        artifact_pairs(value)
        return value


class PackerManifest(StrictModel):
    builds: list[PackerBuild]
    last_run_uuid: str = ""

    @field_validator("builds")
    @classmethod
    def _some(cls, value: list[PackerBuild]) -> list[PackerBuild]:
        if not value:
            raise ValueError("no build in the manifest (Packer writes one entry per build)")
        return value


def artifact_pairs(artifact_id: str) -> list[tuple[str, str]]:
    """``region:ami-id[,region:ami-id...]`` as (region, AMI ID) pairs; ValueError naming what is wrong."""
    pairs = []
    for item in artifact_id.split(","):
        region, colon, image = item.partition(":")
        if not colon:
            raise ValueError(f"expected region:ami-id (Packer's amazon-ebs artifact), got {item[:60]!r}: no colon")
        pairs.append((grammar.aws_region(region), grammar.ami_id(image)))
    return pairs


@dataclass(frozen=True)
class ExportPlan:
    """What ``ami.export`` does, resolved from the flags and the manifest before any call."""

    manifest: Path
    region: str
    image_id: str
    bucket: str
    prefix: str
    role_name: str
    builds: int

    @property
    def client_token(self) -> str:
        """The same export asked twice is one export (EC2's idempotency token: at most 64 ASCII characters)."""
        key = "\0".join((self.region, self.image_id, self.bucket, self.prefix, self.role_name))
        return "image-builder-" + hashlib.sha256(key.encode()).hexdigest()[:48]

    def location(self, task_id: str) -> str:
        return f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}{task_id}.raw"

    def describe(self) -> str:
        which = f"builds[0] of {self.builds}" if self.builds > 1 else "builds[0]"
        return (
            f"export {self.image_id} ({self.region}, {which} of {self.manifest.name}) as RAW to "
            f"{self.location('<export task id>')}, written by role {self.role_name}"
        )


def plan_export(manifest: Path, bucket: str, prefix: str, role_name: str, region: str | None) -> ExportPlan:
    """Resolve the flags (already held to their grammars) and the manifest; InputError (exit 2) on bad input."""
    data = parse_json(read_text(manifest, "Packer manifest"), manifest)
    if not isinstance(data, dict):
        raise InputError("not a Packer manifest (a JSON object with builds)", source=manifest)
    parsed = validated(PackerManifest, data, manifest)
    pairs = artifact_pairs(parsed.builds[0].artifact_id)
    regions = [r for r, _ in pairs]
    if region is None:
        if len(pairs) > 1:
            raise InputError(
                f"builds[0].artifact_id names AMIs in {len(pairs)} regions ({', '.join(regions)})",
                source=manifest,
                field="--region",
                expected="the region to export from",
            )
        region = regions[0]
    elif region not in regions:
        raise InputError(
            f"builds[0].artifact_id has no AMI in {region} (it has {', '.join(regions)})",
            source=manifest,
            field="--region",
            expected=" or ".join(regions),
        )
    image = dict(pairs)[region]
    return ExportPlan(manifest, region, image, bucket, prefix, role_name, len(parsed.builds))


@dataclass(frozen=True)
class Clients:
    """The three services an export touches, in one region."""

    ec2: EC2Client
    s3: S3Client
    iam: IAMClient


def clients_for(region: str) -> Clients:
    """Clients from boto3's credential chain; endpoints as boto3 resolves them (``AWS_ENDPOINT_URL`` included)."""
    import boto3
    from botocore.config import Config

    session = boto3.Session(region_name=region)
    config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10, read_timeout=60)
    return Clients(
        ec2=session.client("ec2", config=config),
        s3=session.client("s3", config=config),
        iam=session.client("iam", config=config),
    )


def _aws(what: str, call: Callable[[], Any], *, hint: str) -> Any:
    """One AWS call; its failures as :class:`ExternalError` (exit 1) with the service's own code and message."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return call()
    except NoCredentialsError:
        raise ExternalError(
            f"{what}: no AWS credentials found",
            hint="give boto3 credentials the usual way: AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the "
            "environment, or an instance role",
        ) from None
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise ExternalError(f"{what}: {err.get('Code', 'error')}: {err.get('Message', str(exc))}", hint=hint) from None
    except BotoCoreError as exc:
        raise ExternalError(f"{what}: {exc}", hint=hint) from None


def preflight(plan: ExportPlan, aws: Clients) -> list[str]:
    """Everything the export needs, checked in the region before it starts; the checks' findings."""
    images = _aws(
        f"looking up {plan.image_id} in {plan.region}",
        lambda: aws.ec2.describe_images(ImageIds=[plan.image_id]),
        hint="check the region and that the AMI was not deregistered",
    )["Images"]
    if not images:
        raise ExternalError(f"{plan.image_id} does not exist in {plan.region}", hint="check --region and the manifest")
    state = images[0].get("State", "unknown")
    if state != "available":
        raise ExternalError(f"{plan.image_id} is {state}, not available", hint="wait until the AMI is available")
    _aws(
        f"checking bucket {plan.bucket}",
        lambda: aws.s3.head_bucket(Bucket=plan.bucket),
        hint="create the bucket in the AMI's region, or give another with --bucket",
    )
    where = _aws(
        f"reading the region of bucket {plan.bucket}",
        lambda: aws.s3.get_bucket_location(Bucket=plan.bucket),
        hint="the caller needs s3:GetBucketLocation on the bucket",
    ).get("LocationConstraint")
    bucket_region = where or "us-east-1"  # S3 reports us-east-1 as no constraint
    if bucket_region != plan.region:
        raise ExternalError(
            f"bucket {plan.bucket} is in {bucket_region}, the AMI in {plan.region}: EC2 exports to a bucket of the "
            "AMI's own region",
            hint=f"use a bucket in {plan.region}",
        )
    _aws(
        f"checking role {plan.role_name}",
        lambda: aws.iam.get_role(RoleName=plan.role_name),
        hint="create the VM Import service role (vmimport) as the AWS VM Import/Export guide shows, or name yours "
        "with --role-name",
    )
    return [
        f"{plan.image_id}: available in {plan.region}",
        f"bucket {plan.bucket}: exists, in {bucket_region}",
        f"role {plan.role_name}: exists",
    ]


@dataclass(frozen=True)
class ExportResult:
    plan: ExportPlan
    checks: list[str]
    task_id: str | None = None
    status: str | None = None

    @property
    def location(self) -> str | None:
        return self.plan.location(self.task_id) if self.task_id else None


def start_export(plan: ExportPlan, aws: Clients) -> str:
    """``ExportImage`` (RAW, the S3 location); the export task ID."""
    location: dict[str, str] = {"S3Bucket": plan.bucket}
    if plan.prefix:
        location["S3Prefix"] = plan.prefix + "/"  # EC2 appends <task id>.raw to the prefix as given
    response = _aws(
        f"exporting {plan.image_id}",
        lambda: aws.ec2.export_image(
            ImageId=plan.image_id,
            DiskImageFormat="RAW",
            S3ExportLocation=location,  # type: ignore[arg-type]
            RoleName=plan.role_name,
            ClientToken=plan.client_token,
            Description=f"image-builder: {plan.image_id} from {plan.manifest.name}",
        ),
        hint="the role needs the VM Import/Export permissions on the bucket (s3:PutObject, s3:GetBucketAcl...)",
    )
    task_id = response.get("ExportImageTaskId")
    if not isinstance(task_id, str) or not task_id:
        raise ExternalError("ExportImage answered without an ExportImageTaskId")
    return task_id


def wait_for(
    task_id: str,
    aws: Clients,
    *,
    interval: float = 15,
    timeout: float = 4 * 3600,
    say: Say = silent,
    transfers: Transfers | None = None,
) -> str:
    """Poll the export task until it completes (its progress reported in percent); ExternalError otherwise."""
    advance = start(transfers, f"export {task_id}", 100)
    done = 0

    def check() -> tuple[bool, str]:
        nonlocal done
        tasks = _aws(
            f"reading export task {task_id}",
            lambda: aws.ec2.describe_export_image_tasks(ExportImageTaskIds=[task_id]),
            hint="rerun with --wait later: the export goes on in AWS",
        ).get("ExportImageTasks", [])
        if not tasks:
            raise ExternalError(f"export task {task_id} is gone", hint="it may have been cancelled")
        task = tasks[0]
        status = str(task.get("Status", "unknown"))
        progress = str(task.get("Progress", "") or "")
        if advance and progress.isdigit() and int(progress) > done:
            advance(int(progress) - done)
            done = int(progress)
        if status == "completed":
            if advance and done < 100:
                advance(100 - done)
            return True, status
        if status != "active":
            message = task.get("StatusMessage") or "no status message"
            raise ExternalError(
                f"export task {task_id} ended {status}: {message}",
                hint="check the role's permissions on the bucket and that the AMI can be exported (AWS VM "
                "Import/Export's limits: no Marketplace or encrypted-by-default-key AMIs)",
            )
        say(f"export {task_id}: {status}{f', {progress}%' if progress else ''}")
        return False, status

    return poll(
        check, f"export task {task_id}", timeout, interval=interval, hint="it goes on in AWS; rerun with --wait"
    )


def export_ami(
    plan: ExportPlan,
    *,
    dry_run: bool = False,
    wait: bool = False,
    clients: Callable[[str], Clients] = clients_for,
    interval: float = 15,
    say: Say = silent,
    transfers: Transfers | None = None,
) -> ExportResult:
    """Check, then (unless a dry run) start the export, and with ``wait`` follow it to the end."""
    aws = clients(plan.region)
    checks = preflight(plan, aws)
    if dry_run:
        return ExportResult(plan, checks)
    task_id = start_export(plan, aws)
    say(f"export task {task_id} started: {plan.location(task_id)}")
    status = wait_for(task_id, aws, interval=interval, say=say, transfers=transfers) if wait else None
    return ExportResult(plan, checks, task_id, status)


__all__ = ["ExportPlan", "ExportResult", "artifact_pairs", "clients_for", "export_ami", "plan_export"]
