"""The versioned JSON schemas of ``env.json`` and ``results.json``, and a small validator.

No pytest import here. The schema documents live in ``pytest_nsa/schemas/``
(JSON Schema, draft 2020-12). :func:`validate` checks a document against one of
them with the subset of JSON Schema those files use, so that the report's own
tests need no extra dependency (``jsonschema``, when installed, accepts the same
files). ``schema_version`` is an integer bumped on every incompatible change
(a field removed, renamed or retyped); new optional fields keep the version.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

#: Version written into, and required by, both documents.
SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
#: Document name -> schema file in :data:`SCHEMA_DIR`.
SCHEMA_FILES: Dict[str, str] = {"env": "env.schema.json", "results": "results.schema.json"}

#: Keywords that only document (``$schema``, ``title``...); anything else unknown is an error.
_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "$defs", "examples", "default"})
_KNOWN = frozenset({"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                    "minimum", "maximum", "minLength", "pattern", "$ref", "anyOf"})
_TYPES: Dict[str, Tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


class SchemaError(ValueError):
    """A schema uses a keyword the validator does not implement, or a bad ``$ref``."""


@lru_cache(maxsize=None)
def load(name: str) -> Dict[str, Any]:
    """The schema of document ``name`` (``"env"`` or ``"results"``) as a dict."""
    if name not in SCHEMA_FILES:
        raise ValueError(f"name must be one of {', '.join(SCHEMA_FILES)}, got {name!r}")
    return json.loads((SCHEMA_DIR / SCHEMA_FILES[name]).read_text(encoding="utf-8"))


def _is(value: Any, type_name: str) -> bool:
    # JSON has no bool/int overlap: True is not an integer there.
    if isinstance(value, bool) and type_name in ("integer", "number"):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[type_name])


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise SchemaError(f"only local $ref '#/...' is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            raise SchemaError(f"$ref {ref!r} points nowhere")
        node = node[part]
    return node


def _check(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], where: str, out: List[str]) -> None:
    unknown = set(schema) - _KNOWN - _ANNOTATIONS
    if unknown:
        raise SchemaError(f"{where}: unsupported schema keywords {', '.join(sorted(unknown))}")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, where, out)
    if "anyOf" in schema:
        if not any(not _errors(value, sub, root, where) for sub in schema["anyOf"]):
            out.append(f"{where}: {value!r:.60} matches none of the allowed forms")
    if "type" in schema:
        types = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
        if not any(_is(value, t) for t in types):
            out.append(f"{where}: expected {' or '.join(types)}, got {type(value).__name__} {value!r:.60}")
            return
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: expected {schema['const']!r}, got {value!r:.60}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r:.60} is not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{where}: {value} > maximum {schema['maximum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            out.append(f"{where}: shorter than {schema['minLength']} characters")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            out.append(f"{where}: {value!r:.60} does not match /{schema['pattern']}/")
    if isinstance(value, dict):
        _check_object(value, schema, root, where, out)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{where}[{i}]", out)


def _check_object(value: Dict[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any], where: str,
                  out: List[str]) -> None:
    props = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in value:
            out.append(f"{where}: missing required key {key!r}")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        path = f"{where}.{key}"
        if key in props:
            _check(item, props[key], root, path, out)
        elif extra is False:
            out.append(f"{where}: unexpected key {key!r}")
        elif isinstance(extra, Mapping):
            _check(item, extra, root, path, out)


def _errors(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], where: str) -> List[str]:
    out: List[str] = []
    _check(value, schema, root, where, out)
    return out


def validate(document: Any, schema: Mapping[str, Any]) -> List[str]:
    """Every way ``document`` breaks ``schema``, one line each (``$.path: problem``);
    an empty list when it conforms.

    Raises:
        SchemaError: the schema uses a keyword outside the implemented subset.
    """
    return _errors(document, schema, schema, "$")


def validate_named(document: Any, name: str) -> List[str]:
    """:func:`validate` against the shipped schema ``name`` (``"env"`` or ``"results"``)."""
    return validate(document, load(name))
