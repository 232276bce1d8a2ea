"""The EngineClient over Serve handles, and the profile's derived engine settings, without Ray running."""

from __future__ import annotations

import asyncio
import json
import time
from unittest import mock
from pathlib import Path

import pytest
from ray.serve.llm.openai_api_models import ErrorResponse

from macaron_ray.core.engine_client import EngineError, EngineRequest
from macaron_ray.serve.args import AppArgs, load_profile
from macaron_ray.serve.handle_engine import ReplicaWatch, ServeHandleEngine, sse_payloads

ROOT = Path(__file__).resolve().parents[2]


def _sse(chunk: dict) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def _delta(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


class FakeHandle:
    """Stands in for a DeploymentHandle: `.options(stream=True).chat.remote(body)` yields items."""

    deployment_name = "Decode:base"

    def __init__(self, items=(), error: BaseException | None = None):
        self.items, self.error, self.bodies = list(items), error, []

    def options(self, **_):
        return self

    @property
    def chat(self):
        return self

    async def _stream(self):
        for item in self.items:
            yield item
        if self.error is not None:
            raise self.error

    def remote(self, body):
        self.bodies.append(body)
        self.response = FakeResponse(self._stream())
        return self.response


class FakeResponse:
    """A DeploymentResponseGenerator: iterates the replica's stream; `cancel()` cancels it there."""

    def __init__(self, stream):
        self._stream, self.cancelled = stream, False

    def __aiter__(self):
        return self._stream

    def cancel(self):
        self.cancelled = True


async def _collect(engine, request):
    return [d async for d in engine.stream(request)]


def test_stream_turns_sse_items_and_batches_into_deltas():
    usage = {"usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                       "prompt_tokens_details": {"cached_tokens": 4}}, "choices": []}
    handle = FakeHandle([_sse(_delta("Hel")), [_sse(_delta("lo")), _sse(_delta("!", "stop"))], _sse(usage),
                         "data: [DONE]\n\n"])
    deltas = asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(
        adapter="adapter-2", messages=[{"role": "user", "content": "hi"}], max_tokens=5, choice=("L0", "L1"))))
    assert [d.text for d in deltas[:-1]] == ["Hel", "lo", "!"]
    final = deltas[-1]
    assert final.finish_reason == "stop" and final.usage.cached_tokens == 4 and final.usage.prompt_tokens == 7
    body = handle.bodies[0]
    assert body.model == "adapter-2" and body.stream and body.max_tokens == 5


def test_an_engine_error_response_becomes_an_engine_error():
    error = ErrorResponse(error={"message": "boom", "type": "InternalServerError", "code": 500})
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(FakeHandle([error])), EngineRequest(adapter="a", messages=[])))
    assert err.value.retryable
    bad = ErrorResponse(error={"message": "bad", "type": "BadRequestError", "code": 400})
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(FakeHandle([bad])), EngineRequest(adapter="a", messages=[])))
    assert not err.value.retryable


def test_an_error_event_mid_stream_raises_instead_of_ending_the_answer():
    handle = FakeHandle([_sse(_delta("Hel")), _sse({"error": {"message": "engine died", "code": 500}})])
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(adapter="a", messages=[])))
    assert err.value.retryable


def test_a_dead_replica_is_a_retryable_engine_error():
    from ray.exceptions import ActorDiedError

    handle = FakeHandle([_sse(_delta("x"))], error=ActorDiedError())
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(adapter="a", messages=[])))
    assert err.value.retryable


class EngineDeadError(Exception):
    """Stands in for vLLM's (matched by name, as the ingress does not import vLLM)."""


@pytest.mark.parametrize("hops", [1, 2])
def test_a_replica_whose_engine_died_is_a_retryable_engine_error(hops):
    from ray.exceptions import RayTaskError

    from macaron_ray.core.engine_client import EngineUnavailable

    error: BaseException = EngineDeadError("EngineCore encountered an issue")
    for _ in range(hops):  # the decode server's call to the prefill server wraps it once more
        error = RayTaskError("chat", "traceback", error).as_instanceof_cause()
    handle = FakeHandle([_sse(_delta("x"))], error=error)
    with pytest.raises(EngineUnavailable) as err:
        asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(adapter="a", messages=[])))
    assert err.value.retryable


def test_another_replica_task_error_is_not_taken_for_a_restart():
    from ray.exceptions import RayTaskError

    error = RayTaskError("chat", "traceback", ValueError("a bug")).as_instanceof_cause()
    handle = FakeHandle([_sse(_delta("x"))], error=error)
    with pytest.raises(RayTaskError):
        asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(adapter="a", messages=[])))


def _watch_reading(*views: dict[str, int] | Exception) -> ReplicaWatch:
    """A watch whose cached view is views[0] and whose reads of Serve return (or raise) the next views."""
    reads = iter(views[1:])

    async def read():
        view = next(reads)
        if isinstance(view, Exception):
            raise view
        return view

    watch = ReplicaWatch("macaron", read=read)
    watch._running, watch._updated = views[0], time.monotonic()
    return watch


def test_no_running_replica_fails_at_once_without_calling_the_handle():
    watch = _watch_reading({"Decode:base": 0}, {"Decode:base": 0}, {"Decode:base": 1, "Prefill:base": 0})
    handle = FakeHandle([_sse(_delta("x"))])
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(handle, watch=watch), EngineRequest(adapter="a", messages=[])))
    assert err.value.retryable and handle.bodies == []
    # Decode calls prefill itself: prefill without a replica fails the request at once too.
    with pytest.raises(EngineError):
        asyncio.run(_collect(ServeHandleEngine(handle, watch=watch, also_needs=("Prefill:base",)),
                             EngineRequest(adapter="a", messages=[])))
    assert handle.bodies == []
    assert asyncio.run(_collect(ServeHandleEngine(handle, watch=watch), EngineRequest(adapter="a", messages=[])))
    # A stale view lets the request try: the handle itself then decides.
    watch._updated = time.monotonic() - 60
    assert watch.available("Decode:base")


def test_a_replica_started_since_the_last_poll_serves_the_request():
    # The cached view predates the replica; the read made before failing sees it running.
    watch = _watch_reading({"Router:base": 0}, {"Router:base": 1})
    handle = FakeHandle([_sse(_delta("x"))])
    assert asyncio.run(_collect(ServeHandleEngine(handle, watch=watch), EngineRequest(adapter="a", messages=[])))
    assert len(handle.bodies) == 1


def test_an_unreadable_status_keeps_the_cached_view():
    watch = _watch_reading({"Router:base": 0}, ConnectionError("controller restarting"))
    assert asyncio.run(watch.first_unavailable(("Router:base",))) == "Router:base"


def test_sse_payloads_reads_strings_and_lists():
    assert sse_payloads(["data: a\n\ndata: b\n\n", "data: c\n\n"]) == ["a", "b", "c"]


def test_local_cpu_profile_derives_each_engine():
    args = load_profile(ROOT / "deployments" / "local-cpu.yaml")
    # Two engines: the route and summary hops go to the prefill deployment.
    assert args.deployment_names() == {"MoLIngress", "Prefill:base", "Decode:base"}
    assert args.answer_role() == "decode" and args.router_role() == "prefill" and args.summary_role() == "decode"
    prefill, decode = (args.engine_kwargs_for(r) for r in ("prefill", "decode"))
    # Prefill and decode carry every adapter (L0 among them), each with its own KV role.
    assert args.registry().adapter("L0") in [m["name"] for m in prefill["lora_modules"]]
    assert [m["name"] for m in prefill["lora_modules"]] == [m["name"] for m in decode["lora_modules"]]
    assert len(decode["lora_modules"]) == 4 and decode["max_lora_rank"] == 8
    # LoRA on the modules the adapters train, not on the MLP as well.
    assert prefill["lora_target_modules"] == decode["lora_target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert prefill["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert decode["kv_transfer_config"]["kv_role"] == "kv_consumer"
    # KV that fails to arrive (prefill died after its prefill) is recomputed on decode, not a failed answer.
    assert decode["kv_transfer_config"]["kv_load_failure_policy"] == "recompute"
    assert "kv_load_failure_policy" not in prefill["kv_transfer_config"]
    # The embedded chat specialist's answers carry its repetition penalty; the others keep the engine's.
    sampling = {s.label: s.answer_sampling.model_dump(exclude_none=True) for s in args.registry().specialists}
    assert sampling == {"L0": {"repetition_penalty": 1.1, "frequency_penalty": 0.3}, "L1": {}, "L2": {}, "L3": {}}
    assert prefill["kv_cache_memory_bytes"] == 2 * 2**27 and decode["kv_cache_memory_bytes"] == 3 * 2**27
    assert decode["enforce_eager"] and prefill["enforce_eager"]
    # The prefill engine takes route hops before answer prompts; decode never sees either.
    assert args.schedules_by_priority("prefill") and not args.schedules_by_priority("decode")
    configs = {role: args.llm_config(role) for role in ("prefill", "decode")}
    pins = {role: c.runtime_env["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] for role, c in configs.items()}
    assert pins == {"prefill": "0", "decode": "1"}
    # Ray Serve LLM starts CPU engines with "mp"; the profile's "uni" reaches the engine class that keeps it.
    for config in configs.values():
        assert config.engine_kwargs["distributed_executor_backend"] == "uni"
        assert config.get_engine_config().get_initialization_kwargs()["distributed_executor_backend"] == "mp"
    # Prefill and decode may share a node: distinct NIXL side-channel ports.
    ports = {configs[r].experimental_configs["NIXL_SIDE_CHANNEL_PORT_BASE"] for r in ("prefill", "decode")}
    assert len(ports) == 2
    assert configs["decode"].deployment_config["ray_actor_options"]["resources"] == {"macaron_node_cpu": 0.001}


def test_a_dedicated_router_serves_l0_only(tmp_path):
    """local-cpu as it ran until 2026-12-04 (`macaron bench memory`'s "before"): a router engine of its own."""
    from macaron_ray.bench.memory import before_config

    args = load_profile(before_config(ROOT / "deployments" / "local-cpu.yaml", tmp_path / "before.yaml", port=8000,
                                      store=tmp_path / "before.db"))
    assert args.deployment_names() == {"MoLIngress", "Router:base", "Prefill:base", "Decode:base"}
    assert args.router_role() == args.summary_role() == "router"
    router = args.engine_kwargs_for("router")
    assert [m["name"] for m in router["lora_modules"]] == [args.registry().adapter("L0")]
    assert "kv_transfer_config" not in router and "enforce_eager" not in router
    assert router["kv_cache_memory_bytes"] == 2**27 == args.engine_kwargs_for("prefill")["kv_cache_memory_bytes"]
    assert all("distributed_executor_backend" not in args.engine_kwargs_for(r) for r in args.roles())
    assert args.llm_config("router").runtime_env["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_the_engine_class_keeps_the_profiles_executor():
    from types import SimpleNamespace

    from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

    from macaron_ray.serve.engine import ProfileExecutorVLLMEngine

    seen = []
    for asked in ("uni", "mp", None):
        engine = ProfileExecutorVLLMEngine.__new__(ProfileExecutorVLLMEngine)
        engine.llm_config = SimpleNamespace(engine_kwargs={} if asked is None else
                                            {"distributed_executor_backend": asked})
        config = SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend="mp"))
        with mock.patch.object(VLLMEngine, "_start_async_llm_engine",
                               lambda self, a, c, pg: seen.append(c.parallel_config.distributed_executor_backend)):
            engine._start_async_llm_engine(None, config, None)
    assert seen == ["uni", "mp", "mp"]


@pytest.mark.parametrize("change, message", [
    ({"answer": {"cpu_cores": "1"}}, "'answer' is the aggregated engine"),
    ({"prefill": None}, "needs both 'prefill' and 'decode'"),
    ({"engine_kwargs": {"lora_modules": []}}, "set by the topology"),
    ({"decode": {"engine_kwargs": {"lora_target_modules": ["q_proj"]}}}, "set by the topology"),
    ({"prefill": {"kv_cache_gib": 1, "engine_kwargs": {"kv_cache_memory_bytes": 1}}}, "not both"),
    ({"router": {"colocate_with": "prefill", "cpu_cores": "0"}}, r"no engine of its own; move \['cpu_cores'\]"),
    ({"router": {"colocate_with": "answer"}}, "'answer' is not an engine of this profile"),
    ({"engine_kwargs": {"distributed_executor_backend": "ray"}}, r"CPU engines with one of \('mp', 'uni'\)"),
    ({"decode": {"engine_kwargs": {"distributed_executor_backend": "uni", "tensor_parallel_size": 2}}},
     "'uni' runs one worker"),
    ({"store": {"kind": "redis"}}, "needs store.url"),
    ({"adapters": [{"label": "L1", "adapter_id": "a", "path": "/x", "rank": 8}]}, "must include L0"),
])
def test_profile_errors_name_the_problem(change, message):
    args = load_profile(ROOT / "deployments" / "local-cpu.yaml").model_dump(mode="json")
    args.update(change)
    with pytest.raises(ValueError, match=message):
        AppArgs.model_validate(args)


def test_an_abandoned_answer_is_cancelled_in_its_replica():
    """A client gone or a deadline passed: the replica's generator is cancelled (which aborts the
    engine request), not left decoding; a stream read to its end is not."""
    async def first_then_leave(engine, request):
        stream = engine.stream(request)
        first = await anext(stream)
        await stream.aclose()
        return first

    request = EngineRequest(adapter="a", messages=[{"role": "user", "content": "hi"}])
    handle = FakeHandle([_sse(_delta("Hel")), _sse(_delta("lo", "stop"))])
    assert asyncio.run(first_then_leave(ServeHandleEngine(handle), request)).text == "Hel"
    assert handle.response.cancelled
    handle = FakeHandle([_sse(_delta("Hel")), _sse(_delta("lo", "stop"))])
    asyncio.run(_collect(ServeHandleEngine(handle), request))
    assert not handle.response.cancelled
    handle = FakeHandle([_sse(_delta("Hel"))], error=RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        asyncio.run(_collect(ServeHandleEngine(handle), request))
    assert handle.response.cancelled


def test_a_request_vllms_model_refuses_is_a_400_engine_error_not_a_crash():
    """vLLM's request validators raise its own VLLMValidationError (not pydantic's) on the Serve
    path: the API answers it as the engine refusing the request (400), never a 500."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    request = EngineRequest(adapter="a", messages=[{"role": "user", "content": "hi"}], tools=tools,
                            tool_choice={"type": "function", "function": {"name": "g"}})
    handle = FakeHandle()
    with pytest.raises(EngineError) as err:
        asyncio.run(_collect(ServeHandleEngine(handle), request))
    assert err.value.status == 400 and not err.value.retryable and handle.bodies == []


def test_decode_usage_reports_the_prefill_engines_cache_hits():
    from ray.serve.llm.openai_api_models import ChatCompletionResponse

    from macaron_ray.serve.pd import with_cached_tokens

    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 79, "completion_tokens": 3, "total_tokens": 82,
                                                  "prompt_tokens_details": {"cached_tokens": 79}}}
    text = _sse(_delta("x")) + _sse(usage)
    patched = with_cached_tokens([_sse(_delta("hi")), text], 32)
    assert patched[0] == _sse(_delta("hi"))
    chunks = [json.loads(p) for p in sse_payloads(patched)]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert chunks[-1]["usage"]["prompt_tokens"] == 79 and chunks[1] == _delta("x")
    whole = ChatCompletionResponse(id="c", model="m", created=0, choices=[], usage={
        "prompt_tokens": 79, "completion_tokens": 1, "total_tokens": 80, "prompt_tokens_details": {"cached_tokens": 79}})
    assert with_cached_tokens(whole, 0).usage.prompt_tokens_details.cached_tokens == 0


class LocalOnlyHandle(FakeHandle):
    """A decode deployment's handle on which only `chat_local` may be called."""

    @property
    def chat(self):
        raise AssertionError("a route hop on the decode engine must not take the prefill handoff")

    @property
    def chat_local(self):
        return self


def test_route_hops_colocated_with_decode_run_on_the_decode_engine_alone():
    """`router.colocate_with: decode`: the route hop calls the decode server's `chat_local` (its
    engine, no prefill handoff) with its priority; answers still take `chat` (prefill, then decode)."""
    from macaron_ray.serve.pd import PrefillCachedDecodeServer

    profile = load_profile(ROOT / "deployments" / "local-cpu.yaml").model_dump(mode="json")
    profile["router"] = {"colocate_with": "decode"}
    profile["decode"]["engine_kwargs"]["scheduling_policy"] = "priority"
    args = AppArgs.model_validate(profile)
    assert args.router_role() == "decode" and set(args.roles()) == {"prefill", "decode"}
    assert args.summary_role() == args.answer_role() == "decode" and args.schedules_by_priority("decode")
    handle = LocalOnlyHandle([_sse(_delta("L1", "stop")), "data: [DONE]\n\n"])
    engine = ServeHandleEngine(handle, method="chat_local", priority=True)
    deltas = asyncio.run(_collect(engine, EngineRequest(adapter="l0", messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=1, priority=-1)))
    assert deltas[0].text == "L1" and handle.bodies[0].priority == -1
    assert "chat_local" in PrefillCachedDecodeServer.__dict__  # the method the handle calls exists there
    with pytest.raises(AssertionError, match="prefill handoff"):
        asyncio.run(_collect(ServeHandleEngine(handle), EngineRequest(adapter="l0", messages=[])))
