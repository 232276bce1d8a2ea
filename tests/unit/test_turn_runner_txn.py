"""TurnRunner state under what real clients do (issue 31): edited histories, races, deadlines, and
nothing of an undelivered turn written."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from macaron_ray.core import summary_hop
from macaron_ray.core.conversation import FunctionCall, Message, ToolCall, answer_key, split_turns
from macaron_ray.core.deadlines import Deadlines
from macaron_ray.core.engine_client import EngineError, EngineTimeout
from macaron_ray.core.own_view import summary_note
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.store.sqlite import SQLiteStore
from macaron_ray.testing.fake_engine import FakeEngine
from tests.unit.test_turn_runner import TENANT, TOOLS, assistant, registry, run_turn, user


def rows(store: SQLiteStore) -> int:
    with sqlite3.connect(store.path) as db:
        return db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]


@pytest.fixture
def setup(tmp_path):
    engine = FakeEngine()
    store = SQLiteStore(tmp_path / "state.db")
    return TurnRunner(registry(), engine, store, summary_retry_delay_s=0.0, max_rederived_turns=4), engine, store


def test_a_tool_result_turn_writes_nothing_until_its_answer_is_delivered(setup):
    """Its label, re-derived because the store never saw the call (another deployment made it),
    is written with the turn, after delivery: a failed answer leaves the store as it was."""
    runner, engine, store = setup
    call = ToolCall(id="call_1", function=FunctionCall(name="book_table", arguments="{}"))
    h = [user("write python code"), assistant("print(1)"), user("book a table"),
         Message(role="assistant", tool_calls=(call,)), Message(role="tool", tool_call_id="call_1", content="ok")]
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=1)

    async def scenario():
        with pytest.raises(EngineError):
            await run_turn(runner, h, tools=TOOLS)
        assert rows(store) == 0
        _, final = await run_turn(runner, h, tools=TOOLS)
        await runner.drain()
        assert final.label == "L1"
        history = split_turns(TENANT, h)
        for turn, label in zip(history.turns, ("L2", "L1")):
            assert (await store.get_turn(TENANT, turn.key)).label == label
    asyncio.run(scenario())


def test_a_history_the_store_does_not_know_is_served_with_capped_hops(setup):
    """A long history from elsewhere (or keyed before an upgrade): the latest `max_rederived_turns`
    past turns are routed again, the entry specialist stands for older ones, and none is refused."""
    runner, engine, store = setup
    h: list[Message] = []
    for i in range(10):
        h += [user(f"write python code {i}"), assistant(f"print({i})")]

    async def scenario():
        _, final = await run_turn(runner, [*h, user("write sql code please")])
        assert final.label == "L2"
        assert len(engine.of_kind("route")) == 4 + 1
        turns = split_turns(TENANT, [*h, user("x")]).turns[:-1]
        labels = [(await store.get_turn(TENANT, t.key)).label for t in turns]
        assert labels == ["L0"] * 6 + ["L2"] * 4  # written once the turn was delivered
    asyncio.run(scenario())


def past_summaries(engine: FakeEngine) -> int:
    """Summary requests of the turns asked as "request N" (not of the turn after them)."""
    return sum("User: request" in r.messages[1]["content"] for r in engine.of_kind("summary"))


def test_edited_answers_get_summaries_within_the_cap(setup):
    """A client that sends every answer back changed (trimmed, reformatted): each past turn is known
    but its answer is not the one committed, so it needs a summary of its own; one request runs at
    most the cap's worth, one attempt each, and the user message stands in for the rest."""
    runner, engine, store = setup
    labels = iter(["L1"] * 8 + ["L2"])
    engine.router = lambda text: next(labels)

    async def scenario():
        h: list[Message] = []
        for i in range(8):
            h.append(user(f"request {i}"))
            text, _ = await run_turn(runner, h)
            h.append(assistant("edited " + text))
        await runner.drain()
        keys = {t.key for t in split_turns(TENANT, h).turns}
        with sqlite3.connect(store.path) as db:  # the edited answers' own entries expired
            db.executemany("DELETE FROM turns WHERE key = ?", [(k,) for (k,) in db.execute("SELECT key FROM turns")
                                                                if k not in keys])
        summaries = past_summaries(engine)
        _, final = await run_turn(runner, [*h, user("write python code")])
        await runner.drain()
        assert final.label == "L2" and past_summaries(engine) - summaries == 4
        view = engine.of_kind("answer")[-1].messages  # the latest turns are summarized, the oldest stand as asked
        assert summary_note(summary_hop.fallback_summary("request 0")) in view
        assert summary_note(summary_hop.fallback_summary("request 7")) not in view
    asyncio.run(scenario())


def test_summaries_rederived_in_one_request_are_capped(setup):
    """Summaries that keep failing leave past turns without one: a request re-derives at most the
    cap's worth, and the user message stands in for the rest."""
    runner, engine, store = setup
    labels = iter(["L1"] * 8 + ["L2"])
    engine.router = lambda text: next(labels)
    engine.fail(lambda r: FakeEngine.kind(r) == "summary", times=10 ** 6)

    async def scenario():
        h: list[Message] = []
        for i in range(8):
            h.append(user(f"request {i}"))
            text, _ = await run_turn(runner, h)
            h.append(assistant(text))
        await runner.drain()
        attempts = past_summaries(engine)
        await run_turn(runner, [*h, user("write python code")])
        await runner.drain()
        assert past_summaries(engine) - attempts == 4  # one attempt each, on the turn's path
    asyncio.run(scenario())


def test_the_whole_turn_has_a_deadline(tmp_path):
    engine = FakeEngine()
    runner = TurnRunner(registry(), engine, SQLiteStore(tmp_path / "s.db"), summary_retry_delay_s=0.0,
                        deadlines=Deadlines(first_token_s=60, inter_token_s=60, turn_s=0.5))

    async def scenario():
        engine.stall(lambda r: FakeEngine.kind(r) == "route", 5.0)  # each hop within its own deadline
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineTimeout, match="deadline of 0.5 s"):
            await run_turn(runner, [user("hello")])
        assert loop.time() - started < 1.5
        engine.chunk_delay_s = 0.2  # an answer that trickles in, each token in time
        with pytest.raises(EngineTimeout, match="deadline of 0.5 s") as late:
            await run_turn(runner, [user("hello " * 20)])
        assert "before its answer began" not in str(late.value)
        assert rows(runner.store.inner) == 0
    asyncio.run(scenario())


def test_a_summary_race_leaves_one_summary_in_every_view(tmp_path):
    """Two replicas need the same past turn's summary at once: the one that loses the write uses
    the winner's, so its view and every later view hold the same bytes (a prefix-cache hit), and
    the turn is not summarized again."""
    store = SQLiteStore(tmp_path / "s.db")
    first = TurnRunner(registry(), FakeEngine(), store, summary_retry_delay_s=0.0)
    engine = FakeEngine(summarizer=lambda asked: f"Loser's summary of {asked}")
    second = TurnRunner(registry(), engine, store, summary_retry_delay_s=0.0)

    async def scenario():
        h = [user("write python code")]
        text, final = await run_turn(first, h)
        await first.drain()
        # The first replica's summary hop failed; the turn's summary is pending ...
        with sqlite3.connect(store.path) as db:
            db.execute("UPDATE turns SET meta = json_set(meta, '$.summary', NULL)")
        inner_set = store.set_summary

        async def racing(tenant, key, summary, summary_s):  # ... and another replica fills it first
            await inner_set(tenant, key, "The coding assistant wrote code.", 0.1)
            return await inner_set(tenant, key, summary, summary_s)

        store.set_summary = racing
        h += [assistant(text), user("book a table")]
        _, f2 = await run_turn(second, h)
        store.set_summary = inner_set
        view = engine.of_kind("answer")[-1].messages
        assert view[1] == summary_note("The coding assistant wrote code.")
        h += [assistant("booked"), user("book another table")]
        await run_turn(second, h)
        assert engine.of_kind("answer")[-1].messages[:2] == view[:2]
        about = [r for r in engine.of_kind("summary") if "write python code" in r.messages[1]["content"]]
        assert len(about) == 1  # the race's loser; no replica summarizes the turn again
    asyncio.run(scenario())


def test_two_answers_to_one_turn_are_each_credited_to_their_own_specialist(setup):
    """An SDK retry while the first request still streams: both answers are delivered; the one
    whose commit lost is kept under its own answer's key with its own specialist, so a
    conversation continued from it is credited rightly (its specialist sees it as its own)."""
    runner, engine, store = setup
    engine.chunk_delay_s = 0.01
    labels = iter(["L1", "L2"])
    engine.router = lambda text: next(labels) if text == "plan my trip" else "L2"

    async def scenario():
        h = [user("plan my trip")]
        (t1, f1), (t2, f2) = await asyncio.gather(run_turn(runner, h), run_turn(runner, h))
        await runner.drain()
        assert {f1.label, f2.label} == {"L1", "L2"}
        for text, final in ((t1, f1), (t2, f2)):
            sha = summary_hop.answer_sha(summary_hop.answer_digest(text, []))
            meta = await store.get_turn(TENANT, final.turn_key)
            if meta.answer_sha != sha:
                meta = await store.get_turn(TENANT, answer_key(final.turn_key, sha))
            assert meta is not None and meta.label == final.label and meta.answer_sha == sha
        lost = t2 if f1.label == "L1" else t1  # L2's answer, whichever commit won
        await run_turn(runner, [*h, assistant(lost), user("write python code")])
        view = engine.of_kind("answer")[-1].messages
        assert view[:2] == [{"role": "user", "content": "plan my trip"}, {"role": "assistant", "content": lost}]
    asyncio.run(scenario())


def test_a_tool_result_goes_back_to_the_specialist_whose_call_it_answers(setup):
    """Two answers to one turn, each a call by another specialist (one of them lost the commit):
    each call's result goes back to the specialist that made it."""
    runner, engine, store = setup
    engine.chunk_delay_s = 0.01
    labels = iter(["L1", "L3"])
    engine.router = lambda text: next(labels)
    answer = engine._answer

    def own_arguments(req):  # each specialist books its own way: two different answers
        chunks, calls = answer(req)
        return chunks, tuple(c.model_copy(update={"function": c.function.model_copy(
            update={"arguments": json.dumps({"by": req.adapter})})}) for c in calls)

    engine._answer = own_arguments

    async def scenario():
        h = [user("tool:book_table plan my evening")]
        answers = await asyncio.gather(run_turn(runner, h, tools=TOOLS), run_turn(runner, h, tools=TOOLS))
        await runner.drain()
        assert {final.label for _, final in answers} == {"L1", "L3"}
        for _, final in answers:
            (call,) = final.tool_calls
            results = [Message(role="assistant", tool_calls=(call,)),
                       Message(role="tool", tool_call_id=call.id, content='{"ok": true}')]
            _, after = await run_turn(runner, [*h, *results], tools=TOOLS)
            assert after.label == final.label
    asyncio.run(scenario())
