"""`build_app(args)`: the MoL application on Ray Serve.

    MoLIngress (this project's FastAPI app; N stateless replicas; state in the store)
      ├── Router:<base>    Ray Serve LLM `LLMServer`, base + L0: route and summary hops
      └── Decode:<base>    Ray Serve LLM `PDDecodeServer`, base + all adapters, kv_consumer
            └── Prefill:<base>  `PDPrefillServer`, base + all adapters, kv_producer (NIXL)
    or, aggregated:   Answer:<base>  `LLMServer`, base + all adapters

With `router.colocate_with` there is no Router: route hops go to the prefill, decode (its
engine alone, `chat_local`) or answer deployment, summary hops to the answer deployment
(local-cpu: one engine fewer).
Every engine is Ray Serve LLM's `VLLMEngine`, with the executor the profile asks
for (`macaron_ray.serve.engine`).

Serve restarts dead replicas; while one of these deployments has no running
replica the ingress answers 503 with Retry-After in the surface's envelope.
The ingress records its metrics through `ray.serve.metrics` (Ray's agent exports
them on each node's metrics port); every engine exports vLLM's own metrics
(`log_engine_metrics`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from macaron_ray.serve.args import (
    DEPLOYMENT_PREFIX, EMBEDDED, INGRESS_DEPLOYMENT, NODE_TYPE_SHARE, REPLICA_ENV, AppArgs, StoreArgs,
    node_type_resource,
)


@serve.ingress()
class MoLIngress:
    """Builds the API over Serve handles; the same app `macaron serve --standalone` runs over HTTP."""

    def __init__(self, args: dict, router, answer):
        from macaron_ray.api.gate import Limits
        from macaron_ray.api.surface import Surfaces
        from macaron_ray.core.deadlines import Deadlines
        from macaron_ray.api.tokens import TemplateTokenCounter
        from macaron_ray.core.turn_runner import TurnRunner
        from macaron_ray.observability.metrics import MoLMetrics, RayExporter
        from macaron_ray.observability.tracing import otlp_tracer
        from macaron_ray.serve.handle_engine import ReplicaWatch, ServeHandleEngine

        self.args = AppArgs.model_validate(args)
        self.watch = ReplicaWatch(serve.get_replica_context().app_name)
        self.store = _open_store(self.args)
        prefill = (self.args.deployment_name("prefill"),) if self.args.disaggregated else ()
        parser = self.args.engine_kwargs_for(self.args.answer_role()).get("tool_call_parser")
        answer_engine = ServeHandleEngine(answer, watch=self.watch, also_needs=prefill, tool_call_parser=parser)
        on_decode = self.args.router_role() == "decode"
        route_engine = ServeHandleEngine(router, watch=self.watch, method="chat_local" if on_decode else "chat",
                                         priority=self.args.schedules_by_priority(self.args.router_role()))
        ingress = self.args.ingress
        lim, out = ingress.limits, ingress.timeouts
        self.runner = TurnRunner(self.args.registry(), answer_engine, self.store, router=route_engine,
                                 summarizer=route_engine if self.args.summary_role() == "router" else answer_engine,
                                 metrics=MoLMetrics(RayExporter()), tracer=otlp_tracer(ingress.otlp_endpoint),
                                 deadlines=Deadlines(out.first_token_s, out.inter_token_s, out.turn_s),
                                 summary_timeout_s=out.summary_s, max_rederived_turns=lim.max_rederived_turns)
        self.surfaces = Surfaces(runner=self.runner, tokens=_token_counter(self.args, TemplateTokenCounter),
                                 keys=_key_ring(ingress.api_keys_env), debug_headers=ingress.debug_headers,
                                 context_tokens=self.args.context_tokens(),
                                 limits=Limits(**lim.model_dump(include=set(Limits.__dataclass_fields__))),
                                 max_messages=lim.max_messages, body_limit_bytes=lim.body_bytes)

    async def __serve_build_asgi_app__(self):
        from macaron_ray.api.app import build_api

        self.watch.start()
        return build_api(self.surfaces)

    async def __del__(self):
        await self.watch.stop()
        await self.runner.drain()
        await self.store.close()


def _open_store(args: AppArgs):
    """The conversation store of one ingress replica; called once, when the replica starts."""
    if args.store.kind == "redis":
        from macaron_ray.store.redis import RedisStore

        return RedisStore(_redis_url(args.store), ttl_s=args.store.ttl_s)
    from macaron_ray.paths import cache_dir
    from macaron_ray.store.sqlite import SQLiteStore

    return SQLiteStore(Path(args.store.path).expanduser() if args.store.path
                       else cache_dir() / "state" / f"{args.profile}.db", ttl_s=args.store.ttl_s)


def _key_ring(env: str | None):
    """The keys file held by the env var `env` (mounted from a Secret), or None: no auth. The error
    names the variable, never its value."""
    if env is None:
        return None
    from macaron_ray.api.keys import KeyRing

    text = os.environ.get(env, "")
    if not text.strip():
        raise RuntimeError(f"ingress.api_keys_env: the env var {env} is unset or empty in this replica's "
                           f"environment; it must hold the keys file (`macaron keys new` makes its lines)")
    return KeyRing.parse(text, source=f"the keys in ${env}")


def _redis_url(store: StoreArgs) -> str:
    """`store.url`, or the value of the env var `store.url_env` in this process's environment.

    The error names the variable, never its value: the URL may carry a password."""
    if not store.url_env:
        return store.url
    # A Secret made from a file often ends in a newline; no URL has surrounding whitespace.
    url = os.environ.get(store.url_env, "").strip()
    if not url:
        raise RuntimeError(f"store.url_env: the env var {store.url_env} is unset or empty in this replica's "
                           f"environment; it must hold the Redis URL (the Helm chart mounts it from a Secret)")
    return url


def _token_counter(args: AppArgs, counter_cls):
    """count_tokens renders as the engines do: the base's tokenizer, the template they are given."""
    template = args.base.chat_template
    if template == EMBEDDED:
        from macaron_ray.model.chat_template import load_chat_template

        template = load_chat_template()
    elif template:
        template = Path(template).read_text(encoding="utf-8")
    return counter_cls(args.base_source(), template)


def build_app(args: dict[str, Any]) -> Application:
    """Validate `args` (see `AppArgs`) and build the application graph."""
    from ray.serve.llm import build_llm_deployment
    from ray.serve.llm.deployment import LLMServer, PDPrefillServer

    from macaron_ray.serve.engine import ProfileExecutorVLLMEngine
    from macaron_ray.serve.pd import PrefillCachedDecodeServer

    app_args = AppArgs.model_validate(args)

    def llm_deployment(role: str, cls, **bind_kwargs):
        return build_llm_deployment(app_args.llm_config(role, prepare=True), name_prefix=DEPLOYMENT_PREFIX[role],
                                    deployment_cls=cls,
                                    bind_kwargs={"engine_cls": ProfileExecutorVLLMEngine, **bind_kwargs})

    if app_args.disaggregated:
        prefill = llm_deployment("prefill", PDPrefillServer)
        engines = {"prefill": prefill, "decode": llm_deployment("decode", PrefillCachedDecodeServer,
                                                                prefill_server=prefill)}
    else:
        engines = {"answer": llm_deployment("answer", LLMServer)}
    # A colocated router is the same deployment, bound twice: Serve runs it once.
    router = engines[app_args.router_role()] if app_args.router.colocate_with else llm_deployment("router", LLMServer)
    return ingress_deployment(app_args).bind(app_args.model_dump(mode="json"), router,
                                             engines[app_args.answer_role()])


def ingress_deployment(app_args: AppArgs):
    """The MoLIngress deployment as the profile sizes and places it (bind it to router and answer)."""
    ingress = app_args.ingress
    actor_options: dict[str, Any] = {"num_cpus": ingress.num_cpus, "runtime_env": {"env_vars": dict(REPLICA_ENV)}}
    if ingress.node_type:
        actor_options["resources"] = {node_type_resource(ingress.node_type): NODE_TYPE_SHARE}
    return serve.deployment(MoLIngress, name=INGRESS_DEPLOYMENT, num_replicas=ingress.num_replicas,
                            max_ongoing_requests=ingress.max_ongoing_requests, ray_actor_options=actor_options)
