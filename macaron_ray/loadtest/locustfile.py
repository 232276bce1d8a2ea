"""Locust replay of the suite's traces, for teams that already run Locust.

    locust -f macaron_ray/loadtest/locustfile.py --host http://127.0.0.1:8000 --headless -u 4 -r 1 -t 2m

Each simulated user plays one trace conversation after another over Chat
Completions (streamed, history resent by the client, tool results sent back),
as `macaron loadtest --surface chat` does. Locust's table shows one row per
request kind (`turn`, `tool result`) and one per ingress hop read from
`Server-Timing` (`hop route`, `hop wait`, `hop answer`, ...), so the routing
overhead sits beside the turn latency in Locust's own statistics.

Settings from the environment: MACARON_API_KEY, MACARON_MODEL, MACARON_MAX_TOKENS,
MACARON_THINK_TIME_S, MACARON_TRACES (a traces file).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

from locust import HttpUser, constant, events, task

from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL
from macaron_ray.loadtest.timing import parse_server_timing, parse_sse_timing
from macaron_ray.loadtest.traces import TRACES, load_traces

_traces = load_traces(Path(os.environ.get("MACARON_TRACES", TRACES)))
_next_conversation = itertools.cycle(range(len(_traces.conversations)))


class MacaronUser(HttpUser):
    wait_time = constant(float(os.environ.get("MACARON_THINK_TIME_S", "0")))

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {os.environ.get('MACARON_API_KEY', 'loadtest')}"
        self.model = os.environ.get("MACARON_MODEL", DEFAULT_PUBLIC_MODEL)
        self.max_tokens = int(os.environ.get("MACARON_MAX_TOKENS", "64"))

    @task
    def conversation(self) -> None:
        trace = _traces.conversations[next(_next_conversation)]
        history: list[dict] = [{"role": "system", "content": f"Locust user: {trace.name}"}]
        ref = f"{id(self):x}-{time.time_ns():x}"  # each conversation its own (they are keyed by messages)
        for n, turn in enumerate(trace.turns):
            history.append({"role": "user", "content": f"{turn.user} (ref {ref})" if n == 0 else turn.user})
            answer = self._stream("turn", history, turn.tools)
            if answer is None:
                return  # the turn failed (reported); this conversation stops here
            history.append(answer)
            if answer.get("tool_calls") and turn.tool_result is not None:
                history += [{"role": "tool", "tool_call_id": c["id"], "content": turn.tool_result}
                            for c in answer["tool_calls"]]
                answer = self._stream("tool result", history, turn.tools)
                if answer is None:
                    return
                history.append(answer)

    def _stream(self, name: str, messages: list[dict], tools: bool) -> dict | None:
        body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": self.max_tokens,
                "temperature": 0.0}
        if tools:
            body["tools"] = list(_traces.tools)
        text, calls, timing = [], {}, {}
        with self.client.post("/v1/chat/completions", json=body, stream=True, name=name,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return None
            timing.update(parse_server_timing(resp.headers.get("server-timing")))
            for raw in resp.iter_lines(decode_unicode=True):
                if not raw:
                    continue
                if (closing := parse_sse_timing(raw)) is not None:
                    timing.update(closing)
                elif raw.startswith("data: ") and raw != "data: [DONE]":
                    chunk = json.loads(raw[6:])
                    if "error" in chunk:
                        resp.failure(chunk["error"].get("message", "error"))
                        return None
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        text.append(delta.get("content") or "")
                        for c in delta.get("tool_calls") or ():
                            entry = calls.setdefault(c["index"], {"id": None, "name": "", "arguments": ""})
                            entry["id"] = c.get("id") or entry["id"]
                            entry["name"] += (c.get("function") or {}).get("name") or ""
                            entry["arguments"] += (c.get("function") or {}).get("arguments") or ""
            resp.success()
        for hop, seconds in timing.items():
            events.request.fire(request_type="hop", name=hop, response_time=seconds * 1000, response_length=0,
                                exception=None, context={})
        answer: dict = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            answer["tool_calls"] = [{"id": c["id"], "type": "function",
                                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                                    for c in calls.values()]
        return answer
