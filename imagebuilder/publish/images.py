"""``image.publish``: an image with its SBOM and provenance, checked here, added to a TUF repository.

Everything local is checked before the repository is touched, so bad input exits 2 with nothing published: the
image against the ``.sha256`` written beside it, the SBOM and provenance beside it (``<stem>.spdx.json``,
``<stem>.intoto.json``), the provenance's subject against the image and its SBOM digest against the SBOM, its
signature against ``--public-key`` when given (and present in any case), the target names, the keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuilder.attest import provenance
from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import read_text, sha256_file
from imagebuilder.core.progress import Transfers
from imagebuilder.publish import repository
from imagebuilder.publish.repository import Change, NewTarget
from imagebuilder.publish.storage import open_store

if TYPE_CHECKING:
    from securesystemslib.signer import Key


@dataclass(frozen=True)
class Publication:
    targets: tuple[NewTarget, ...]
    change: Change
    signature_checked: bool


def companions(image: Path) -> tuple[Path, Path]:
    """The SBOM and the provenance of ``image``, which must be beside it."""
    found = []
    for suffix, what in ((".spdx.json", "SBOM"), (provenance.SUFFIX, "provenance")):
        path = provenance.companion(image, suffix)
        if not path.is_file():
            raise InputError(
                f"has no {what} beside it ({path.name})",
                source=image,
                field="--image",
                expected="an image as a build writes it: with its .sha256, .spdx.json and .intoto.json",
            )
        found.append(path)
    return found[0], found[1]


def check_checksum(image: Path) -> str:
    """The image's SHA-256, which must be the one its ``.sha256`` file says."""
    sums = image.with_name(image.name + ".sha256")
    if sums.is_symlink() or not sums.is_file():  # a build writes a file; a link may lead to any file's secrets
        raise InputError(f"has no {sums.name} file beside it" + (" (a symbolic link)" if sums.is_symlink() else ""),
                         source=image, field="--image",
                         expected="the image's checksum file, as a build writes it")  # fmt: skip
    text = read_text(sums, "checksum file")
    want = grammar.digest_in_sums(text, image.name)  # either case, as sha256sum -c takes it
    got = sha256_file(image)
    if want != got:
        # quoted only when it is a digest: the file's content is never echoed otherwise
        said = want or ("no SHA-256" if not text.split() else "something that is not a SHA-256 of it")
        raise InputError(
            f"{sums.name} says {said}, the image's SHA-256 is {got}",
            source=image,
            field="--image",
            expected="an image whose .sha256 matches (a partial copy or another build's checksum?)",
        )
    return got


def image_targets(image: Path, name: str, public_key: Key | None) -> tuple[NewTarget, ...]:
    """The three targets of one image (the image, its SBOM, its provenance), each checked (the module's list)."""
    published = repository.target_name(name) if name else repository.target_name(image.name, "--image")
    digest = check_checksum(image)
    sbom, prov = companions(image)
    try:
        provenance.verify(prov, public_key, image, digest)
    except ExternalError as exc:
        raise InputError(str(exc).splitlines()[0], source=prov, field="--image",
                         expected="the provenance the build of this very image wrote, signed") from None  # fmt: skip
    base = provenance.stem(published)
    return (NewTarget(published, image, digest), NewTarget(f"{base}.spdx.json", sbom),
            NewTarget(f"{base}{provenance.SUFFIX}", prov))  # fmt: skip


def publish_images(
    images: list[Path],
    repo: str,
    keys_dir: Path,
    *,
    names: list[str] | None = None,
    public_key: Key | None = None,
    days: dict[str, int] | None = None,
    dry_run: bool = False,
    transfers: Transfers | None = None,
    say: Callable[[str], None] | None = None,
) -> Publication:
    """Every image of ``images`` with its companions, all checked first, in ONE new version of the repository (a
    pipeline's images reach a fleet together). Two images under one name are refused."""
    targets: list[NewTarget] = []
    for i, image in enumerate(images):
        targets += image_targets(image, names[i] if names else "", public_key)
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise InputError(f"two images would be published as {t.name}", field="--image",
                             expected="images of distinct names")  # fmt: skip
        seen.add(t.name)
    keys = repository.load_keys(keys_dir, ("targets", "snapshot", "timestamp"))
    store = open_store(repo)
    change = repository.publish(store, keys, targets, days or repository.expiry(None), dry_run=dry_run,
                                transfers=transfers, say=say)  # fmt: skip
    return Publication(tuple(targets), change, public_key is not None)
