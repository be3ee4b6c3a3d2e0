"""A safe YAML loader that remembers the line of every mapping key.

Profiles are validated after loading, and an error must point at ``file:line``.
PyYAML's composer keeps marks on nodes; :func:`load` turns the node tree into
plain Python values, except that mappings become :class:`LinedDict` (a ``dict``
with the 1-based line of the mapping and of each key) and sequences become
:class:`LinedList`.

Two departures from PyYAML's YAML 1.1 defaults, both to avoid silent surprises
in hand-written numbers: ``1e-5`` reads as a float (PyYAML reads it as text
without a dot), and a duplicated key is an error instead of "last one wins".
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode


class YAMLLoadError(ValueError):
    """The text is not valid YAML; the message starts with ``file:line:column``."""


class LinedDict(dict):
    """A mapping from a YAML file; ``line`` is where it starts, ``key_lines[key]`` where each key is."""

    line: int = 0
    key_lines: Dict[Any, int]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LinedList(list):
    """A sequence from a YAML file; ``line`` is where it starts."""

    line: int = 0


class _Loader(yaml.SafeLoader):
    """SafeLoader that also resolves exponent-only floats such as ``1e-5``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _build(node: Node, loader: _Loader, filename: str) -> Any:
    line = node.start_mark.line + 1
    if isinstance(node, MappingNode):
        out = LinedDict()
        out.line, out.key_lines = line, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise YAMLLoadError(f"{filename}:{key_line}: a mapping key must be a plain scalar, not {key!r}")
            if key in out:
                raise YAMLLoadError(f"{filename}:{key_line}: duplicate key {key!r} (first at line {out.key_lines[key]})")
            out[key] = _build(value_node, loader, filename)
            out.key_lines[key] = key_line
        return out
    if isinstance(node, SequenceNode):
        seq = LinedList(_build(item, loader, filename) for item in node.value)
        seq.line = line
        return seq
    if isinstance(node, ScalarNode):
        return loader.construct_object(node, deep=True)
    raise YAMLLoadError(f"{filename}:{line}: unsupported YAML node {type(node).__name__}")


def load(text: str, filename: str) -> Optional[Any]:
    """Parse one YAML document; ``None`` for an empty one.

    Raises:
        YAMLLoadError: syntax error, duplicate key or non-scalar key, with ``file:line``.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _build(node, loader, filename)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        what = " ".join(p for p in (err.context, err.problem) if p)
        raise YAMLLoadError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise YAMLLoadError(f"{filename}: invalid YAML: {err}") from None
    finally:
        loader.dispose()


def line_of(value: Any, key: Optional[Any] = None) -> int:
    """Line of ``value`` (or of ``key`` inside it); 0 when the value carries no position."""
    if isinstance(value, LinedDict):
        return value.line_of(key) if key is not None else value.line
    return getattr(value, "line", 0)


def plain(value: Any) -> Any:
    """``value`` with :class:`LinedDict`/:class:`LinedList` turned into ``dict``/``list``."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


__all__: List[str] = ["LinedDict", "LinedList", "YAMLLoadError", "line_of", "load", "plain"]
