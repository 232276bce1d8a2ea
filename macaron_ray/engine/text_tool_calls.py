"""Tool calls written as plain text, parsed once the answer is whole.

vLLM 0.29's streaming `pythonic` parser holds back every delta once an answer
starts with `[`, and when the whole answer turns out not to be a list of calls
(`[Sunny, 22C]`, or a call followed by words) it never flushes them: the client
gets an empty answer for tokens that were generated. Its non-streaming parser
returns such text as the answer. So for turns whose tool choice is "auto" the
engine clients ask the engine for plain text (`tool_choice: "none"`: the tools
stay in the prompt) and parse the calls here with the non-streaming parser's
rule. Text that cannot begin a call streams at once; only an answer that starts
like a call is held until it is whole.

Written here rather than imported: importing vLLM's parser module costs the API
process about 6 s and 560 MB of resident memory (measured 2026-12-07), which the
standalone ingress does not otherwise pay. `tests/unit/test_text_tool_calls.py`
holds it to vLLM's `PythonicToolParser.extract_tool_calls` on the same outputs.
"""

from __future__ import annotations

import ast
import json
import re
import uuid

from macaron_ray.core.conversation import FunctionCall, ToolCall

TEXT_PARSERS = frozenset({"pythonic"})
"""vLLM tool-call parsers whose format the engine clients parse from plain text themselves."""

_CALL_LIST = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(", re.DOTALL)


_NAME = re.compile(r"[A-Za-z_][\w.]*")


def may_become_calls(text: str) -> bool:
    """Whether an answer that begins with `text` could still be a list of calls (hold it back): it
    is still empty, or `[`, then a function's name, then `(` so far. `[1] Smith et al.` is let go at
    its second character; a list that opens a call is held until the answer is whole."""
    if not text.strip():
        return True
    if not text.startswith("["):
        return False
    rest = text[1:].lstrip()
    name = _NAME.match(rest)
    if not rest or (name and name.end() == len(rest)):
        return True
    after = rest[name.end():].lstrip() if name else None
    return after is not None and (not after or after.startswith("("))


def pythonic_calls(text: str) -> tuple[ToolCall, ...] | None:
    """The calls of an answer that is exactly a Python list of calls with literal keyword
    arguments (`[f(a=1), g(b="x")]`), as vLLM's pythonic parser reads it; None for any other text."""
    if not _CALL_LIST.match(text):
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not (isinstance(node, ast.List) and node.elts and all(isinstance(e, ast.Call) for e in node.elts)):
        return None
    calls = []
    for call in node.elts:
        name = _dotted(call.func)
        if name is None or call.args:
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if len(arguments) != len(call.keywords):
            return None
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(
            name=name, arguments=json.dumps(arguments, ensure_ascii=False))))
    return tuple(calls)


def _dotted(func: ast.expr) -> str | None:
    """`f` or `a.b.f` (vLLM keeps the dotted form as the name); None for anything else."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    return ".".join([func.id, *reversed(parts)])


def whole_calls(calls: tuple[ToolCall, ...], *, forced: bool) -> tuple[ToolCall, ...]:
    """`calls` as delivered: without calls cut off before their arguments were whole when a whole
    one is there and, when the call was forced, without repeats of the same function with the same
    arguments. A small model forced to call (vLLM's schema for "required" or a named function asks
    for a list of at least one call) may write the call again until its token budget ends; a model
    that chose to call twice alike meant it. Arguments are compared as JSON values: the same object
    written with other spacing is the same call."""
    whole = tuple(c for c in calls if _is_object(c.function.arguments))
    if not forced:
        return whole or calls
    seen, out = set(), []
    for c in whole or calls:
        key = (c.function.name, _canonical(c.function.arguments))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return tuple(out)


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        return arguments


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except (ValueError, RecursionError):
        return False
