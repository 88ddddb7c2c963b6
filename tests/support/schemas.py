"""JSON schemas for structured-output tests: each small enough to finish in few tokens,
together covering the keywords constrained decoding must enforce."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS: dict[str, dict[str, Any]] = {
    "required": {
        "type": "object",
        "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested_objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "address": {
                        "type": "object",
                        "properties": {"city": _NAME},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array_min_max": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    "string_enum": {"type": "string", "enum": ["red", "green", "blue"]},
    "object_with_enum": {
        "type": "object",
        "properties": {
            "size": {"enum": ["S", "M", "L"]},
            "qty": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["size", "qty"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"}]}
        },
        "required": ["v"],
        "additionalProperties": False,
    },
    "one_of_tagged": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "circle"},
                    "r": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["kind", "r"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "square"},
                    "side": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["kind", "side"],
                "additionalProperties": False,
            },
        ]
    },
    "defs_ref": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -9, "maximum": 9},
                    "y": {"type": "integer", "minimum": -9, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "integer_bounds": {"type": "integer", "minimum": 10, "maximum": 20},
    "exclusive_bounds": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
    "number_bounds": {
        "type": "object",
        "properties": {
            "t": {"type": "number", "minimum": -1.5, "maximum": 1.5, "multipleOf": 0.25}
        },
        "required": ["t"],
        "additionalProperties": False,
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "additional_false_optional": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
        "additionalProperties": False,
    },
    "nullable": {
        "type": "object",
        "properties": {"note": {"type": ["string", "null"], "maxLength": 8}},
        "required": ["note"],
        "additionalProperties": False,
    },
    "const": {
        "type": "object",
        "properties": {"v": {"const": 42}},
        "required": ["v"],
        "additionalProperties": False,
    },
    "string_lengths": {"type": "string", "minLength": 3, "maxLength": 6},
    "format_date": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"],
        "additionalProperties": False,
    },
    "prefix_items": {
        "type": "array",
        "prefixItems": [
            {"type": "string", "maxLength": 6},
            {"type": "integer", "minimum": 0, "maximum": 9},
        ],
        "items": False,
        "minItems": 2,
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
    "all_of": {
        "allOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a"],
            },
            {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ],
        "properties": {"a": True, "b": True},
        "additionalProperties": False,
    },
    "map_values": {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
        "maxProperties": 2,
    },
    "mixed_enum": {"enum": [1, "two", None, True]},
    "boolean": {"type": "boolean"},
    "nested_arrays": {
        "type": "array",
        "items": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 2,
        },
        "minItems": 1,
        "maxItems": 2,
    },
}
