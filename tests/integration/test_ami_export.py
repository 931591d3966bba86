"""``ami.export`` (spec 4.4, issue 17) against moto in server mode on 127.0.0.1, and botocore's Stubber.

What met what:
- moto (a real HTTP server the real boto3 talks to): the AMI lookup (DescribeImages on an image made with
  RunInstances + CreateImage), the bucket (HeadBucket, GetBucketLocation on buckets made in two regions), the role
  (IAM GetRole), credentials and endpoints as boto3 resolves them. The CLI runs as a user runs it, against it.
- botocore's Stubber (moto implements neither): ExportImage and DescribeExportImageTasks. The Stubber checks each
  request against EC2's service model (parameter names, types, required members), so a malformed call fails here;
  the S3 and IAM checks of the same run still go to moto.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError
from imagebuilder.providers.ami.export import Clients, ExportPlan, export_ami, plan_export
from tests.support.common import BIN, run
from tests.support.moto import KEYS, moto_server

REGION = "us-west-2"


@pytest.fixture(scope="module")
def moto() -> Iterator[dict[str, str]]:
    """moto_server on 127.0.0.1; the environment that points boto3 (in tests and in the CLI) at it."""
    with moto_server() as env:
        yield {k: v for k, v in env.items() if k != "AWS_DEFAULT_REGION"}


@pytest.fixture(scope="module")
def aws(moto: dict[str, str]) -> dict[str, Any]:
    """In moto: an available AMI, buckets in the AMI's region and in another, the vmimport role."""

    def client(service: str, region: str = REGION) -> Any:
        return boto3.client(service, region_name=region, endpoint_url=moto["AWS_ENDPOINT_URL"],
                            aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip

    ec2 = client("ec2")
    base = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ami = ec2.create_image(InstanceId=instance, Name="ubuntu-v1.24.17-eks-36")["ImageId"]
    s3 = client("s3")
    s3.create_bucket(Bucket="node-exports", CreateBucketConfiguration={"LocationConstraint": REGION})
    client("s3", "eu-west-1").create_bucket(
        Bucket="far-away-exports", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "vmie.amazonaws.com"},
             "Action": "sts:AssumeRole"}]}  # fmt: skip
    client("iam").create_role(RoleName="vmimport", AssumeRolePolicyDocument=json.dumps(trust))
    return {"ami": ami, "client": client}


def manifest(tmp_path: Path, artifact_id: str, **extra: Any) -> Path:
    """Packer's manifest post-processor output, as the AMI build writes it."""
    path = tmp_path / "packer-manifest.json"
    build = {"name": "node", "builder_type": "amazon-ebs", "build_time": 1732500000, "files": None,
             "artifact_id": artifact_id, "packer_run_uuid": "4b7d0c9e-0000-4000-8000-000000000001",
             "custom_data": None} | extra  # fmt: skip
    path.write_text(json.dumps({"builds": [build], "last_run_uuid": build["packer_run_uuid"]}))
    return path


def test_dry_run_checks_the_ami_bucket_and_role_in_moto(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path
) -> None:
    path = manifest(tmp_path, f"{REGION}:{aws['ami']}")
    res = run("ami.export", "--manifest", str(path), "--bucket", "node-exports", "--prefix", "exports/nodes/",
              "--dry-run", env=moto)  # fmt: skip
    assert res.code == 0, res.err
    assert f"export {aws['ami']} ({REGION}, builds[0] of packer-manifest.json) as RAW" in res.out
    assert "s3://node-exports/exports/nodes/<export task id>.raw" in res.out
    assert f"checked:  {aws['ami']}: available in {REGION}" in res.out
    assert f"checked:  bucket node-exports: exists, in {REGION}" in res.out
    assert "checked:  role vmimport: exists" in res.out and "exported: nothing" in res.out
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in res.out + res.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bucket", "far-away-exports"], "bucket far-away-exports is in eu-west-1, the AMI in us-west-2"),
        (["--bucket", "no-such-bucket-here"], "checking bucket no-such-bucket-here"),
        (["--bucket", "node-exports", "--role-name", "vmimport-missing"], "NoSuchEntity"),
    ],
)
def test_what_the_export_needs_is_checked_before_it_starts(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path, args: list[str], needle: str
) -> None:
    res = run("ami.export", "--manifest", str(manifest(tmp_path, f"{REGION}:{aws['ami']}")), *args, "--dry-run",
              env=moto)  # fmt: skip
    assert res.code == 1 and needle in res.err, res.err


def test_an_ami_that_is_not_there_is_an_external_error(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path
) -> None:
    res = run("ami.export", "--manifest", str(manifest(tmp_path, f"{REGION}:ami-0123456789abcdef0")),
              "--bucket", "node-exports", "--dry-run", env=moto)  # fmt: skip
    assert res.code == 1 and "ami-0123456789abcdef0" in res.err, res.err


def test_no_credentials_is_named_and_no_secret_is_asked_for_on_the_command_line(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path
) -> None:
    env = {k: v for k, v in moto.items() if k not in KEYS}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | env
    proc = subprocess.run(
        [str(BIN / "image-builder"), "ami.export", "--manifest", str(manifest(tmp_path, f"{REGION}:{aws['ami']}")),
         "--bucket", "node-exports", "--dry-run"], env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "no AWS credentials found" in proc.stderr and "AWS_PROFILE" in proc.stderr
    assert "Traceback" not in proc.stderr
    help_text = run("ami.export", "--help").out
    assert "--secret" not in help_text and "--access-key" not in help_text


@pytest.mark.parametrize(
    ("artifact", "args", "needle"),
    [
        ("ami-0123456789abcdef0", [], "no colon"),
        ("us-west-2:img-1", [], "expected an AMI ID"),
        ("mars-north-1x:ami-0123456789abcdef0", [], "expected an AWS region"),
        ("us-west-2:ami-0123456789abcdef0,eu-west-1:ami-0123456789abcdef1", [], "names AMIs in 2 regions"),
        ("us-west-2:ami-0123456789abcdef0", ["--region", "eu-west-1"], "has no AMI in eu-west-1"),
        ("us-west-2:ami-0123456789abcdef0", ["--bucket", "Bad_Bucket"], "--bucket"),
        ("us-west-2:ami-0123456789abcdef0", ["--bucket", "192.168.1.1"], "--bucket"),
        ("us-west-2:ami-0123456789abcdef0", ["--region", "us-west-2; rm -rf /"], "--region"),
        ("us-west-2:ami-0123456789abcdef0", ["--prefix", "../up"], "--prefix"),
        ("us-west-2:ami-0123456789abcdef0", ["--role-name", "vm import"], "--role-name"),
    ],
)
def test_bad_input_exits_2_before_any_call(tmp_path: Path, artifact: str, args: list[str], needle: str) -> None:
    path = manifest(tmp_path, artifact)
    base = ["--bucket", "node-exports"] if "--bucket" not in args else []
    # an endpoint nothing listens on: had any call been made, the exit would be 1, not 2
    res = run("ami.export", "--manifest", str(path), *base, *args, env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert res.code == 2 and needle in res.err, res.err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{", "line 1"),
        (json.dumps({"builds": []}), "no build in the manifest"),
        (json.dumps({"builds": [{"artifact_id": "us-west-2:ami-0123456789abcdef0", "artifactid": 1}]}), "artifactid"),
        (json.dumps({"last_run_uuid": "x"}), "builds"),
    ],
)
def test_a_bad_manifest_is_named(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(content)
    res = run("ami.export", "--manifest", str(path), "--bucket", "node-exports")
    assert res.code == 2 and needle in res.err and "m.json" in res.err, res.err
    assert run("ami.export", "--manifest", str(tmp_path / "none.json"), "--bucket", "b-1").code == 2


def stubbed(aws: dict[str, Any], tmp_path: Path, prefix: str = "") -> tuple[ExportPlan, Clients, Stubber]:
    """The export of moto's AMI, with EC2 through the Stubber (ExportImage is not in moto; the AMI lookup is stubbed
    first, as the preflight makes it) and S3 and IAM through moto."""
    ami = aws["ami"]
    plan = plan_export(manifest(tmp_path, f"{REGION}:{ami}"), "node-exports", prefix, "vmimport", None)
    ec2 = aws["client"]("ec2")
    stub = Stubber(ec2)
    stub.add_response("describe_images", {"Images": [{"ImageId": ami, "State": "available"}]}, {"ImageIds": [ami]})
    return plan, Clients(ec2=ec2, s3=aws["client"]("s3"), iam=aws["client"]("iam")), stub


def test_export_starts_once_and_is_followed_to_completion(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path
) -> None:
    ami = aws["ami"]
    plan, clients, stub = stubbed(aws, tmp_path, "exports/nodes")
    stub.add_response(
        "export_image",
        {"ExportImageTaskId": "export-ami-0a1b2c3d4e5f60718", "DiskImageFormat": "raw", "Status": "active"},
        {"ImageId": ami, "DiskImageFormat": "RAW", "RoleName": "vmimport", "ClientToken": plan.client_token,
         "S3ExportLocation": {"S3Bucket": "node-exports", "S3Prefix": "exports/nodes/"}, "Description": ANY},
    )  # fmt: skip
    for status, progress in (("active", "40"), ("active", "85"), ("completed", None)):
        task = {"ExportImageTaskId": "export-ami-0a1b2c3d4e5f60718", "Status": status}
        stub.add_response(
            "describe_export_image_tasks",
            {"ExportImageTasks": [task | ({"Progress": progress} if progress else {})]},
            {"ExportImageTaskIds": ["export-ami-0a1b2c3d4e5f60718"]},
        )
    advanced: list[int] = []
    said: list[str] = []
    with stub:
        result = export_ami(plan, wait=True, clients=lambda region: clients, interval=0, say=said.append,
                            transfers=lambda label, total: advanced.append)  # fmt: skip
        stub.assert_no_pending_responses()
    assert result.task_id == "export-ami-0a1b2c3d4e5f60718" and result.status == "completed"
    assert result.location == "s3://node-exports/exports/nodes/export-ami-0a1b2c3d4e5f60718.raw"
    assert sum(advanced) == 100 and advanced[0] == 40
    assert any("40%" in s for s in said)
    # a rerun asks with the same client token: EC2 answers with the task already started, not a second export
    prefix = grammar.s3_prefix("exports/nodes/")  # as the CLI canonicalizes it
    again = plan_export(manifest(tmp_path, f"{REGION}:{ami}"), "node-exports", prefix, "vmimport", None)
    assert again.client_token == plan.client_token and len(plan.client_token) <= 64


def test_an_export_that_fails_names_the_services_message(
    moto: dict[str, str], aws: dict[str, Any], tmp_path: Path
) -> None:
    ami = aws["ami"]
    plan, clients, stub = stubbed(aws, tmp_path)
    stub.add_response("export_image", {"ExportImageTaskId": "export-ami-0fff"}, {
        "ImageId": ami, "DiskImageFormat": "RAW", "RoleName": "vmimport", "ClientToken": ANY,
        "S3ExportLocation": {"S3Bucket": "node-exports"}, "Description": ANY})  # fmt: skip
    stub.add_response("describe_export_image_tasks", {"ExportImageTasks": [{
        "ExportImageTaskId": "export-ami-0fff", "Status": "deleted",
        "StatusMessage": "ClientError: Insufficient permissions - please verify bucket ownership"}]})  # fmt: skip
    with stub, pytest.raises(ExternalError, match="ended deleted: ClientError: Insufficient permissions"):
        export_ami(plan, wait=True, clients=lambda region: clients, interval=0)
    assert plan.location("export-ami-0fff") == "s3://node-exports/export-ami-0fff.raw"


def test_a_refused_export_call_is_an_external_error(moto: dict[str, str], aws: dict[str, Any], tmp_path: Path) -> None:
    plan, clients, stub = stubbed(aws, tmp_path)
    stub.add_client_error("export_image", "InvalidParameter", "The image uses an unsupported boot mode")
    with stub, pytest.raises(ExternalError, match="InvalidParameter: The image uses an unsupported boot mode"):
        export_ami(plan, clients=lambda region: clients)
