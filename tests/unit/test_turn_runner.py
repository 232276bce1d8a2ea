"""TurnRunner with the fake engine: routing, fallback, stickiness, rollback, summaries, cache misses."""

from __future__ import annotations

import asyncio

import pytest

from macaron_ray import prompts
from macaron_ray.core.conversation import FunctionCall, HistoryError, Message, ToolCall, split_turns
from macaron_ray.core import summary_hop
from macaron_ray.core.engine_client import EngineError
from macaron_ray.core.own_view import summary_note
from macaron_ray.core.route_hop import RouteContext, route_messages
from macaron_ray.core.registry import AnswerSampling, Specialist, SpecialistRegistry
from macaron_ray.core.turn_runner import TurnEvent, TurnRequest, TurnRunner
from macaron_ray.observability.metrics import (
    OWNVIEW_CACHE_MISSES, ROLLBACKS, ROUTER_NONCANONICAL, SUMMARY_FAILURES, TURNS_COMMITTED, MetricSpec,
)
from macaron_ray.store.base import tenant_id
from macaron_ray.store.sqlite import SQLiteStore
from macaron_ray.testing.fake_engine import FakeEngine

TENANT = tenant_id("test-key")
TOOLS = [{"type": "function", "function": {"name": "book_table", "description": "Book.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def registry() -> SpecialistRegistry:
    return SpecialistRegistry(specialists=tuple(
        Specialist(label=f"L{i}", adapter_id=f"adapter-{i}", description=f"role {i}") for i in range(4)))


@pytest.fixture
def setup(tmp_path):
    engine = FakeEngine()
    store = SQLiteStore(tmp_path / "state.db")
    runner = TurnRunner(registry(), engine, store, summary_retry_delay_s=0.0)
    return runner, engine, store


def count(runner: TurnRunner, spec: MetricSpec, **labels: str) -> float:
    return runner.metrics.exporter.value(spec, **labels)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


async def run_turn(runner: TurnRunner, messages, **kw) -> tuple[str, TurnEvent]:
    text, final = [], None
    async for ev in runner.run(TurnRequest(tenant=kw.pop("tenant", TENANT), messages=tuple(messages), **kw)):
        if ev.final:
            final = ev
        else:
            text.append(ev.text)
    return "".join(text), final


def test_route_hop_picks_the_specialist_that_answers(setup):
    runner, engine, _ = setup

    async def scenario():
        text, final = await run_turn(runner, [user("please book a table for two")])
        assert final.label == "L1" and text.startswith("[adapter-1]")
        (route,) = engine.of_kind("route")
        # "L" begins the reply in the prompt; the engine decodes one digit, and nothing after it.
        assert route.adapter == "adapter-0" and route.choice == ("0", "1", "2", "3")
        assert route.continue_final_message and route.max_tokens == 1 and route.temperature == 0.0
        assert route.messages == [{"role": "system", "content": prompts.load("routing")},
                                  {"role": "user", "content": "please book a table for two"},
                                  {"role": "assistant", "content": "L"}]
        assert final.timing.route_s is not None and final.timing.answer_ttft_s is not None
        assert final.timing.answer_s >= final.timing.answer_ttft_s
        meta = await runner.wait_summary(TENANT, final.turn_key)
        assert meta.label == "L1" and meta.summary == "The personal agent Summary: please book a table for two"
        (summary,) = engine.of_kind("summary")  # the runner begins the summary with who answered
        assert summary.continue_final_message and summary.messages[-1] == {"role": "assistant",
                                                                           "content": "The personal agent"}
        assert meta.summary_s is not None and final.timing.summary_s == pytest.approx(meta.summary_s)
    asyncio.run(scenario())


def test_the_route_hop_sees_the_previous_turn(tmp_path):
    engine = FakeEngine()
    runner = TurnRunner(registry(), engine, SQLiteStore(tmp_path / "state.db"), summary_retry_delay_s=0.5)
    engine.fail(lambda r: FakeEngine.kind(r) == "summary")  # the first summary comes 0.5 s late

    async def scenario():
        h = [user("build a counter widget")]
        t1, f1 = await run_turn(runner, h)
        # The summary is still pending: the context block shows the previous user message.
        h += [assistant(t1), user("make the buttons bigger")]
        t2, f2 = await run_turn(runner, h)
        first, second = engine.of_kind("route")[:2]
        assert first.messages == route_messages("build a counter widget")
        assert second.messages == route_messages(
            "make the buttons bigger", context=RouteContext("L3", "build a counter widget"))
        await runner.wait_summary(TENANT, f2.turn_key)
        # Once summarized, the summary stands for the previous turn.
        h += [assistant(t2), user("now add a reset button")]
        await run_turn(runner, h)
        third = engine.of_kind("route")[2]
        assert third.messages == route_messages(
            "now add a reset button", context=RouteContext(f2.label, "The user Summary: make the buttons bigger"))
    asyncio.run(scenario())


def test_non_canonical_route_output_is_counted_and_falls_back_to_l0(setup):
    runner, engine, _ = setup
    engine.router = lambda text: "L7 maybe"

    async def scenario():
        text, final = await run_turn(runner, [user("write python code")])
        assert final.label == "L0" and text.startswith("[adapter-0]")
        assert count(runner, ROUTER_NONCANONICAL) == 1
    asyncio.run(scenario())


def test_scaffold_never_enters_a_view_and_other_turns_appear_as_summaries(setup):
    runner, engine, _ = setup

    async def scenario():
        h = [user("write python code for sorting")]
        t1, f1 = await run_turn(runner, h)
        h += [assistant(t1), user("now book a table")]
        t2, f2 = await run_turn(runner, h)
        h += [assistant(t2), user("fix this python bug")]
        _, f3 = await run_turn(runner, h)
        assert (f1.label, f2.label, f3.label) == ("L2", "L1", "L2")
        # Route hops first, answers next, summaries last, where the engine schedules by priority.
        await runner.wait_summary(TENANT, f3.turn_key)
        assert {r.priority for r in engine.of_kind("route")} == {-1}
        assert {r.priority for r in engine.of_kind("answer")} == {0}
        assert {r.priority for r in engine.of_kind("summary")} == {1}
        view = engine.of_kind("answer")[-1].messages
        assert view == [
            {"role": "user", "content": "write python code for sorting"},
            {"role": "assistant", "content": t1},
            {"role": "user", "content": "now book a table"},
            summary_note("The personal agent Summary: now book a table"),
            {"role": "user", "content": "fix this python bug"},
        ]
        scaffold = {prompts.load("routing"), prompts.load("summary")}
        for req in engine.of_kind("answer"):
            assert not any(m.get("content") in scaffold for m in req.messages)
    asyncio.run(scenario())


def test_tool_results_stick_to_the_caller_without_route_or_summary(setup):
    runner, engine, _ = setup

    async def scenario():
        h = [user("tool:book_table book dinner at 8")]
        _, f1 = await run_turn(runner, h, tools=TOOLS)
        assert f1.label == "L1" and f1.finish_reason == "tool_calls"
        (call,) = f1.tool_calls
        await runner.wait_summary(TENANT, f1.turn_key)
        routes, summaries = len(engine.of_kind("route")), len(engine.of_kind("summary"))
        engine.router = lambda text: "L3"  # would misroute if routing ran again
        h += [Message(role="assistant", tool_calls=(call,)),
              Message(role="tool", tool_call_id=call.id, content='{"ok": true}')]
        text, f2 = await run_turn(runner, h, tools=TOOLS)
        assert f2.label == "L1" and text.startswith("[adapter-1] done:")
        assert f2.timing.route_s is None
        await runner.drain()
        assert len(engine.of_kind("route")) == routes and len(engine.of_kind("summary")) == summaries
        assert engine.requests[-1].messages[-2]["tool_calls"][0]["id"] == call.id
    asyncio.run(scenario())


def test_a_tool_result_whose_call_was_never_stored_goes_to_the_tool_specialist(setup, tmp_path):
    """A history the client wrote (or another deployment served): its words may read as chat
    ("Is flight LH 455 on time?"), but a tool result is the agent's to answer, without a route hop.
    With no tool specialist registered, the request's words are routed as for a new turn."""
    runner, engine, _ = setup
    call = ToolCall(id="call_1", function=FunctionCall(name="flight_status", arguments="{}"))
    h = [user("is my flight on time?"), Message(role="assistant", tool_calls=(call,)),
         Message(role="tool", tool_call_id="call_1", content='{"status": "delayed"}')]
    engine.router = lambda text: "L0"

    async def scenario():
        _, final = await run_turn(runner, h, tools=TOOLS)
        assert final.label == "L1" and engine.of_kind("route") == []
        without = TurnRunner(registry().model_copy(update={"tool_label": None}), engine,
                             SQLiteStore(tmp_path / "other.db"))
        _, final = await run_turn(without, h, tools=TOOLS)
        assert final.label == "L0" and len(engine.of_kind("route")) == 1
    asyncio.run(scenario())
    with pytest.raises(ValueError, match="tool label 'L7' is not registered"):
        SpecialistRegistry(specialists=registry().specialists, tool_label="L7")
    assert registry().model_copy(update={"specialists": registry().specialists[:1]}).tool_result_label is None


def test_tool_result_for_an_unknown_call_id_is_a_client_error(setup):
    runner, engine, store = setup
    call = ToolCall(id="call_1", function=FunctionCall(name="book_table", arguments="{}"))
    h = [user("tool:book_table"), Message(role="assistant", tool_calls=(call,)),
         Message(role="tool", tool_call_id="call_999", content="{}")]

    async def scenario():
        with pytest.raises(HistoryError, match="unknown tool_call_id 'call_999'"):
            await run_turn(runner, h, tools=TOOLS)
        assert engine.requests == []
    asyncio.run(scenario())


def test_engine_error_rolls_back_and_the_same_turn_can_be_retried(setup):
    runner, engine, store = setup
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=2)
    h = [user("write python code")]

    async def scenario():
        key = split_turns(TENANT, h).turns[-1].key
        with pytest.raises(EngineError):
            await run_turn(runner, h)
        assert await store.get_turn(TENANT, key) is None
        assert count(runner, ROLLBACKS, cause="engine_error", surface="chat") == 1
        assert count(runner, TURNS_COMMITTED, specialist="L2", surface="chat") == 0
        assert engine.of_kind("summary") == []
        _, final = await run_turn(runner, h)
        assert final.label == "L2"
        assert (await runner.wait_summary(TENANT, key)).summary == "The coding assistant Summary: write python code"
        assert count(runner, TURNS_COMMITTED, specialist="L2", surface="chat") == 1
    asyncio.run(scenario())


def test_disconnect_before_delivery_rolls_back(setup):
    runner, engine, store = setup
    h = [user("draw a chart of sales")]

    async def scenario():
        key = split_turns(TENANT, h).turns[-1].key
        gen = runner.run(TurnRequest(tenant=TENANT, messages=tuple(h)))
        first = await gen.__anext__()
        assert not first.final
        await gen.aclose()  # the client went away mid-stream
        # ... and also when it goes away exactly at the final event:
        gen = runner.run(TurnRequest(tenant=TENANT, messages=tuple(h)))
        async for ev in gen:
            if ev.final:
                break
        await gen.aclose()
        assert await store.get_turn(TENANT, key) is None
        assert count(runner, ROLLBACKS, cause="client_disconnect", surface="chat") == 2
        await run_turn(runner, h)
        assert (await store.get_turn(TENANT, key)).label == "L3"
    asyncio.run(scenario())


def test_a_delivered_turn_is_committed_exactly_once(setup):
    runner, engine, _ = setup
    h = [user("send a message to Tom")]

    async def scenario():
        await run_turn(runner, h)
        await run_turn(runner, h)
        await runner.drain()
        assert count(runner, TURNS_COMMITTED, specialist="L1", surface="chat") == 1
        assert len(engine.of_kind("summary")) == 1
    asyncio.run(scenario())


def test_next_turn_waits_for_a_pending_summary(setup):
    runner, engine, _ = setup
    engine.chunk_delay_s = 0.02

    async def scenario():
        h = [user("write python code")]
        t1, f1 = await run_turn(runner, h)
        assert f1.timing.summary_s is None  # delivered before the summary hop finished
        h += [assistant(t1), user("book a flight")]
        await run_turn(runner, h)
        kinds = [FakeEngine.kind(r) for r in engine.requests]
        # route1, answer1, route2 may interleave with summary1; answer2 must come after it.
        assert kinds.index("summary") < len(kinds) - 1 - kinds[::-1].index("answer")
        assert engine.of_kind("answer")[-1].messages[1] == summary_note("The coding assistant Summary: write python code")
    asyncio.run(scenario())


def test_failed_summary_is_retried_and_never_undelivers(setup):
    runner, engine, store = setup
    engine.fail(lambda r: FakeEngine.kind(r) == "summary", times=2)

    async def scenario():
        _, final = await run_turn(runner, [user("remind me to call mom")])
        meta = await runner.wait_summary(TENANT, final.turn_key)
        assert meta.label == "L1" and meta.summary == "The personal agent Summary: remind me to call mom"
        assert len(engine.of_kind("summary")) == 3 and count(runner, SUMMARY_FAILURES) == 0
    asyncio.run(scenario())


def test_a_looping_summary_is_replaced_by_the_user_message(setup):
    runner, engine, _ = setup
    engine.summarizer = lambda asked: "The UI agent " + "(UI-AIM) " * 12

    async def scenario():
        _, final = await run_turn(runner, [user("write a regex for zip codes")])
        meta = await runner.wait_summary(TENANT, final.turn_key)
        assert meta.summary == summary_hop.fallback_summary("write a regex for zip codes")
        assert "UI-AIM" not in meta.summary and count(runner, SUMMARY_FAILURES) == 0
    asyncio.run(scenario())


def test_cache_miss_is_rederived_not_an_error(setup, tmp_path):
    runner, engine, _ = setup
    h = [user("write python code"), assistant("print(1)"), user("book a table"), assistant("booked"),
         user("write sql code please")]

    async def scenario():
        text, final = await run_turn(runner, h)  # nothing of the first two turns is cached
        assert final.label == "L2"
        assert count(runner, OWNVIEW_CACHE_MISSES) == 2
        view = engine.of_kind("answer")[-1].messages
        assert view[:4] == [{"role": "user", "content": "write python code"},
                            {"role": "assistant", "content": "print(1)"},
                            {"role": "user", "content": "book a table"},
                            summary_note("The personal agent Summary: book a table")]
        # Another replica with the same store sees the same views without re-deriving.
        other = TurnRunner(registry(), FakeEngine(), SQLiteStore(tmp_path / "state.db"))
        await run_turn(other, h)
        assert count(other, OWNVIEW_CACHE_MISSES) == 0
        assert other.engine.of_kind("answer")[-1].messages == view
    asyncio.run(scenario())


def test_tenants_do_not_share_turns(setup):
    runner, engine, _ = setup
    h = [user("write python code"), assistant("x"), user("hello there")]

    async def scenario():
        await run_turn(runner, h, tenant=tenant_id("a"))
        await run_turn(runner, h, tenant=tenant_id("b"))
        assert count(runner, OWNVIEW_CACHE_MISSES) == 2
    asyncio.run(scenario())


@pytest.mark.parametrize("messages, match", [
    ([], "must not be empty"),
    ([Message(role="system", content="be nice")], "must contain a user message"),
    ([Message(role="assistant", content="hi"), user("x")], "before the first user message"),
    ([user("x"), assistant("y")], "last message must be a user message or tool results"),
    ([user("x"), Message(role="tool", tool_call_id="c", content="{}")], "unknown tool_call_id 'c'"),
    ([user("tool:f"), Message(role="assistant", tool_calls=(
        ToolCall(id="c", function=FunctionCall(name="f", arguments="{}")),)),
      user("y"), Message(role="tool", tool_call_id="c", content="{}")], "must follow an assistant message"),
])
def test_malformed_histories_are_client_errors(setup, messages, match):
    runner, engine, _ = setup

    async def scenario():
        with pytest.raises(HistoryError, match=match):
            await run_turn(runner, messages)
        assert engine.requests == []
    asyncio.run(scenario())


def test_a_specialists_repetition_penalty_goes_with_its_answers_only(tmp_path):
    chat = AnswerSampling(repetition_penalty=1.1, frequency_penalty=0.3)
    specialists = [Specialist(label=f"L{i}", adapter_id=f"adapter-{i}", description=f"role {i}",
                              answer_sampling=chat if i == 0 else AnswerSampling()) for i in range(4)]
    engine = FakeEngine()
    runner = TurnRunner(SpecialistRegistry(specialists=tuple(specialists)), engine, SQLiteStore(tmp_path / "s.db"),
                        summary_retry_delay_s=0.0)

    async def scenario():
        _, chat = await run_turn(runner, [user("hello there")])
        await runner.wait_summary(TENANT, chat.turn_key)
        _, agent = await run_turn(runner, [user("please book a table for two")])
        await runner.wait_summary(TENANT, agent.turn_key)
        assert (chat.label, agent.label) == ("L0", "L1")
        answers = {r.adapter: (r.repetition_penalty, r.frequency_penalty) for r in engine.of_kind("answer")}
        assert answers == {"adapter-0": (1.1, 0.3), "adapter-1": (None, None)}
        # L0 also routes and summarizes: those hops keep the engine's defaults.
        hops = engine.of_kind("route") + engine.of_kind("summary")
        assert {(r.repetition_penalty, r.frequency_penalty) for r in hops} == {(None, None)}

    asyncio.run(scenario())


def test_route_answer_and_summary_hops_go_to_their_own_engines(tmp_path):
    """A colocated router (local-cpu): route hops on one engine, answers and summaries on another."""
    answers, router = FakeEngine(), FakeEngine()
    runner = TurnRunner(registry(), answers, SQLiteStore(tmp_path / "state.db"), router=router, summarizer=answers,
                        summary_retry_delay_s=0.0)

    async def scenario():
        _, final = await run_turn(runner, [user("write python code for sorting")])
        await runner.wait_summary(TENANT, final.turn_key)
    asyncio.run(scenario())
    assert [FakeEngine.kind(r) for r in router.requests] == ["route"]
    assert sorted(FakeEngine.kind(r) for r in answers.requests) == ["answer", "summary"]


def test_a_regenerated_answer_gets_a_summary_of_its_own(setup):
    """The client regenerated turn 1 (same user message, another answer) and went on: the next
    specialist's view summarizes the answer the client kept, not the one committed first."""
    runner, engine, _ = setup

    def summarized(answer: str) -> int:
        return sum(answer in r.messages[1]["content"] for r in engine.of_kind("summary"))

    async def turn(messages):
        text, final = await run_turn(runner, messages)
        await runner.wait_summary(TENANT, final.turn_key)
        return text, final

    async def scenario():
        h = [user("book a table for two")]
        t1, f1 = await turn(h)
        assert summarized(t1) == 1
        # The answer as delivered: its stored summary is used, no summary hop runs for it again.
        _, f2 = await turn([*h, assistant(t1), user("write python code")])
        assert f2.label == "L2" and summarized(t1) == 1
        regenerated = "Booked: a table for two at Sakura, 8pm."
        await turn([*h, assistant(regenerated), user("write python code please")])
        assert summarized(regenerated) == 1 and summarized(t1) == 1
        # That summary is kept under the regenerated answer: the next turn reuses it.
        await turn([*h, assistant(regenerated), user("write python code now")])
        assert summarized(regenerated) == 1
        meta = await runner.store.get_turn(TENANT, f1.turn_key)
        assert meta.answer_sha == summary_hop.answer_sha(summary_hop.answer_digest(t1, []))
    asyncio.run(scenario())
