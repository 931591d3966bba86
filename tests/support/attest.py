"""Checks of an image's SBOM and provenance by other people's tools: the SPDX project's spdx-tools, the in-toto
project's own Python bindings (protobuf, strict), JSON Schemas written from the in-toto and SLSA specifications
(checked by the jsonschema validator check-jsonschema uses), and securesystemslib's DSSE verification."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.common import ROOT

SCHEMAS = ROOT / "tests" / "schemas"


def spdx_problems(path: Path) -> list[str]:
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    return [m.validation_message for m in validate_full_spdx_document(parse_file(str(path)))]


def check_sbom(path: Path, image: Path | None = None) -> dict[str, Any]:
    """Valid per spdx-tools, describing ``image`` by its SHA-256; returns the document."""
    problems = spdx_problems(path)
    assert not problems, problems[:10]
    doc = json.loads(path.read_text())
    described = next(p for p in doc["packages"] if p["SPDXID"] == doc["documentDescribes"][0])
    if image is not None:
        from imagebuilder.core.files import sha256_file

        assert described["name"] == image.name
        assert described["checksums"] == [{"algorithm": "SHA256", "checksumValue": sha256_file(image)}]
    return dict(doc)


def schema_errors(statement: dict[str, Any]) -> list[str]:
    import jsonschema
    from referencing import Registry, Resource

    docs = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    registry = Registry().with_resources([(doc["$id"], Resource.from_contents(doc)) for doc in docs.values()])
    errors = []
    for schema, instance in (("in-toto-statement-v1.schema.json", statement),
                             ("slsa-provenance-v1.schema.json", statement.get("predicate"))):  # fmt: skip
        validator = jsonschema.Draft202012Validator(
            docs[schema], registry=registry, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        errors += [f"{schema}: {e.json_path}: {e.message}" for e in validator.iter_errors(instance)]
    return errors


def in_toto_problems(statement: dict[str, Any]) -> list[str]:
    """The in-toto project's own validation (its protobuf bindings, unknown fields refused)."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    try:
        message = json_format.Parse(json.dumps(statement), statement_pb2.Statement())
        Statement.copy_from_pb(message).validate()
        json_format.Parse(json.dumps(statement["predicate"]), provenance_pb2.Provenance())
    except Exception as exc:  # the bindings raise ValueError and protobuf's ParseError
        return [f"{type(exc).__name__}: {exc}"]
    return []


def check_provenance(path: Path, public_key: Path, image: Path) -> dict[str, Any]:
    """Signed by ``public_key`` (securesystemslib), about ``image``, naming its SBOM; valid per both schemas and
    the in-toto bindings. Returns the statement."""
    from imagebuilder.attest.keys import load_public_key
    from imagebuilder.attest.provenance import verify

    statement = verify(path, load_public_key(public_key), image)
    assert not schema_errors(statement), schema_errors(statement)
    assert not in_toto_problems(statement), in_toto_problems(statement)
    return statement
