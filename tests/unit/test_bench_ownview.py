"""`macaron bench ownview` on the fake engine: both views replay the same traces; naive resends more."""

from __future__ import annotations

import asyncio

from macaron_ray.bench import ownview
from macaron_ray.core.conversation import Message, TurnMeta, split_turns
from macaron_ray.core.own_view import naive_view, own_view
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.loadtest.traces import load_traces
from macaron_ray.store.sqlite import SQLiteStore
from macaron_ray.testing.fake_engine import FakeEngine
from tests.unit.test_turn_runner import registry


def test_the_naive_view_is_the_whole_history_verbatim():
    msgs = [Message(role="user", content="code please"), Message(role="assistant", content="print(1)"),
            Message(role="user", content="book a table")]
    h = split_turns("t", msgs)
    past = [(h.turns[0], TurnMeta(label="L2", summary="wrote code"))]
    assert naive_view("L1", (), past, h.turns[1]) == [m.to_openai() for m in msgs]
    assert own_view("L1", (), past, h.turns[1]) != naive_view("L1", (), past, h.turns[1])


def test_both_views_replay_the_suite_traces(tmp_path):
    traces = load_traces()

    async def go(view: str) -> tuple[list[dict], FakeEngine]:
        engine = FakeEngine()
        runner = TurnRunner(registry(), engine, SQLiteStore(tmp_path / f"{view}.db"), view=view,
                            summary_retry_delay_s=0.0)
        rows = await ownview.replay(runner, traces, view, answer_tokens=16)
        await runner.drain()
        return rows, engine

    (own, own_engine), (naive, naive_engine) = asyncio.run(go("own")), asyncio.run(go("naive"))
    assert len(own) == len(naive) == traces.requests
    assert [r["label"] for r in own] == [r["label"] for r in naive]  # routing does not depend on the view
    assert all(0 <= r["computed_tokens"] <= r["prompt_tokens"] for r in own + naive)
    # The last answer of the first conversation: own-view shows other turns as summaries, naive verbatim.
    n = len(traces.conversations[0].turns)  # the fake engine makes no tool calls on these traces
    last_own, last_naive = own_engine.of_kind("answer")[n - 1], naive_engine.of_kind("answer")[n - 1]
    assert any(m["role"] == "system" and "Summary:" in (m["content"] or "") for m in last_own.messages)
    assert not any("Summary:" in (m["content"] or "") for m in last_naive.messages)
    assert sum(m["role"] == "assistant" for m in last_naive.messages) > sum(
        m["role"] == "assistant" for m in last_own.messages)
    summary = ownview._summary(own)
    assert summary["reentries"] > 0 and summary["reentry_cached_share"]["min"] > 0
