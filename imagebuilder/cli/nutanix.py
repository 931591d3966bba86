"""``nutanix.*``: before a Nutanix build, the source cloud image it starts from, created in Prism (spec 4.3)."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task, transfer_bars
from imagebuilder.core import grammar
from imagebuilder.core.errors import InputError


@task(
    help={
        "config": "the nutanix build config (spec 2.3): Prism's endpoint, port, insecure flag, user and password",
        "url": "http(s) URL Prism pulls the image from (this or --file)",
        "file": "a local image file to upload (this or --url)",
        "name": "the image's name in Prism: what the config's source_image_name names (default: that name)",
        "sha256": "the expected SHA-256 of --url's image (a file's is computed)",
        "force": "replace an image of that name whose content differs (without it that is an error)",
        "dry_run": "check the config, the source and what Prism holds under that name; create nothing",
    },
)
@cli_task
def image_upload(
    c: Context,
    config: str = "",
    url: str = "",
    file: str = "",
    name: str = "",
    sha256: str = "",
    force: bool = False,
    dry_run: bool = False,
) -> None:
    """Create the build's source image in Prism Central from a URL or a file, idempotent by name (spec 4.3).

    Examples:
        image-builder nutanix.image-upload --config nutanix.json --file ubuntu.gz --dry-run
    """
    path = flags.existing_file(flags.required(config, "--config", "the nutanix build config"), "--config")
    if bool(url) == bool(file):
        raise InputError("give exactly one source", field="--url/--file", expected="--url URL or --file PATH")
    source = flags.existing_file(file, "--file") if file else None
    if url:
        flags.url(url, "--url", ("http", "https"))
    if sha256 and source:
        raise InputError("a SHA-256 is given with --url only", field="--sha256", expected="64 hex digits, with --url")
    if sha256:
        sha256 = flags.hex_digest(sha256, "--sha256", "sha256")
    given_name = flags.grammar_of(lambda v: grammar.display_name(v, "Prism image", 256), name, "--name") if name else ""
    from imagebuilder.providers.nutanix.image_upload import UploadRequest, prism_from_config, upload_image
    from imagebuilder.providers.nutanix.provider import load_nutanix_config

    loaded = load_nutanix_config(path)
    image_name = given_name or loaded.source_image_name
    if not image_name:
        raise InputError("no image name", field="--name", expected="--name, or source_image_name in the config")
    request = UploadRequest(image_name, url or None, Path(source) if source else None, sha256 or None, force)
    with status_line(f"image {image_name}") as say, transfer_bars() as bars:
        result = upload_image(request, prism_from_config(loaded), dry_run=dry_run, say=say, transfers=bars)
    print(f"image:    {image_name} ({result.uuid or '-'}): {result.action}")
