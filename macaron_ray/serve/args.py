"""The application's arguments: one pydantic model per `serve deploy` profile.

A profile names the base, the specialists, the store, and one engine role per
LLM deployment (router, prefill, decode; or router and one aggregated answer
engine). `AppArgs.llm_config(role)` turns a role into Ray Serve LLM's own
`LLMConfig`: the engines are configured here, never re-implemented.

Engine settings are layered: `engine_kwargs` shared by every engine, then the
role's own `engine_kwargs`, then what the project derives (served adapters,
chat template, KV connector). A key set in two places must agree with the
derived one, so a profile cannot silently turn off what the topology needs.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL, AnswerSampling, Specialist, SpecialistRegistry
from macaron_ray.specialists.labels import EMBEDDED_ANSWER_SAMPLING, ROLES

EMBEDDED = "embedded"
"""The committed default: SmolLM2-135M-Instruct prepared from its wheel, the four built adapters."""

ROLE_NAMES = ("router", "prefill", "decode", "answer")
DEPLOYMENT_PREFIX = {"router": "Router:", "prefill": "Prefill:", "decode": "Decode:", "answer": "Answer:"}
INGRESS_DEPLOYMENT = "MoLIngress"
NIXL_PORT_BASE = {"prefill": 20000, "decode": 22000}
"""NIXL side-channel ports (plus the replica's offset): prefill and decode replicas may share a
node, so each role starts from its own base."""
ENGINE_HEALTH_CHECK_PERIOD_S = 2.0
"""Serve's health-check period of the engine deployments (its default is 10 s). A replica whose
vLLM engine died is replaced after three failed checks: 6 s instead of 30 s of 503s before the
restart even begins (`macaron chaos`, decode_kill and prefill_kill)."""
NODE_TYPE_RESOURCE_PREFIX = "macaron_node_"
"""A node of type T advertises the custom resource `macaron_node_T` (see cluster/)."""
REPLICA_ENV = {"VLLM_CONFIGURE_LOGGING": "0"}
"""In every replica's environment. vLLM configures logging with `dictConfig` when it is imported,
which closes every handler of the process, Serve's own among them; a Serve controller that
restarts (a head lost, then restored by GCS fault tolerance) then fails its check of each running
replica (`is_allocated`: "'NoneType' object has no attribute 'baseFilename'") and replaces them
all, engines included. vLLM's log lines keep a handler of their own (engine/vllm_plugin.py)."""
NODE_TYPE_SHARE = 0.001
"""What one replica asks of its node type's resource: a label, not a capacity."""
NODE_TYPE_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
EXECUTORS = {"cpu": ("mp", "uni"), "gpu": ("ray",)}
"""vLLM executors a profile may ask for. Ray Serve LLM starts CPU engines with "mp" (a worker
process beside the engine core) and GPU engines with "ray"; "uni" runs a one-worker CPU engine's
model in its engine-core process (`macaron_ray.serve.engine`)."""
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM 0.29 accepts (`vllm.config.lora.MaxLoRARanks`); an adapter of
rank 48 is served with max_lora_rank 64. tests/unit/test_profiles.py checks this against vLLM."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BaseArgs(_Strict):
    source: str = EMBEDDED
    """`embedded`, a local model directory, or a model id the cluster's nodes can load."""
    served_name: str = Field("base", pattern=r"^[A-Za-z0-9._-]+$")
    """Private: the engine-side model name. Clients only ever see `public_model`."""
    chat_template: str | None = EMBEDDED
    """`embedded` (the project's template; only for the embedded base), a path, or none (the model's own)."""


class AdapterArgs(_Strict):
    label: str = Field(pattern=r"^L[0-9]+$")
    adapter_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    path: str = Field(min_length=1)
    """A directory every node that runs an answer engine can read."""
    rank: int = Field(ge=1, le=512)
    target_modules: list[str] | None = Field(default=None, min_length=1)
    """The modules the adapter trains (peft's names). When every adapter names them, engines
    put LoRA on those modules only (`lora_target_modules`), not on every module vLLM supports."""
    answer_sampling: AnswerSampling = AnswerSampling()
    """The specialist's sampling for its answers (penalties; None: the engine's defaults)."""


class StoreArgs(_Strict):
    kind: Literal["sqlite", "redis"] = "sqlite"
    path: str | None = None
    """SQLite file (default: the cache dir); one node only."""
    url: str | None = None
    """Redis URL; shared by every ingress replica. It is written into the Serve config as it is:
    a URL with a password belongs in `url_env`."""
    ttl_s: int | None = Field(30 * 24 * 3600, ge=60)
    """Turn metadata, summaries and stored responses expire this long after they are written
    (30 days, as OpenAI keeps stored responses); None: kept until deleted."""
    url_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of an env var holding the Redis URL (e.g. mounted from a Kubernetes Secret), read by
    each ingress replica when it starts. Exactly one of `url` and `url_env` for redis."""

    @model_validator(mode="after")
    def _where(self) -> "StoreArgs":
        if self.kind == "redis":
            if self.url and self.url_env:
                raise ValueError("store.url and store.url_env: set one, not both")
            if not (self.url or self.url_env):
                raise ValueError("store.kind 'redis' needs store.url or store.url_env "
                                 "(the name of an env var holding the URL)")
        else:
            for name in ("url", "url_env"):
                if getattr(self, name):
                    raise ValueError(f"store.{name} is for redis; sqlite takes store.path")
        return self


class LimitArgs(_Strict):
    """What one tenant (API key) may take of one ingress replica, and what one replica takes at once
    (`macaron_ray.api.gate`). Every limit is enforced by each ingress replica on its own: with N
    replicas a tenant gets up to N times each figure (Serve spreads a tenant's requests over them),
    so a profile sets its per-tenant figures divided by `ingress.num_replicas`."""

    requests_per_s: float | None = Field(None, gt=0)
    """Per tenant, per ingress replica, sustained; None: no rate limit."""
    burst: int = Field(20, ge=1)
    """Per tenant, per ingress replica: requests at once above the sustained rate."""
    concurrent_turns: int | None = Field(None, ge=1)
    """Per tenant, per ingress replica: turns (streams included) at once."""
    turns_in_flight: int | None = Field(None, ge=1)
    """Per ingress replica: turns at once before new ones get 503 + Retry-After; below
    `max_ongoing_requests`, so excess load is refused in the API's envelope, not queued by Serve."""
    max_messages: int = Field(1024, ge=1)
    body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    body_read_s: float | None = Field(30.0, gt=0)
    """A turn's whole body must arrive within this, else 408; its turn slots are taken only after."""
    max_rederived_turns: int = Field(32, ge=0)
    """Route hops (and summary hops) one request may run for past turns the store does not know;
    older ones take the entry specialist (and the user message as their summary)."""


class TimeoutArgs(_Strict):
    """Deadlines on every engine call (`macaron_ray.core.deadlines`)."""

    first_token_s: float = Field(120.0, gt=0)
    """From an engine call to its first token (queueing and prefill are in it)."""
    inter_token_s: float = Field(30.0, gt=0)
    turn_s: float = Field(600.0, gt=0)
    """A whole turn, at most: its route hop, the summaries it re-derives and its answer."""
    summary_s: float = Field(120.0, gt=0)
    """One summary attempt, at most."""


class IngressArgs(_Strict):
    num_replicas: int = Field(1, ge=1)
    max_ongoing_requests: int = Field(64, ge=1)
    node_type: str | None = Field(None, pattern=NODE_TYPE_PATTERN)
    num_cpus: float = Field(0.5, ge=0)
    api_keys_env: str | None = None
    """Name of an env var holding the keys file: a line of salted hash per key (`macaron_ray.api.keys`;
    plain keys are refused). Unset: no auth."""
    limits: LimitArgs = Field(default_factory=LimitArgs)
    timeouts: TimeoutArgs = Field(default_factory=TimeoutArgs)

    @model_validator(mode="after")
    def _back_pressure_below_serve(self) -> "IngressArgs":
        cap = self.limits.turns_in_flight
        if cap is not None and cap > self.max_ongoing_requests:
            raise ValueError(f"ingress.limits.turns_in_flight ({cap}) must not exceed ingress.max_ongoing_requests "
                             f"({self.max_ongoing_requests}): beyond it Serve queues the requests before the gate sees them")
        return self
    debug_headers: bool = False
    """Send each turn's specialist label to clients (`x-macaron-specialist`). Off in production:
    the label is an internal routing decision."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): one trace per turn, a span
    per hop. Unset: no tracing, and no tracing cost."""


class CapacityArgs(_Strict):
    """Sizing facts `macaron plan` cannot read on this machine, declared in the profile.

    What can be read here (a safetensors header, the base's config.json) is read;
    a declared value that disagrees with it is an error, never silently preferred.
    """

    base_parameters: int | None = Field(None, ge=1)
    """Stored values of the base (GLM-5.2: the report's nominal 744B). Unset: counted from the
    embedded base's safetensors headers."""
    adapter_values: dict[str, int] = Field(default_factory=dict)
    """Stored values of each adapter, by label, as published in its safetensors header; used
    while the adapter's files are not on this machine."""
    adapter_values_rounding: int = Field(1, ge=1)
    """The declared adapter_values are rounded to a multiple of this many values (1: exact);
    a header count more than half of it away is a disagreement."""
    base_bytes_per_value: float = Field(2.0, gt=0)
    """Device bytes per stored base value: 2 for bf16, 1 for fp8."""
    adapter_bytes_per_value: float = Field(2.0, gt=0)
    """Device bytes per stored adapter value."""
    kv_bytes_per_token_per_device: int | None = Field(None, ge=1)
    """KV cache bytes one token takes on one device of an engine, before decode context
    parallelism shards the tokens. Unset: from the base's config.json when it is local."""
    device_memory_gib: float | None = Field(None, gt=0)
    """Memory of one accelerator (GPU profiles), in GiB."""

    @field_validator("adapter_values")
    @classmethod
    def _labels(cls, values: dict[str, int]) -> dict[str, int]:
        for label, count in values.items():
            if not re.fullmatch(r"L[0-9]+", label) or count < 1:
                raise ValueError(f"adapter_values: {label!r}: {count} is not a label and a positive count")
        return values


class EngineRole(_Strict):
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    cpu_cores: str | None = Field(None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    """CPU engines: the cores its OpenMP threads are pinned to (VLLM_CPU_OMP_THREADS_BIND)."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """CPU engines: the KV cache size (vLLM's `kv_cache_memory_bytes`); the CPU default takes a
    share of the machine's memory, which three engines on one laptop cannot all have."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    node_type: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$")
    num_replicas: int = Field(1, ge=1)
    max_ongoing_requests: int | None = Field(None, ge=1)
    placement_group_config: dict[str, Any] | None = None
    nixl_port_base: int | None = Field(None, ge=1024, le=65000)


class RouterRole(EngineRole):
    colocate_with: Literal["prefill", "decode", "answer"] | None = None
    """Send route hops to this role's engine (it serves L0 with the other adapters) instead of an
    engine of their own: one engine, and its processes, fewer. On a prefill engine they run as
    ordinary requests: only the decode server's requests carry KV-transfer parameters. On the
    decode engine they run there alone, without the prefill handoff
    (`PrefillCachedDecodeServer.chat_local`): a route hop then shares short decode steps with the
    running answers instead of waiting behind prompt chunks. Summary hops go to the answer
    deployment (`AppArgs.summary_role`). The router has no engine settings of its own."""


class AppArgs(_Strict):
    profile: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    public_model: str = Field(DEFAULT_PUBLIC_MODEL, min_length=1)
    accelerator: Literal["cpu", "gpu"] = "cpu"
    accelerator_type: str | None = None
    """GPU profiles: Ray's accelerator type (e.g. B300, H20); engines land only on such nodes."""
    base: BaseArgs = Field(default_factory=BaseArgs)
    adapters: Literal["embedded"] | list[AdapterArgs] = EMBEDDED
    store: StoreArgs = Field(default_factory=StoreArgs)
    ingress: IngressArgs = Field(default_factory=IngressArgs)
    disaggregated: bool = True
    kv_connector: str = "NixlConnector"
    kv_buffer_device: Literal["cpu", "cuda"] = "cpu"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Shared by every engine."""
    router: RouterRole = Field(default_factory=RouterRole)
    prefill: EngineRole | None = None
    decode: EngineRole | None = None
    answer: EngineRole | None = None
    """The aggregated answer engine (disaggregated: false)."""
    cluster: str | None = Field(None, pattern=NODE_TYPE_PATTERN)
    """The Ray cluster definition `cluster/<name>.yaml` this profile runs on: every node type the
    profile names must exist there, with GPUs enough for each engine (tests/unit/test_profiles.py)."""
    capacity: CapacityArgs | None = None
    """Declared sizing facts for `macaron plan` (GPU profiles: what cannot be read on this machine)."""

    @field_validator("adapters")
    @classmethod
    def _distinct(cls, adapters):
        if isinstance(adapters, list):
            labels = [a.label for a in adapters]
            if len(set(labels)) != len(labels):
                raise ValueError(f"duplicate adapter labels: {labels}")
            if "L0" not in labels:
                raise ValueError("the adapters must include L0 (the router and chat specialist)")
        return adapters

    @model_validator(mode="after")
    def _topology(self) -> "AppArgs":
        if self.store.kind == "sqlite" and self.ingress.num_replicas > 1:
            raise ValueError(f"store.kind 'sqlite' is one file on one node: {self.ingress.num_replicas} ingress "
                             "replicas cannot share it (each would hold its own conversations); use store.kind "
                             "'redis' or one ingress replica")
        if self.disaggregated:
            if self.prefill is None or self.decode is None:
                raise ValueError("a disaggregated profile needs both 'prefill' and 'decode'")
            if self.answer is not None:
                raise ValueError("'answer' is the aggregated engine; a disaggregated profile has prefill and decode")
        else:
            if self.answer is None:
                raise ValueError("an aggregated profile (disaggregated: false) needs 'answer'")
            if self.prefill is not None or self.decode is not None:
                raise ValueError("an aggregated profile has no 'prefill' or 'decode'")
        if self.accelerator == "cpu" and self.accelerator_type:
            raise ValueError("accelerator_type is for GPU profiles")
        if self.accelerator == "cpu" and self.kv_buffer_device != "cpu":
            raise ValueError("kv_buffer_device 'cuda' needs a GPU profile; CPU engines transfer KV from CPU memory")
        if self.capacity and self.adapters != EMBEDDED:
            unknown = set(self.capacity.adapter_values) - {a.label for a in self.adapters}
            if unknown:
                raise ValueError(f"capacity.adapter_values names labels that are not adapters: {sorted(unknown)}")
        if (target := self.router.colocate_with) is not None:
            if getattr(self, target) is None:
                raise ValueError(f"router.colocate_with: {target!r} is not an engine of this profile")
            own = self.router.model_dump(exclude_defaults=True, exclude={"colocate_with"})
            if own:
                raise ValueError(f"router.colocate_with: the router runs on the {target} engine and has no engine "
                                 f"of its own; move {sorted(own)} to '{target}'")
        if self.base.chat_template == EMBEDDED and self.base.source != EMBEDDED:
            raise ValueError("base.chat_template 'embedded' fits only the embedded base; give a path or null")
        for name, role in self.roles().items():
            for key in ("model", "served_model_name", "lora_modules", "kv_transfer_config",
                        "enable_lora", "max_loras", "max_lora_rank", "lora_target_modules", "chat_template"):
                if key in role.engine_kwargs or key in self.engine_kwargs:
                    raise ValueError(f"{name}: engine_kwargs.{key} is set by the topology, not by the profile")
            if role.kv_cache_gib and "kv_cache_memory_bytes" in {**self.engine_kwargs, **role.engine_kwargs}:
                raise ValueError(f"{name}: set kv_cache_gib or engine_kwargs.kv_cache_memory_bytes, not both")
            if self.accelerator == "gpu" and (role.cpu_cores or role.kv_cache_gib):
                raise ValueError(f"{name}: cpu_cores and kv_cache_gib are for CPU engines")
            merged = {**self.engine_kwargs, **role.engine_kwargs}
            executor = merged.get("distributed_executor_backend")
            if executor is not None and executor not in EXECUTORS[self.accelerator]:
                raise ValueError(f"{name}: engine_kwargs.distributed_executor_backend {executor!r}: Ray Serve LLM "
                                 f"runs {self.accelerator.upper()} engines with one of {EXECUTORS[self.accelerator]}")
            parallel = {k: merged[k] for k in ("tensor_parallel_size", "pipeline_parallel_size") if merged.get(k, 1) != 1}
            if executor == "uni" and parallel:
                raise ValueError(f"{name}: distributed_executor_backend 'uni' runs one worker; {parallel} needs 'mp'")
        return self

    # -- derived views -------------------------------------------------------

    def roles(self) -> dict[str, EngineRole]:
        """The LLM deployments this profile runs, by role."""
        roles: dict[str, EngineRole] = {} if self.router.colocate_with else {"router": self.router}
        if self.disaggregated:
            roles.update(prefill=self.prefill, decode=self.decode)
        else:
            roles["answer"] = self.answer
        return roles

    def deployment_name(self, role: str) -> str:
        """The Serve deployment of a role, as Ray Serve LLM names it (`Decode:base`)."""
        return DEPLOYMENT_PREFIX[role] + self.base.served_name.replace("/", "--").replace(".", "_")

    def deployment_names(self) -> set[str]:
        """Every deployment of the application, the ingress included."""
        return {INGRESS_DEPLOYMENT, *(self.deployment_name(role) for role in self.roles())}

    def router_role(self) -> str:
        """The role whose deployment the ingress sends route and summary hops to."""
        return self.router.colocate_with or "router"

    def context_tokens(self) -> int | None:
        """The smallest `max_model_len` of the engines (None where one takes its model's own): the
        ingress refuses requests that cannot fit before calling any engine."""
        lengths = [self.engine_kwargs_for(role).get("max_model_len") for role in self.roles()]
        return None if None in lengths else min(lengths)

    def summary_role(self) -> str:
        """The role whose deployment the ingress sends summary hops to: the router's engine, or, when
        the router has none, the answer deployment. A summary decodes up to its budget; on the
        prefill engine each of its tokens would wait for a step of prompt work (local-cpu, 8
        conversations: a mean 4.1 s wait for pending summaries there), while decode batches it with
        the running answers."""
        return self.answer_role() if self.router.colocate_with else "router"

    def schedules_by_priority(self, role: str) -> bool:
        """The role's engine runs vLLM's priority scheduler (route hops first, summaries last)."""
        return self.engine_kwargs_for(role).get("scheduling_policy") == "priority"

    def answer_role(self) -> str:
        """The role whose deployment the ingress sends answer hops to."""
        return "decode" if self.disaggregated else "answer"

    def adapter_list(self) -> list[AdapterArgs]:
        if self.adapters != EMBEDDED:
            return list(self.adapters)
        from macaron_ray.adapters.manifest import BUILT_DIR, Manifest

        manifest = Manifest.load(BUILT_DIR)
        return [AdapterArgs(label=a.label, adapter_id=a.adapter_id, path=str(BUILT_DIR / a.path), rank=a.rank,
                            target_modules=list(a.target_modules),
                            answer_sampling=AnswerSampling(**EMBEDDED_ANSWER_SAMPLING.get(a.label, {})))
                for a in manifest.adapters]

    def registry(self) -> SpecialistRegistry:
        return SpecialistRegistry(public_model=self.public_model, specialists=tuple(
            Specialist(label=a.label, adapter_id=a.adapter_id, description=ROLES.get(a.label, a.label),
                       answer_sampling=a.answer_sampling)
            for a in self.adapter_list()))

    def base_source(self, *, prepare: bool = False) -> str:
        """The base's path or id. `prepare`: build the embedded base if it is not cached (driver side)."""
        if self.base.source != EMBEDDED:
            return self.base.source
        from macaron_ray.model.prepare import base_model_dir, prepare_base_model

        return str(prepare_base_model() if prepare else base_model_dir())

    def engine_kwargs_for(self, role: str) -> dict[str, Any]:
        """Everything the role's vLLM engine is started with, except model and served name."""
        kwargs = copy.deepcopy(self.engine_kwargs)
        role_spec = self.roles()[role]
        kwargs.update(copy.deepcopy(role_spec.engine_kwargs))
        adapters = self.adapter_list()
        if role == "router":
            adapters = [a for a in adapters if a.label == "L0"]
        kwargs.update(enable_lora=True, max_loras=len(adapters),
                      max_lora_rank=_vllm_lora_rank(max(a.rank for a in adapters)),
                      lora_modules=[{"name": a.adapter_id, "path": a.path} for a in adapters])
        if all(a.target_modules for a in adapters):
            kwargs["lora_target_modules"] = sorted({m for a in adapters for m in a.target_modules})
        if self.base.chat_template == EMBEDDED:
            from macaron_ray.model.chat_template import CHAT_TEMPLATE_PATH

            kwargs["chat_template"] = str(CHAT_TEMPLATE_PATH)
        elif self.base.chat_template:
            kwargs["chat_template"] = self.base.chat_template
        if role in ("prefill", "decode"):
            kwargs["kv_transfer_config"] = {
                "kv_connector": self.kv_connector,
                "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                "kv_buffer_device": self.kv_buffer_device,
            }
            if role == "decode":  # KV blocks that fail to arrive are recomputed here, not a failed request
                kwargs["kv_transfer_config"]["kv_load_failure_policy"] = "recompute"
        if role_spec.kv_cache_gib:
            kwargs["kv_cache_memory_bytes"] = int(role_spec.kv_cache_gib * 2**30)
        kwargs.setdefault("enable_prompt_tokens_details", True)
        kwargs.setdefault("enable_prefix_caching", True)
        return kwargs

    def llm_config(self, role: str, *, prepare: bool = False):
        """Ray Serve LLM's `LLMConfig` for one role."""
        from ray.serve.llm import LLMConfig

        spec = self.roles()[role]
        env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", **REPLICA_ENV, **spec.env_vars}
        if spec.cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_cores
        deployment: dict[str, Any] = {"num_replicas": spec.num_replicas,
                                      "health_check_period_s": ENGINE_HEALTH_CHECK_PERIOD_S}
        if spec.max_ongoing_requests:
            deployment["max_ongoing_requests"] = spec.max_ongoing_requests
        if spec.node_type:
            deployment["ray_actor_options"] = {"resources": {node_type_resource(spec.node_type): NODE_TYPE_SHARE}}
        experimental = {}
        if role in NIXL_PORT_BASE:
            experimental["NIXL_SIDE_CHANNEL_PORT_BASE"] = spec.nixl_port_base or NIXL_PORT_BASE[role]
        config = dict(
            model_loading_config={"model_id": self.base.served_name, "model_source": self.base_source(prepare=prepare)},
            engine_kwargs=self.engine_kwargs_for(role),
            runtime_env={"env_vars": env},
            deployment_config=deployment,
            experimental_configs=experimental,
            log_engine_metrics=True,
        )
        if self.accelerator == "cpu":
            config["accelerator_config"] = {"kind": "cpu"}
        elif self.accelerator_type:
            config["accelerator_type"] = self.accelerator_type
        if spec.placement_group_config:
            config["placement_group_config"] = spec.placement_group_config
        return LLMConfig(**config)


def _vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of this rank."""
    return next(r for r in VLLM_MAX_LORA_RANKS if r >= rank)


def node_type_resource(node_type: str) -> str:
    return NODE_TYPE_RESOURCE_PREFIX + node_type.replace("-", "_")


def load_profile(path: str | Path) -> AppArgs:
    """The args of the first application in a `serve deploy` file."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text())
    return AppArgs.model_validate(doc["applications"][0]["args"])
