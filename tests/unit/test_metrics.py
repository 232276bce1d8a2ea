"""The metrics module, and each counter moving on the path that should move it (fake engine)."""

from __future__ import annotations

import asyncio
import re

import pytest

from macaron_ray.core.conversation import Message
from macaron_ray.core.engine_client import EngineError, EngineTimeout, EngineUnavailable
from macaron_ray.core.turn_runner import TurnRequest, TurnRunner
from macaron_ray.observability import metrics as M
from macaron_ray.store.base import StoreError
from macaron_ray.store.sqlite import SQLiteStore
from macaron_ray.testing.fake_engine import FakeEngine
from tests.unit.test_turn_runner import TENANT, TOOLS, assistant, registry, run_turn, user


@pytest.fixture
def setup(tmp_path):
    engine = FakeEngine()
    runner = TurnRunner(registry(), engine, SQLiteStore(tmp_path / "state.db"), summary_retry_delay_s=0.0)
    return runner, engine


def value(runner: TurnRunner, spec: M.MetricSpec, suffix: str = "", **labels: str) -> float:
    return runner.metrics.exporter.value(spec, suffix, **labels)


def total(runner: TurnRunner, spec: M.MetricSpec, suffix: str = "") -> float:
    """A metric summed over every label set."""
    name = spec.exposed + suffix
    return sum(s.value for metric in runner.metrics.exporter.registry.collect() for s in metric.samples
               if s.name == name)


# -- the module ---------------------------------------------------------------------------------


def test_every_metric_is_defined_once_with_its_unit_in_the_name():
    names = [spec.name for spec in M.ALL]
    assert len(names) == len(set(names))
    metrics = M.MoLMetrics()
    assert {m.spec.name for m in vars(metrics).values() if isinstance(m, M.Metric)} == set(names)
    for spec in M.ALL:
        assert re.fullmatch(r"macaron_[a-z_]+", spec.name) and spec.help.strip()
        if spec.kind == "histogram":
            assert spec.name.endswith("_seconds"), spec.name
        elif spec.kind == "counter":
            assert spec.name.endswith("_total"), spec.name
        else:
            assert not spec.name.endswith(("_total", "_seconds")), spec.name


def test_label_values_are_closed_sets_so_private_names_cannot_become_labels():
    metrics = M.MoLMetrics()
    with pytest.raises(ValueError, match="specialist='secret-adapter-1'"):
        metrics.route_hop.observe(0.1, specialist="secret-adapter-1", surface="chat")
    with pytest.raises(ValueError, match="surface='grpc'"):
        metrics.turn.observe(0.1, specialist="L1", surface="grpc")
    with pytest.raises(ValueError, match="takes labels"):
        metrics.turns_committed.inc(specialist="L1", surface="chat", tenant=TENANT)
    with pytest.raises(ValueError, match="cause='oops'"):
        metrics.rollbacks.inc(cause="oops", surface="chat")
    metrics.route_hop.observe(0.1, specialist="L12", surface="messages")  # any canonical label


def test_the_exposition_names_are_what_ray_exports():
    metrics = M.MoLMetrics()
    metrics.turns_committed.inc(specialist="L1", surface="chat")
    metrics.route_hop.observe(0.2, specialist="L1", surface="chat")
    metrics.turns_in_flight.add(1, surface="chat")
    from prometheus_client import generate_latest

    text = generate_latest(metrics.exporter.registry).decode()
    assert 'ray_macaron_turns_committed_total{specialist="L1",surface="chat"} 1.0' in text
    assert 'ray_macaron_route_hop_seconds_bucket{le="0.2",specialist="L1",surface="chat"} 1.0' in text
    assert 'ray_macaron_turns_in_flight{surface="chat"} 1.0' in text
    for spec in (M.TURNS_COMMITTED, M.ROUTE_HOP, M.TURNS_IN_FLIGHT):
        assert f"# HELP {spec.exposed} {spec.help}" in text


def test_buckets_span_gpu_and_cpu_latencies():
    buckets = M.LATENCY_BUCKETS_S
    assert list(buckets) == sorted(buckets)
    assert sum(b <= 0.1 for b in buckets) >= 6  # tens of ms: GPU route hops
    assert sum(1 <= b <= 60 for b in buckets) >= 10  # seconds: CPU answers
    assert buckets[-1] >= 120


# -- counters on their paths ------------------------------------------------------------------


def test_a_routed_turn_records_every_hop_once(setup):
    runner, engine = setup

    async def scenario():
        _, final = await run_turn(runner, [user("write python code")], surface="messages")
        await runner.wait_summary(TENANT, final.turn_key)
        hop = {"specialist": "L2", "surface": "messages"}
        for spec in (M.ROUTE_HOP, M.ANSWER_TTFT, M.ANSWER, M.SUMMARY_WAIT, M.TURN, M.SUMMARY_HOP):
            assert value(runner, spec, "_count", **hop) == 1, spec.name
        assert value(runner, M.TURN, "_sum", **hop) >= value(runner, M.ANSWER, "_sum", **hop)
        assert value(runner, M.ROUTE_DECISIONS, specialist="L2") == 1
        assert value(runner, M.TURNS_COMMITTED, **hop) == 1
        for hop_name, specialist in (("route", "L0"), ("answer", "L2"), ("summary", "L0")):
            assert value(runner, M.PROMPT_TOKENS, hop=hop_name, specialist=specialist) > 0, hop_name
        assert value(runner, M.TURNS_IN_FLIGHT, surface="messages") == 0
        assert total(runner, M.ROLLBACKS) == 0
    asyncio.run(scenario())


def test_a_tool_result_turn_counts_stickiness_and_records_no_route_hop(setup):
    runner, engine = setup

    async def scenario():
        h = [user("tool:book_table book dinner at 8")]
        _, f1 = await run_turn(runner, h, tools=TOOLS)
        (call,) = f1.tool_calls
        h += [Message(role="assistant", tool_calls=(call,)),
              Message(role="tool", tool_call_id=call.id, content='{"ok": true}')]
        _, f2 = await run_turn(runner, h, tools=TOOLS)
        assert f2.label == "L1"
        assert value(runner, M.STICKINESS_HITS, specialist="L1") == 1
        assert total(runner, M.ROUTE_HOP, "_count") == 1  # the first turn's only
        assert value(runner, M.ANSWER, "_count", specialist="L1", surface="chat") == 2
        assert value(runner, M.TURNS_COMMITTED, specialist="L1", surface="chat") == 1  # a continuation commits nothing
    asyncio.run(scenario())


def test_a_re_entry_reads_its_own_view_from_the_prefix_cache(setup):
    runner, engine = setup

    async def scenario():
        h = [user("write python code for sorting")]
        t1, _ = await run_turn(runner, h)
        h += [assistant(t1), user("now book a table")]
        t2, _ = await run_turn(runner, h)
        before = value(runner, M.CACHED_PROMPT_TOKENS, hop="answer", specialist="L2")
        h += [assistant(t2), user("fix this python bug")]
        await run_turn(runner, h)
        after = value(runner, M.CACHED_PROMPT_TOKENS, hop="answer", specialist="L2")
        assert after > before  # the fake's prefix cache: L2's first view is a prefix of its second
    asyncio.run(scenario())


def test_a_client_disconnect_is_a_rollback_by_client_disconnect(setup):
    runner, engine = setup

    async def scenario():
        gen = runner.run(TurnRequest(tenant=TENANT, messages=(user("draw a chart of sales"),), surface="responses"))
        assert not (await gen.__anext__()).final
        await gen.aclose()
        assert value(runner, M.ROLLBACKS, cause="client_disconnect", surface="responses") == 1
        assert value(runner, M.TURNS_IN_FLIGHT, surface="responses") == 0
        assert total(runner, M.TURN, "_count") == 0  # never delivered: not a user-visible turn
    asyncio.run(scenario())


@pytest.mark.parametrize("error, cause", [(EngineError, "engine_error"), (EngineUnavailable, "unavailable"),
                                          (EngineTimeout, "timeout")])
def test_engine_failures_are_rollbacks_by_their_cause(setup, error, cause):
    runner, engine = setup
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=1, error=error)

    async def scenario():
        with pytest.raises(error):
            await run_turn(runner, [user("write python code")])
        assert value(runner, M.ROLLBACKS, cause=cause, surface="chat") == 1
        assert total(runner, M.ROLLBACKS) == 1
        assert total(runner, M.TURNS_COMMITTED) == 0
    asyncio.run(scenario())


def test_a_route_hop_failure_is_a_rollback_too(setup):
    runner, engine = setup
    engine.fail(lambda r: FakeEngine.kind(r) == "route", error=EngineUnavailable)

    async def scenario():
        with pytest.raises(EngineUnavailable):
            await run_turn(runner, [user("write python code")])
        assert value(runner, M.ROLLBACKS, cause="unavailable", surface="chat") == 1
        assert total(runner, M.ROUTE_HOP, "_count") == 0
    asyncio.run(scenario())


def test_non_canonical_outputs_summary_failures_and_cache_misses_are_counted(setup):
    runner, engine = setup
    engine.router = lambda text: "L9"
    engine.fail(lambda r: FakeEngine.kind(r) == "summary", times=3)

    async def scenario():
        _, final = await run_turn(runner, [user("hello"), assistant("hi"), user("how are you")])
        assert final.label == "L0"
        assert value(runner, M.ROUTER_NONCANONICAL) == 2  # the re-derived past turn and the new one
        assert value(runner, M.OWNVIEW_CACHE_MISSES) == 1
        assert value(runner, M.ROUTE_DECISIONS, specialist="L0") == 1  # re-derivations are not decisions
        await runner.wait_summary(TENANT, final.turn_key)
        assert value(runner, M.SUMMARY_FAILURES) == 1
        assert total(runner, M.SUMMARY_HOP, "_count") == 0
    asyncio.run(scenario())


class BrokenStore(SQLiteStore):
    async def get_turn(self, tenant, key):
        raise OSError("disk gone")

    async def get_turns(self, tenant, keys):
        raise OSError("disk gone")


def test_store_failures_are_counted_by_operation_and_roll_the_turn_back(tmp_path):
    runner = TurnRunner(registry(), FakeEngine(), BrokenStore(tmp_path / "state.db"))

    async def scenario():
        with pytest.raises(StoreError, match="get_turns failed"):
            await run_turn(runner, [user("write code"), assistant("x"), user("more code")])
        assert value(runner, M.STORE_ERRORS, operation="get_turns") == 1
        assert value(runner, M.ROLLBACKS, cause="store_error", surface="chat") == 1
    asyncio.run(scenario())


class SlowSummaries(FakeEngine):
    async def stream(self, request):
        if self.kind(request) == "summary":
            await asyncio.sleep(0.3)
        async for delta in super().stream(request):
            yield delta


def test_summary_wait_measures_a_pending_summary(tmp_path):
    runner = TurnRunner(registry(), SlowSummaries(), SQLiteStore(tmp_path / "state.db"))

    async def scenario():
        h = [user("write python code")]
        t1, f1 = await run_turn(runner, h)
        h += [assistant(t1), user("book a flight")]
        _, f2 = await run_turn(runner, h)
        assert f2.timing.summary_wait_s > 0.1  # turn 1's summary was still running
        assert value(runner, M.SUMMARY_WAIT, "_sum", specialist="L1", surface="chat") == pytest.approx(
            f2.timing.summary_wait_s)
        assert value(runner, M.SUMMARY_WAIT, "_sum", specialist="L2", surface="chat") < 0.01  # turn 1: nothing
    asyncio.run(scenario())
