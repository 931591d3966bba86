"""Template tags (spec 2.6): two categories (OS and distro release, named in the profile;
VirtualMachine, one tag per object) and the tags ``<os category>:<family>`` and
``<release category>:kubernetes-<maj>-<min>-<distro>-<n>``.

Category and tag names come from the profile and the release-channel model, never typed by hand: a mistyped tag is
exactly the failure spec 7.1 describes. Everything here converges: an existing category or tag is reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imagebuilder.core.errors import ExternalError
from imagebuilder.release.catalog import OperatingSystem, ReleaseChannel
from imagebuilder.release.profile import load_profile
from imagebuilder.vsphere.rest import Call, RestClient

CATEGORY = Call("GET", "/cis/tagging/category", "/com/vmware/cis/tagging/category")
CATEGORY_ID = Call("GET", "/cis/tagging/category/{id}", "/com/vmware/cis/tagging/category/{id}")
CREATE_CATEGORY = Call("POST", "/cis/tagging/category", "/com/vmware/cis/tagging/category", "create_spec")
TAGS_FOR_CATEGORY = Call("POST", "/cis/tagging/tag", "/com/vmware/cis/tagging/tag/{id}")
TAG_ID = Call("GET", "/cis/tagging/tag/{id}", "/com/vmware/cis/tagging/tag/{id}")
CREATE_TAG = Call("POST", "/cis/tagging/tag", "/com/vmware/cis/tagging/tag", "create_spec")
ATTACH = Call("POST", "/cis/tagging/tag-association/{id}", "/com/vmware/cis/tagging/tag-association/{id}")
ATTACHED = Call("POST", "/cis/tagging/tag-association", "/com/vmware/cis/tagging/tag-association")


@dataclass(frozen=True)
class ExpectedTag:
    category: str
    name: str


def expected_tags(os: OperatingSystem, channel: ReleaseChannel) -> list[ExpectedTag]:
    """The two tags a template of ``os`` for ``channel`` must carry (spec 2.6)."""
    tags = load_profile().tags
    return [
        ExpectedTag(tags.os_category, f"{tags.os_category}:{os.name}"),
        ExpectedTag(tags.release_category, f"{tags.release_category}:{channel.release_name}"),
    ]


def vm_ref(moid: str) -> dict[str, str]:
    return {"id": moid, "type": "VirtualMachine"}


class Tagging:
    """Categories and tags by name, with ids cached for the life of one session."""

    def __init__(self, rest: RestClient) -> None:
        self.rest = rest
        self._categories: dict[str, str] | None = None
        self._tags: dict[str, dict[str, str]] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self.created: list[str] = []

    def categories(self) -> dict[str, str]:
        if self._categories is None:
            self._categories = {}
            for cid in self.rest(CATEGORY) or []:
                info = self.rest(CATEGORY_ID, ident=cid)
                self._categories[info["name"]] = cid
        return self._categories

    def ensure_category(self, name: str) -> str:
        cid = self.categories().get(name)
        if cid is None:
            spec = {
                "name": name,
                "description": f"{load_profile().product.display_name} template {name}",
                "cardinality": "SINGLE",
                "associable_types": ["VirtualMachine"],
            }
            cid = str(self.rest(CREATE_CATEGORY, spec))
            self.categories()[name] = cid
            self.created.append(f"tag category {name}")
        return cid

    def tags_in(self, category_id: str) -> dict[str, str]:
        if category_id not in self._tags:
            if self.rest.dialect == "api":
                ids = self.rest(TAGS_FOR_CATEGORY, {"category_id": category_id}, action="list-tags-for-category")
            else:
                ids = self.rest(TAGS_FOR_CATEGORY, ident=category_id, action="list-tags-for-category")
            names = {}
            for tid in ids or []:
                info = self.rest(TAG_ID, ident=tid)
                names[info["name"]] = tid
                self._names[tid] = (category_id, info["name"])
            self._tags[category_id] = names
        return self._tags[category_id]

    def ensure_tag(self, tag: ExpectedTag) -> str:
        cid = self.ensure_category(tag.category)
        tid = self.tags_in(cid).get(tag.name)
        if tid is None:
            spec = {"name": tag.name, "description": "", "category_id": cid}
            tid = str(self.rest(CREATE_TAG, spec))
            self._tags[cid][tag.name] = tid
            self._names[tid] = (cid, tag.name)
            self.created.append(f"tag {tag.name}")
        return tid

    def attached(self, moid: str) -> list[ExpectedTag]:
        """The tags on a VM, as (category name, tag name)."""
        ids = self.rest(ATTACHED, {"object_id": vm_ref(moid)}, action="list-attached-tags") or []
        by_id = {cid: name for name, cid in self.categories().items()}
        out = []
        for tid in ids:
            if tid not in self._names:
                info: dict[str, Any] = self.rest(TAG_ID, ident=tid)
                self._names[tid] = (info["category_id"], info["name"])
            cid, name = self._names[tid]
            out.append(ExpectedTag(by_id.get(cid, cid), name))
        return out

    def attach(self, tag: ExpectedTag, moid: str) -> None:
        tid = self.ensure_tag(tag)
        self.rest(ATTACH, {"object_id": vm_ref(moid)}, ident=tid, action="attach")

    def attach_all(self, tags: list[ExpectedTag], moid: str) -> None:
        """Attach several tags to one VM in one call."""
        if len(tags) < 2:
            for tag in tags:
                self.attach(tag, moid)
            return
        ids = [self.ensure_tag(t) for t in tags]
        result = self.rest(
            ATTACHED, {"object_id": vm_ref(moid), "tag_ids": ids}, action="attach-multiple-tags-to-object"
        )
        if isinstance(result, dict) and not result.get("success", True):
            errors = "; ".join(str(e.get("default_message") or e) for e in result.get("error_messages") or [])
            raise ExternalError(f"attaching tags {', '.join(t.name for t in tags)} failed: {errors}")

    def detach(self, tag: ExpectedTag, moid: str) -> None:
        cid = self.categories().get(tag.category)
        tid = self.tags_in(cid).get(tag.name) if cid else None
        if tid:
            self.rest(ATTACH, {"object_id": vm_ref(moid)}, ident=tid, action="detach")
