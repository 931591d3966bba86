"""Property test of what image.rebuild reads from a provenance (issue 45): whatever an unsigned statement's
parameters and dependencies hold, reading it gives a record or exit 2 naming the provenance, never a crash; a record
is only given for a chroot build that records everything a rebuild needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuilder.attest import provenance as p
from imagebuilder.core.errors import ImageBuilderError, InputError
from imagebuilder.flows.rebuild import read_recorded

SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=30) | st.floats(allow_nan=False)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
GOOD = {
    "os": "ubuntu", "provider": "baremetal", "release_channel": "1-24", "source_date_epoch": 1669852800,
    "hash_seed": "00000000-0000-0000-0000-000000000000", "runtime": "os", "disk_gb": 4, "engine": "chroot",
}  # fmt: skip
SUBJECT = [{"name": "i.gz", "digest": {"sha256": "a" * 64}}]


def _statement(params: object, deps: object, subject: object) -> dict[str, object]:
    return {"_type": p.STATEMENT_TYPE, "subject": subject, "predicateType": p.PREDICATE_TYPE,
            "predicate": {"buildDefinition": {"externalParameters": params, "resolvedDependencies": deps}}}  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from([*GOOD, "config", "config_secrets", "layered", "x"]), JSON, max_size=10) | JSON,
       st.lists(st.fixed_dictionaries({"name": st.sampled_from(["source-image", "release-manifest", "config:x"])},
                                      optional={"uri": JSON, "digest": JSON, "annotations": JSON})) | JSON,
       st.just(SUBJECT) | JSON)  # fmt: skip
def test_any_record_is_read_or_refused(tmp_path: Path, params: object, deps: object, subject: object) -> None:
    path = tmp_path / "x.intoto.json"
    path.write_text(json.dumps(p.unsigned(_statement(params, deps, subject))))
    try:
        recorded = read_recorded(path)
    except InputError as exc:
        assert exc.exit_code == 2
        return
    except ImageBuilderError as exc:  # a statement that is no in-toto statement: exit 1 (as image.verify says)
        assert exc.exit_code == 1
        return
    assert recorded.params["engine"] == "chroot" and all(k in recorded.params for k in GOOD)
    assert isinstance(recorded.params.get("layered", False), bool)


def test_a_complete_record_is_read(tmp_path: Path) -> None:
    path = tmp_path / "x.intoto.json"
    deps = [{"name": "source-image", "uri": "/x/base.qcow2", "digest": {"sha256": "b" * 64}}]
    path.write_text(json.dumps(p.unsigned(_statement(GOOD, deps, SUBJECT))))
    recorded = read_recorded(path)
    assert recorded.subject == "i.gz" and recorded.inputs["source-image"] == ("/x/base.qcow2", None, "b" * 64)
    for missing in GOOD:
        partial = {k: v for k, v in GOOD.items() if k != missing}
        path.write_text(json.dumps(p.unsigned(_statement(partial, deps, SUBJECT))))
        with pytest.raises(InputError):
            read_recorded(path)


@pytest.mark.parametrize("value", ["true", 1, 0, None, [], {"a": 1}, "x" * 10000])
def test_layered_is_true_or_false_or_refused(tmp_path: Path, value: object) -> None:
    """A matrix image's record says ``layered: true`` (a rebuild then runs two phases); anything else is refused
    by name, the value shown short."""
    path = tmp_path / "x.intoto.json"
    deps = [{"name": "source-image", "uri": "/x/base.qcow2", "digest": {"sha256": "b" * 64}}]
    for ok in (True, False):
        path.write_text(json.dumps(p.unsigned(_statement({**GOOD, "layered": ok}, deps, SUBJECT))))
        assert read_recorded(path).params["layered"] is ok
    path.write_text(json.dumps(p.unsigned(_statement({**GOOD, "layered": value}, deps, SUBJECT))))
    with pytest.raises(InputError, match="records layered as") as err:
        read_recorded(path)
    assert len(str(err.value)) < 600
