"""Ray Serve LLM's decode server, reporting the prefill engine's prefix-cache hits as `cached_tokens`.

Under prefill/decode disaggregation the decode engine counts the KV it received
over NIXL as cached (vLLM adds a connector's external hits to a request's
`num_cached_tokens`), so a prompt never sent before reports every token cached,
and so does another tenant's copy of it. What clients bill and tune by is the
prefill engine's own prefix-cache hits, which the prefill response carries
(`usage.prompt_tokens_details.cached_tokens`, with `enable_prompt_tokens_details`).

`PrefillCachedDecodeServer` is the stock `PDDecodeServer` with one change: it
reads that figure where the stock orchestrator hands the prefill response to
the connector backend (`prepare_decode_request`), and writes it into the decode
stream's usage. Everything else (the handoff, NIXL, LoRA, errors) is Ray's.

It also serves `chat_local`: a request run on the decode engine alone, as a plain
`LLMServer` would (no prefill handoff), for route hops colocated with decode
(`router.colocate_with: decode`). A route hop is one short prompt and one token:
on the decode engine it joins the next step of running answers instead of
queueing behind other prompts' chunks on the prefill engine.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

from ray.serve.llm.deployment import LLMServer, PDDecodeServer


class _PrefillTap:
    """The connector backend, noting each request's prefill prefix-cache hits on the way."""

    def __init__(self, backend, hits: dict[int, int]):
        self._backend = backend
        self._hits = hits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def prepare_decode_request(self, *, request, peer, prefill_response):
        details = getattr(getattr(prefill_response, "usage", None), "prompt_tokens_details", None)
        if details is not None and id(request) in self._hits:  # a chat stream `_chat` is passing on
            self._hits[id(request)] = details.cached_tokens or 0
        return self._backend.prepare_decode_request(request=request, peer=peer, prefill_response=prefill_response)


class PrefillCachedDecodeServer(PDDecodeServer):
    async def __init__(self, *args, **kwargs):
        # id(request) -> the prefill engine's prefix-cache hits (None until the prefill answered), for
        # each chat stream from its start until it ends (popped then, also when it is abandoned).
        self._prefill_hits: dict[int, int | None] = {}
        await super().__init__(*args, **kwargs)

    def _get_connector_backend(self):
        return _PrefillTap(super()._get_connector_backend(), self._prefill_hits)

    async def chat(self, request, raw_request_info=None):
        return self._chat(request, raw_request_info)

    async def chat_local(self, request, raw_request_info=None):
        """The request on this engine alone: LLMServer's chat, which PDDecodeServer overrides."""
        return await LLMServer.chat(self, request, raw_request_info)

    async def _chat(self, request, raw_request_info):
        self._prefill_hits[id(request)] = None
        try:
            async with aclosing(self._pd_handle_request(request, raw_request_info)) as items:
                async for item in items:
                    hits = self._prefill_hits.get(id(request))
                    yield item if hits is None else with_cached_tokens(item, hits)
        finally:
            self._prefill_hits.pop(id(request), None)


def with_cached_tokens(item, cached: int):
    """`item` of a chat stream (SSE text, a batch of them, or a whole response) with the usage's
    `prompt_tokens_details.cached_tokens` set to `cached`."""
    if isinstance(item, list):
        return [with_cached_tokens(part, cached) for part in item]
    if isinstance(item, str):
        if '"prompt_tokens_details"' not in item:
            return item  # every chunk but the usage chunk: passed on as it is
        lines = item.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("data: {") and '"prompt_tokens_details"' in line:
                chunk = json.loads(line[6:])
                details = (chunk.get("usage") or {}).get("prompt_tokens_details")
                if isinstance(details, dict):
                    details["cached_tokens"] = cached
                    lines[i] = "data: " + json.dumps(chunk, ensure_ascii=False)
        return "\n".join(lines)
    details = getattr(getattr(item, "usage", None), "prompt_tokens_details", None)
    if details is not None:
        details.cached_tokens = cached
    return item
