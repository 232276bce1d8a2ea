"""Function tools as every surface hands them to the core: checked once, in the engines' shape.

The engines take OpenAI chat tools (`{"type": "function", "function": {...}}`) and a chat
`tool_choice` ("none", "auto", "required" or `{"type": "function", "function": {"name"}}`).
Each surface translates its own shapes into these; this module checks what vLLM would
otherwise refuse deep in the Serve path (a 500 there), so the client gets a 400 naming
the field:

- a tool's parameters must be a JSON Schema object whose `properties`, if any, is an object
  (the chat template iterates it);
- a named `tool_choice` must name one of the tools, and a named or required choice needs tools;
- tool-call arguments in a history must be the JSON text of an object (the chat template
  renders them as a mapping; vLLM parses them before templating).
"""

from __future__ import annotations

from macaron_ray.api.body import loads
from macaron_ray.api.errors import APIError


def check_parameters(schema: object, param: str) -> None:
    """400 unless `schema` is a JSON Schema object the chat template can render."""
    if not isinstance(schema, dict):
        raise APIError(400, f"{param} must be a JSON Schema object", param=param, code="invalid_value")
    if schema.get("type", "object") != "object":
        raise APIError(400, f"{param}.type must be 'object' (a function's arguments are an object)",
                       param=f"{param}.type", code="invalid_value")
    properties = schema.get("properties")
    if properties is not None and not (isinstance(properties, dict)
                                       and all(isinstance(v, dict) for v in properties.values())):
        raise APIError(400, f"{param}.properties must be an object mapping each parameter to its schema",
                       param=f"{param}.properties", code="invalid_value")
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise APIError(400, f"{param}.required must be a list of parameter names", param=f"{param}.required",
                       code="invalid_value")


def check_tools(tools: list[dict] | None, param: str, schema_field: str) -> None:
    """Each chat-shaped tool's parameters, reported at `{param}.{i}.{schema_field}` (the surface's path)."""
    for i, tool in enumerate(tools or ()):
        parameters = tool["function"].get("parameters")
        if parameters is not None:
            check_parameters(parameters, f"{param}.{i}.{schema_field}")


def named(name: object) -> dict:
    """The chat shape of a choice that names one function."""
    return {"type": "function", "function": {"name": name}}


def check_choice(choice: str | dict | None, tools: list[dict] | None, param: str = "tool_choice") -> str | dict | None:
    """The chat-shaped `choice` the engines get, or a 400. Without tools a choice of "none" or
    "auto" means nothing and is dropped; one that forces a call cannot be met."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f"{param} must be 'none', 'auto', 'required' or a named function",
                           param=param, code="invalid_value")
        if choice == "required" and not tools:
            raise APIError(400, f"{param} 'required' needs tools: no tools were given", param=param,
                           code="invalid_value")
        return choice if tools else None
    function = choice.get("function") if choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise APIError(400, f"{param} must be 'none', 'auto', 'required' or a named function "
                            f"({{\"type\": \"function\", \"function\": {{\"name\": ...}}}})", param=param,
                       code="invalid_value")
    known = [t["function"]["name"] for t in tools or ()]
    if name not in known:
        raise APIError(400, f"{param} names the function {name[:64]!r}, which is not one of the tools given"
                            + (f" ({', '.join(known[:16])})" if known else " (no tools were given)"),
                       param=param, code="invalid_value")
    return named(name)


def check_arguments(arguments: str, param: str) -> None:
    """400 unless a history's tool-call `arguments` is the JSON text of an object (finite numbers);
    empty text is no arguments, as the token counter and the engines' templates read it."""
    if not arguments:
        return
    try:
        value = loads(arguments)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be the JSON text of an object (the call's arguments)", param=param,
                       code="invalid_value")
