"""L3's output format: a fenced block of components, a small JSX subset.

    <Card title="Sleep hours">
        <LineChart data={[{ label: "Mon", value: 7 }]} interactive />
    </Card>

A block is one or more elements; an element is self-closing or has children
(elements or text) and a closing tag of the same name; attributes are a string,
a braced expression (balanced braces) or a bare flag. The grammar is Lark's
(`parse_components` raises `ComponentError` with the position on any violation),
so the quality benchmark and tests read L3's answers exactly as a renderer would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

from lark import Lark, Token, Tree
from lark.exceptions import LarkError

GRAMMAR = r"""
start: element+
element: "<" NAME attr* "/>"                         -> leaf
       | "<" NAME attr* ">" child* "</" NAME ">"      -> parent
?child: element | TEXT | braced
attr: NAME "=" (STRING | braced)                     -> valued
    | NAME                                           -> flag
braced: "{" (BRACED_TEXT | STRING | braced)* "}"
NAME: /[A-Za-z_][A-Za-z0-9_.\-]*/
STRING: /"[^"\n]*"/ | /'[^'\n]*'/
TEXT: /[^<>{}\s][^<>{}]*/
BRACED_TEXT: /[^{}"']+/
%import common.WS
%ignore WS
"""

_FENCE = re.compile(r"```(?:jsx|tsx|html)?[ \t]*\n(.*?)```", re.S)


class ComponentError(ValueError):
    """The text is not a component block."""


@dataclass(frozen=True)
class Component:
    name: str
    attrs: dict[str, str | bool]
    """Attribute name -> string value (quotes removed), braced source text, or True for a flag."""
    children: list["Component"] = field(default_factory=list)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


@cache
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="earley", lexer="dynamic")


def _source(tree: Tree | Token) -> str:
    if isinstance(tree, Token):
        return str(tree)
    return "{" + " ".join(_source(c) for c in tree.children) + "}"


def _component(tree: Tree) -> Component:
    name, *rest = tree.children
    attrs: dict[str, str | bool] = {}
    children: list[Component] = []
    for node in rest:
        if isinstance(node, Tree) and node.data == "valued":
            key, value = node.children
            attrs[str(key)] = str(value)[1:-1] if isinstance(value, Token) else _source(value)
        elif isinstance(node, Tree) and node.data == "flag":
            attrs[str(node.children[0])] = True
        elif isinstance(node, Tree) and node.data in ("leaf", "parent"):
            children.append(_component(node))
        elif isinstance(node, Token) and node.type == "NAME":  # the closing tag's name
            if str(node) != str(name):
                raise ComponentError(f"<{name}> closed by </{node}> (line {node.line})")
    return Component(str(name), attrs, children)


def parse_components(text: str) -> list[Component]:
    """The elements of a bare component block."""
    try:
        tree = _parser().parse(text.strip())
    except LarkError as exc:
        raise ComponentError(str(exc).splitlines()[0]) from None
    return [_component(t) for t in tree.children]


def component_block(answer: str) -> str:
    """The first fenced block of an answer, or the answer itself when it is not fenced."""
    match = _FENCE.search(answer)
    return match.group(1) if match else answer


__all__ = ["Component", "ComponentError", "GRAMMAR", "component_block", "parse_components", "ui_check"]


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def ui_check(answer: str, contains: list[list[str]]) -> tuple[bool, bool]:
    """(parses, contains every asked-for group): component names and attribute values (strings and
    braced expressions: a chart's data) count, each alternative as whole words (\"8\" is not in 82)."""
    try:
        elements = parse_components(component_block(answer))
    except ComponentError:
        return False, False
    words: set[str] = set()
    for element in elements:
        for c in element.walk():
            words.add(c.name.casefold())
            words.update(_words(str(v)) for v in c.attrs.values() if isinstance(v, str))
    found = all(any(re.search(rf"(?<!\w){re.escape(_words(alt))}(?!\w)", w) for alt in group for w in words)
                for group in contains)
    return True, found
