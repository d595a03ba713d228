"""YAML text → plain values for the configuration files, with hostile text bounded.

`yaml.safe_load` builds no objects but still trusts the text's size: an alias repeats its
anchor's node by reference, so a few kilobytes of nested aliases (a "billion laughs") stand for
billions of nodes, which validation then walks one by one, for hours; a recursive alias makes a
value that contains itself; and nesting a few thousand levels deep overflows the parser's stack.
`read_yaml(text)` composes the document once, then refuses it unless

- its nodes, counted with every alias expanded, number at most `MAX_EXPANDED_NODES`;
- no alias refers to a node that contains it;
- it nests at most `MAX_DEPTH` levels (the composer recurses once per level);

and raises `YamlRefused` with the reason; any other problem is `yaml.YAMLError` as before.
A plain configuration (a few hundred nodes, a handful of anchors) is far within all three.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 200


class YamlRefused(ValueError):
    """The text is YAML, but not one this process will expand."""


def read_yaml(text: str) -> Any:
    """The document in `text` as plain values (`None` for an empty one); raises `YamlRefused`
    or `yaml.YAMLError`."""
    loader = yaml.SafeLoader(text)  # not libyaml's: its error locations are less precise
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlRefused("nested too deeply to read") from None
        if node is None:
            return None
        _check_expansion(node)
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise YamlRefused(str(exc)) from None
    finally:
        loader.dispose()


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Count the expanded nodes of the graph under `root` (each node once, by identity, with
    the sizes of shared nodes memoised); refuse cycles, depth and size over the bounds."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > MAX_EXPANDED_NODES:
                raise YamlRefused(
                    f"expands to more than {MAX_EXPANDED_NODES:,} values "
                    "(aliases repeating aliases)"
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise YamlRefused("an alias refers to a value that contains it")
        if depth > MAX_DEPTH:
            raise YamlRefused(f"nested more than {MAX_DEPTH} levels deep")
        open_nodes.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node))
