"""A local image customized (``image.customize``, spec 4.8): the image, the destination, the customization file,
the signing key and the host's tools are all checked before a guest boots; a dry run stops there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.progress import Say, silent
from imagebuilder.customization.model import Customization, load_customization
from imagebuilder.image import apply_customization

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

#: what customizing a local image runs on the host: the guest, its seed ISO, SSH and the customize role
TOOLS = ("qemu-system-x86_64", "qemu-img", "xorriso", "ssh", "ssh-keygen", "ansible-playbook")


@dataclass(frozen=True)
class ImageCustomization:
    """What ``image.customize`` checked (the image's kind, the customization read) and, unless a dry run, made."""

    kind: str
    customization: Customization
    result: apply_customization.Result | None = None


def customize_image(
    image: Path,
    file: Path,
    dest: Path,
    *,
    keep_user: bool = False,
    force: bool = False,
    timeout: float = 1800,
    signer: Signer | None = None,
    dry_run: bool = False,
    say: Say = silent,
) -> ImageCustomization:
    """Check everything the run needs, then (unless ``dry_run``) boot the image's copy, apply the customization
    over SSH, seal it and write it atomically at ``dest`` in the input's format."""
    customization = load_customization(file)
    kind = apply_customization.check_request(image, dest)
    require_tools(*TOOLS)
    if dry_run:
        return ImageCustomization(kind, customization)
    result = apply_customization.customize_image(image, customization, dest, keep_user=keep_user, force=force,
                                                 timeout=timeout, say=say, signer=signer)  # fmt: skip
    return ImageCustomization(kind, customization, result)
