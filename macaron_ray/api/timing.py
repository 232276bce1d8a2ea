"""`Server-Timing` for every turn (W3C Server Timing: `name;dur=<milliseconds>`).

    route   the route hop (absent for tool-result turns, which skip it)
    wait    waiting for earlier turns' summaries before the answer
    ttft    the answer's first delta
    answer  the whole answer hop
    total   the whole turn in the runner

`route` and `wait` are known before the first byte, so streams carry them in
the header; the whole set goes in the header of a non-streaming response and
in an SSE comment line at the end of a stream (`: server-timing ...`; in Chat
Completions just before `data: [DONE]`, where the openai SDK stops reading),
which SSE parsers (the SDKs') skip and load tools can read. The specialist label is
not in it: only a deployment with debug headers on sends `x-macaron-specialist`.
"""

from __future__ import annotations

from macaron_ray.core.turn_runner import HopTiming

SPECIALIST_HEADER = "x-macaron-specialist"
DONE_FRAME = "data: [DONE]\n\n"
"""Chat Completions' last frame."""


def server_timing(timing: HopTiming | None, *, whole: bool) -> str:
    """The header value: route and wait, and with `whole` every hop measured so far."""
    if timing is None:
        return ""
    parts = [("route", timing.route_s), ("wait", timing.summary_wait_s)]
    if whole:
        parts += [("ttft", timing.answer_ttft_s), ("answer", timing.answer_s), ("total", timing.turn_s)]
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in parts if seconds is not None)


def sse_comment(timing: HopTiming | None) -> str:
    """The stream's last frame: the whole turn's timing as an SSE comment."""
    return f": server-timing {server_timing(timing, whole=True)}\n\n"
