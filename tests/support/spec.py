"""Validate response bodies and stream chunks against the published OpenAPI specs.

The specs are kept in the repository, in tests/fixtures/specs (its README.md gives
each file's source and licence), so the tests need nothing beside the checkout.
OpenAPI 3.0's `nullable` is turned into JSON Schema's null type so jsonschema can
check it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SPECS = Path(__file__).resolve().parents[1] / "fixtures" / "specs"


def _nullable_to_null(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _nullable_to_null(v) for k, v in node.items()}
        if node.pop("nullable", False):
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable_to_null(v) for v in node]
    return node


@functools.cache
def load_spec(name: str) -> dict[str, Any]:
    path = SPECS / name
    text = path.read_text()
    raw = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=yaml.CSafeLoader)
    spec: dict[str, Any] = _nullable_to_null(raw)
    return spec


@functools.cache
def validator(spec_name: str, schema_name: str) -> jsonschema.Draft202012Validator:
    """A validator for components/schemas/<schema_name> with every $ref resolvable."""
    registry: Registry = Registry().with_resource(
        "urn:spec", DRAFT202012.create_resource(load_spec(spec_name))
    )
    schema = {"$ref": f"urn:spec#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_openai(schema_name: str, instance: Any) -> None:
    validator("openai-openapi.yaml", schema_name).validate(instance)
