"""The three API surfaces driven by the official SDKs (strict response validation) over the fake engine."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import anthropic
import httpx
import openai
import pytest

from macaron_ray.api.keys import KeyRing, hash_line
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, start_api

KEY = "sk-test-tenant"
TOOL = {"type": "function", "function": {"name": "book_table", "description": "Book a table.",
                                         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
RESP_TOOL = {"type": "function", "name": "book_table", "description": "Book a table.",
             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
ANTH_TOOL = {"name": "book_table", "description": "Book a table.",
             "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}


@pytest.fixture
def api(tmp_path):
    engine = FakeEngine(tag=lambda adapter: next(k for k, v in SECRET_ADAPTERS.items() if v == adapter))
    running = start_api(engine, WhitespaceTokenCounter(), tmp_path / "state.db")
    running.engine = engine
    yield running
    running.stop()


@pytest.fixture
def oai(api):
    with openai.OpenAI(base_url=api.base_url + "/v1", api_key=KEY, _strict_response_validation=True,
                       max_retries=0) as client:
        yield client


@pytest.fixture
def claude(api):
    with anthropic.Anthropic(base_url=api.base_url, api_key=KEY, _strict_response_validation=True,
                             max_retries=0) as client:
        yield client


def rows(api, table: str) -> int:
    with sqlite3.connect(api.store.path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def assert_no_private_names(text: str) -> None:
    for secret in SECRET_ADAPTERS.values():
        assert secret not in text


# -- models ----------------------------------------------------------------------------------


def test_models_lists_exactly_the_public_model(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [PUBLIC_MODEL]
    assert oai.models.retrieve(PUBLIC_MODEL).id == PUBLIC_MODEL
    with pytest.raises(openai.NotFoundError) as err:
        oai.models.retrieve("gpt-4")
    assert err.value.code == "model_not_found"


def test_health(api):
    assert httpx.get(api.base_url + "/health").json() == {"status": "ok"}


# -- chat completions ------------------------------------------------------------------------


def test_chat_completion_routes_and_answers(oai, api):
    out = oai.chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "write python code"}])
    assert out.model == PUBLIC_MODEL
    assert out.choices[0].message.content == "[L2] reply to: write python code"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens > 0 and out.usage.prompt_tokens_details.cached_tokens >= 0
    assert_no_private_names(out.model_dump_json())


def test_chat_stream_with_usage(oai):
    stream = oai.chat.completions.create(model=PUBLIC_MODEL, stream=True, stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "hello there friend"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "[L0] reply to: hello there friend"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content_chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in content_chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert_no_private_names("".join(c.model_dump_json() for c in chunks))


def test_chat_tool_round_trip_sticks_to_the_caller(oai, api):
    msgs = [{"role": "user", "content": "tool:book_table for two"}]
    first = oai.chat.completions.create(model=PUBLIC_MODEL, messages=msgs, tools=[TOOL])
    (call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "book_table"
    routes = len(api.engine.of_kind("route"))
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'}]
    stream = oai.chat.completions.create(model=PUBLIC_MODEL, messages=msgs, tools=[TOOL], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == '[L1] done: {"ok": true}'
    assert len(api.engine.of_kind("route")) == routes


def test_chat_streamed_tool_call(oai):
    stream = oai.chat.completions.create(model=PUBLIC_MODEL, stream=True, tools=[TOOL],
                                         messages=[{"role": "user", "content": "tool:book_table now"}])
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "book_table" and json.loads(calls[0].function.arguments) == {"x": 1}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_chat_error_after_stream_started_rolls_back(oai, api):
    api.engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=2)
    with pytest.raises(openai.APIError):
        for _ in oai.chat.completions.create(model=PUBLIC_MODEL, stream=True,
                                             messages=[{"role": "user", "content": "write python code"}]):
            pass
    assert rows(api, "turns") == 0
    out = oai.chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "write python code"}])
    assert out.choices[0].message.content.startswith("[L2]")
    assert rows(api, "turns") == 1


def test_engine_down_is_a_retryable_503(oai, api):
    api.engine.fail(lambda r: True, times=5)
    with pytest.raises(openai.InternalServerError) as err:
        oai.chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "1"
    assert_no_private_names(err.value.response.text)


# -- responses -------------------------------------------------------------------------------


def test_responses_create_retrieve_items_delete(oai, api):
    r = oai.responses.create(model=PUBLIC_MODEL, input="write python code", instructions="be brief")
    assert r.status == "completed" and r.output_text == "[L2] reply to: write python code"
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    items = oai.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "write python code"
    assert oai.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)


def test_store_false_is_not_retrievable(oai, api):
    r = oai.responses.create(model=PUBLIC_MODEL, input="hello", store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    assert rows(api, "responses") == 0


def test_previous_response_chain_replays_input_and_output_not_instructions(oai, api):
    r1 = oai.responses.create(model=PUBLIC_MODEL, input="write python code", instructions="SECRET RULES")
    r2 = oai.responses.create(model=PUBLIC_MODEL, input="fix the python bug", previous_response_id=r1.id)
    r3 = oai.responses.create(model=PUBLIC_MODEL, input="and a sql query", previous_response_id=r2.id)
    assert r3.output_text.startswith("[L2]")
    view = api.engine.of_kind("answer")[-1].messages
    assert view == [{"role": "user", "content": "write python code"},
                    {"role": "assistant", "content": r1.output_text},
                    {"role": "user", "content": "fix the python bug"},
                    {"role": "assistant", "content": r2.output_text},
                    {"role": "user", "content": "and a sql query"}]


def test_responses_function_call_round_trip(oai, api):
    r1 = oai.responses.create(model=PUBLIC_MODEL, input="tool:book_table please", tools=[RESP_TOOL])
    (call,) = [o for o in r1.output if o.type == "function_call"]
    assert call.name == "book_table" and json.loads(call.arguments) == {"x": 1}
    r2 = oai.responses.create(model=PUBLIC_MODEL, previous_response_id=r1.id, tools=[RESP_TOOL],
                              input=[{"type": "function_call_output", "call_id": call.call_id, "output": "booked"}])
    assert r2.output_text == "[L1] done: booked"
    assert [i.type for i in oai.responses.input_items.list(r2.id).data] == ["function_call_output"]


def test_responses_stream_helper_events_in_order(oai):
    with oai.responses.stream(model=PUBLIC_MODEL, input="draw a chart of sales") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "[L3] reply to: draw a chart of sales"


def test_responses_stream_function_call_and_incomplete(oai):
    with oai.responses.stream(model=PUBLIC_MODEL, input="tool:book_table x", tools=[RESP_TOOL]) as stream:
        kinds = [e.type for e in stream]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"
    with oai.responses.stream(model=PUBLIC_MODEL, input="tell me a long story", max_output_tokens=2) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_previous_response_id_unknown_or_foreign_is_404(oai, api, request):
    r = oai.responses.create(model=PUBLIC_MODEL, input="hello")
    other = openai.OpenAI(base_url=api.base_url + "/v1", api_key="sk-other", _strict_response_validation=True,
                          max_retries=0)
    request.addfinalizer(other.close)
    for client, rid in ((oai, "resp_doesnotexist"), (other, r.id)):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model=PUBLIC_MODEL, input="again", previous_response_id=rid)
        body = err.value.body
        assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"
        assert body["type"] == "invalid_request_error"


# -- anthropic messages ----------------------------------------------------------------------


def test_messages_create_and_stop_reasons(claude):
    m = claude.messages.create(model=PUBLIC_MODEL, max_tokens=64, system=[{"type": "text", "text": "be kind"}],
                               messages=[{"role": "user", "content": "hello friend"}])
    assert m.content[0].text == "[L0] reply to: hello friend" and m.stop_reason == "end_turn"
    m = claude.messages.create(model=PUBLIC_MODEL, max_tokens=2, messages=[{"role": "user", "content": "tell more"}])
    assert m.stop_reason == "max_tokens"
    m = claude.messages.create(model=PUBLIC_MODEL, max_tokens=64, stop_sequences=["STOP"],
                               messages=[{"role": "user", "content": "say STOP now"}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert "STOP" not in m.content[0].text


def test_messages_stream_final_message(claude):
    with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=64,
                                messages=[{"role": "user", "content": "write python code"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "[L2] reply to: write python code"
    assert final.usage.output_tokens > 0 and final.stop_reason == "end_turn"


def test_messages_tool_use_round_trip(claude, api):
    msgs = [{"role": "user", "content": "tool:book_table for four"}]
    with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=64, tools=[ANTH_TOOL], messages=msgs) as stream:
        m = stream.get_final_message()
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "book_table" and use.input == {"x": 1}
    msgs += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"}]}]
    m2 = claude.messages.create(model=PUBLIC_MODEL, max_tokens=64, tools=[ANTH_TOOL], messages=msgs)
    assert m2.content[0].text == "[L1] done: done"


def test_count_tokens(claude):
    n = claude.messages.count_tokens(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "one two three"}])
    more = claude.messages.count_tokens(model=PUBLIC_MODEL,
                                        messages=[{"role": "user", "content": "one two three four five six"}])
    assert 0 < n.input_tokens < more.input_tokens


def test_messages_error_after_stream_started_is_an_error_event(claude, api):
    api.engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=1)
    with pytest.raises(anthropic.APIStatusError):
        with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=64,
                                    messages=[{"role": "user", "content": "write code"}]) as stream:
            stream.get_final_message()
    assert rows(api, "turns") == 0


def test_auth_required_when_keys_are_configured(tmp_path):
    good_key = "good-" + "k" * 30
    keys = KeyRing.parse(hash_line("acme", good_key))
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db", keys=keys)
    try:
        with (openai.OpenAI(base_url=running.base_url + "/v1", api_key="bad", max_retries=0) as bad,
              anthropic.Anthropic(base_url=running.base_url, api_key="bad", max_retries=0) as bad_a,
              anthropic.Anthropic(base_url=running.base_url, api_key=good_key, max_retries=0) as good):
            with pytest.raises(openai.AuthenticationError):
                bad.chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(anthropic.AuthenticationError) as err:
                bad_a.messages.create(model=PUBLIC_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert err.value.body["error"]["type"] == "authentication_error"
            assert good.messages.create(model=PUBLIC_MODEL, max_tokens=8,
                                        messages=[{"role": "user", "content": "hi"}]).content
        via_bearer = httpx.post(running.base_url + "/v1/messages", headers={
            "authorization": f"Bearer {good_key}", "anthropic-version": "2023-06-01"},
            json={"model": PUBLIC_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert via_bearer.status_code == 200
    finally:
        running.stop()


def test_summaries_finish_in_the_background(oai, api):
    oai.chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "write python code"}])

    async def summary():
        for _ in range(100):
            meta = await api.store.get_turn(*_only_turn(api))
            if meta.summary:
                return meta.summary
            await asyncio.sleep(0.02)
    assert asyncio.run(summary()) == "The coding assistant Summary: write python code"


def _only_turn(api) -> tuple[str, str]:
    with sqlite3.connect(api.store.path) as db:
        return db.execute("SELECT tenant, key FROM turns").fetchone()


def test_responses_failure_after_stream_started_is_response_failed(oai, api):
    api.engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=2)
    with oai.responses.stream(model=PUBLIC_MODEL, input="write python code") as stream:
        events = list(stream)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    assert rows(api, "turns") == 0 and rows(api, "responses") == 0
    assert_no_private_names(json.dumps([e.model_dump() for e in events]))


def test_a_streamed_response_is_stored_before_it_is_completed(oai, api, monkeypatch):
    """A client may GET the response, or chain on it, the moment it reads `response.completed`: the
    store is written first (a slow store here makes the old order, completed then store, fail)."""
    import asyncio

    slow = type(api.store).put_response

    async def put_response(self, *args, **kwargs):
        await asyncio.sleep(0.5)
        return await slow(self, *args, **kwargs)

    monkeypatch.setattr(type(api.store), "put_response", put_response)
    with oai.responses.stream(model=PUBLIC_MODEL, input="draw a chart of sales") as stream:
        for event in stream:
            if event.type == "response.completed":
                assert oai.responses.retrieve(event.response.id).status == "completed"
                follow = oai.responses.create(model=PUBLIC_MODEL, input="and a table",
                                              previous_response_id=event.response.id)
                assert follow.status == "completed"


def test_chat_and_messages_streams_commit_the_turn_before_they_say_it_is_complete(oai, claude, api, monkeypatch):
    """A client sends its next turn the moment it reads the finish chunk or `message_stop`: the turn
    is committed by then, so the next turn finds it (no own-view cache miss, no second route hop).
    A slow store here makes the old order (finish, then commit) fail."""
    import asyncio

    from macaron_ray.observability.metrics import OWNVIEW_CACHE_MISSES

    slow = type(api.store).put_turn

    async def put_turn(self, *args, **kwargs):
        await asyncio.sleep(0.5)
        return await slow(self, *args, **kwargs)

    monkeypatch.setattr(type(api.store), "put_turn", put_turn)
    misses = lambda: api.runner.metrics.exporter.value(OWNVIEW_CACHE_MISSES)  # noqa: E731
    history, text = [{"role": "user", "content": "write python code to sort"}], ""
    for chunk in oai.chat.completions.create(model=PUBLIC_MODEL, messages=history, stream=True):
        if not chunk.choices:
            continue
        text += chunk.choices[0].delta.content or ""
        if chunk.choices[0].finish_reason:  # done, as far as this client cares
            oai.chat.completions.create(model=PUBLIC_MODEL, messages=[
                *history, {"role": "assistant", "content": text}, {"role": "user", "content": "and in reverse"}])
            break
    assert misses() == 0
    history, text = [{"role": "user", "content": "book a table for two"}], ""
    with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=64, messages=history) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                text += event.delta.text
            if event.type == "message_stop":
                claude.messages.create(model=PUBLIC_MODEL, max_tokens=64, messages=[
                    *history, {"role": "assistant", "content": text}, {"role": "user", "content": "for tomorrow"}])
                break
    assert misses() == 0
