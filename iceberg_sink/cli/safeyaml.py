"""YAML for config files, stricter than ``yaml.safe_load`` where a config file needs it.

- A key given twice in one mapping is an error naming the key and both lines (PyYAML keeps the
  last one silently, so ``table:`` written twice would run against the second table).
- A document whose aliases would expand to more than :data:`MAX_EXPANDED_NODES` nodes is refused
  before it is built ("billion laughs": a few lines of nested anchors that expand to 10^9 strings
  once anything walks the document as a tree, as the environment-variable expansion does).

Errors are ``yaml.YAMLError`` with a ``problem`` and a ``problem_mark`` (its line and column), like
PyYAML's own, so callers report every YAML problem one way.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_EXPANDED_NODES = 100_000
"""Nodes a config document may hold once every alias is expanded (a large config holds hundreds)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
    """``yaml.SafeLoader`` refusing duplicate keys."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<: *defaults` merges; a key given next to it overrides, as YAML says
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                earlier = first.get(key)
            except TypeError:
                continue  # an unhashable key: PyYAML's own construction reports it
            if earlier is not None:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first given at line {earlier.start_mark.line + 1}); "
                    "expected each key once",
                    key_node.start_mark,
                )
            first[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-untyped-call,no-any-return]


def _check_expansion(root: Node) -> None:
    """Raise when ``root`` expanded (every alias replaced by its anchor's node) exceeds the bound.

    Aliases are shared nodes in the composed graph: the expanded size of a node is one plus its
    children's, memoised per node, so this costs one visit per distinct node however large the
    expansion would be.
    """
    sizes: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done and id(node) in started:
            # Popped again while its own children are pending: the node contains itself.
            raise ConstructorError(
                None, None, "an alias refers to a node that contains it (a recursive document)", node.start_mark
            )
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            sizes[id(node)] = 1
            continue
        if not children_done:
            started.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        size = 1 + sum(sizes.get(id(c), 1) for c in children)
        if size > MAX_EXPANDED_NODES:
            raise ConstructorError(
                None,
                None,
                f"the document's aliases expand to more than {MAX_EXPANDED_NODES} nodes (nested anchors "
                "referring to each other); expected a config file of ordinary size",
                node.start_mark,
            )
        sizes[id(node)] = size


def load(text: str) -> Any:
    """The one document of ``text``, checked as the module docstring says.

    Raises:
        yaml.YAMLError: not valid YAML, a duplicate key, or aliases expanding past the bound.
    """
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()  # type: ignore[no-untyped-call]
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)  # type: ignore[no-untyped-call]
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]
