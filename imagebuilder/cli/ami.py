"""``ami.*``: after an AMI build, its machine image exported to a raw disk in S3 (spec 4.4)."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task, transfer_bars
from imagebuilder.core import grammar


@task(
    help={
        "manifest": "Packer's manifest of the AMI build (manifest_output): builds[0].artifact_id names the AMI",
        "bucket": "S3 bucket in the AMI's region that receives <prefix>/<export task id>.raw",
        "prefix": "key prefix inside the bucket (default: the bucket's top)",
        "role_name": "the role EC2 assumes to write to the bucket (default vmimport, as AWS VM Import/Export names it)",
        "region": "the AMI's region (needed when artifact_id names several; default: the one it names)",
        "wait": "follow the export task to its end, with progress; exit 1 if it fails",
        "dry_run": "check the manifest, the AMI, the bucket (and its region) and the role; export nothing",
    },
)
@cli_task
def export(
    c: Context,
    manifest: str = "",
    bucket: str = "",
    prefix: str = "",
    role_name: str = "vmimport",
    region: str = "",
    wait: bool = False,
    dry_run: bool = False,
) -> None:
    """Export the AMI a build made to a raw disk in S3 (spec 4.4); AWS credentials from boto3's usual chain.

    Examples:
        image-builder ami.export --manifest output/packer-manifest.json --bucket my-images --dry-run
    """
    path = flags.existing_file(flags.required(manifest, "--manifest", "the Packer manifest"), "--manifest")
    s3_bucket = flags.grammar_of(grammar.s3_bucket, flags.required(bucket, "--bucket", "an S3 bucket"), "--bucket")
    s3_prefix = flags.grammar_of(grammar.s3_prefix, prefix, "--prefix")
    role = flags.grammar_of(grammar.iam_role_name, role_name, "--role-name")
    aws_region = flags.grammar_of(grammar.aws_region, region, "--region") if region else None
    from imagebuilder.providers.ami.export import export_ami, plan_export  # boto3: once the flags are known good

    plan = plan_export(path, bucket=s3_bucket, prefix=s3_prefix, role_name=role, region=aws_region)
    print(plan.describe())
    with status_line(f"exporting {plan.image_id}") as say, transfer_bars() as bars:
        result = export_ami(plan, dry_run=dry_run, wait=wait, say=say, transfers=bars)
    for check in result.checks:
        print(f"checked:  {check}")
    if dry_run:
        print("exported: nothing (--dry-run)")
        return
    print(f"task:     {result.task_id}\nraw disk: {result.location}")
    if result.status:
        print(f"status:   {result.status}")
