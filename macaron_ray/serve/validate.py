"""Check a `serve deploy` profile against the code that will consume it, starting nothing.

GPU profiles cannot run on a CPU machine, so each part of a profile is handed to
what reads it at deploy time, as far as that works without a GPU or the model:

- the file: Ray Serve's `ServeDeploySchema`;
- the app's `args`: `AppArgs`;
- each engine role's `LLMConfig` (Ray Serve LLM: accelerator, placement group)
  and Ray's split of its engine kwargs into vLLM engine and frontend arguments
  (`VLLMEngineConfig.from_llm_config`, which rejects any other key);
- the final engine kwargs (`AppArgs.engine_kwargs_for(role)`), rendered as
  `vllm serve` flags and parsed by vLLM 0.29's own parser (every key is a flag,
  every value passes its type and choices), then `validate_parsed_serve_args`;
- vLLM's config classes: `FrontendArgs`, `AsyncEngineArgs` with its nested
  configs (through Ray's own normalizer), `LoRAConfig`, and a `VllmConfig`
  built without a model, which runs vLLM's cross-config rules (parallel layout,
  KV connector, cache dtype, attention backend);
- `speculative_config`: keys and field types only, because constructing
  `SpeculativeConfig` loads the draft model's config;
- the placement group: its GPUs equal the engine's world size;
- the cluster the profile names: every node type exists, with GPUs enough.

`validate_profile(path)` returns the problems found; an empty list means valid.
vLLM is imported only when a check needs it (about 15 s, once per process).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from pathlib import Path
from typing import Annotated, Any

import yaml

from macaron_ray.cluster.spec import CLUSTER_DIR, ClusterSpec
from macaron_ray.serve.args import AppArgs

IMPORT_PATH = "macaron_ray.serve:build_app"
SET_BY_VLLM = frozenset({"target_model_config", "target_parallel_config", "draft_model_config",
                         "draft_parallel_config"})
"""SpeculativeConfig fields vLLM fills in itself; a profile must not."""


def engine_world_size(kwargs: dict[str, Any]) -> int:
    """GPUs one engine replica uses: vLLM's world size, pipeline x tensor x prefill-context parallel.

    Decode context parallelism reuses the tensor-parallel ranks and adds none.
    """
    return (int(kwargs.get("pipeline_parallel_size", 1)) * int(kwargs.get("tensor_parallel_size", 1))
            * int(kwargs.get("prefill_context_parallel_size", 1)))


def validate_profile(path: str | Path, *, cluster_dir: Path = CLUSTER_DIR) -> list[str]:
    """Every problem found in one `serve deploy` file, each naming where it is."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    path = Path(path)
    doc = yaml.safe_load(path.read_text())
    try:
        schema = ServeDeploySchema.model_validate(doc)
    except ValidationError as exc:
        return [f"{path.name}: Ray Serve's ServeDeploySchema: {_first_lines(exc)}"]
    problems: list[str] = []
    for app in schema.applications:
        where = f"{path.name}:{app.name}"
        if app.import_path != IMPORT_PATH:
            problems.append(f"{where}: import_path is {app.import_path!r}, not {IMPORT_PATH!r}")
            continue
        try:
            args = AppArgs.model_validate(app.args)
        except ValidationError as exc:
            problems.append(f"{where}: args: {_first_lines(exc)}")
            continue
        for role in args.roles():
            problems += [f"{where}.{role}: {p}" for p in _role_problems(args, role)]
        if args.cluster:
            problems += [f"{where}: cluster {args.cluster}: {p}" for p in cluster_problems(args, cluster_dir)]
    return problems


def _role_problems(args: AppArgs, role: str) -> list[str]:
    kwargs = args.engine_kwargs_for(role)
    problems = check_engine_kwargs(kwargs)
    try:
        # Ray Serve LLM validates the LLMConfig, then splits engine_kwargs the way the replica will.
        engine_config = args.llm_config(role).get_engine_config()
    except Exception as exc:  # pydantic's ValidationError or Ray's ValueError: report, keep checking
        return [*problems, f"Ray Serve LLM: {_first_lines(exc)}"]
    if args.accelerator == "gpu":
        # Ray sizes its default bundles by TP x PP only; prefill context parallelism needs more.
        gpus = sum(bundle.get("GPU", 0) for bundle in engine_config.placement_bundles)
        world = engine_world_size(kwargs)
        if gpus != world:
            problems.append(f"the placement group holds {gpus:g} GPUs, the engine's world size is {world} "
                            "(tp x pp x pcp): give placement_group_config.bundles")
    return problems


def check_engine_kwargs(kwargs: dict[str, Any]) -> list[str]:
    """Problems vLLM 0.29 itself finds in one engine's kwargs (engine and frontend arguments)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import FrontendArgs, validate_parsed_serve_args
    from vllm.tool_parsers import ToolParserManager

    problems: list[str] = []
    parser = _vllm_parser()
    try:
        namespace = parser.parse_args(cli_flags(kwargs, parser))
        validate_parsed_serve_args(namespace)
        if (namespace.tool_call_parser and not namespace.tool_parser_plugin
                and namespace.tool_call_parser not in ToolParserManager.list_registered()):
            problems.append(f"vLLM: tool_call_parser {namespace.tool_call_parser!r} is not one of "
                            f"{sorted(ToolParserManager.list_registered())}")
    except Exception as exc:  # the parser's errors, raised instead of exiting (see _RaisingParser)
        problems.append(f"vLLM's argument parser: {_first_lines(exc)}")

    # The same split as Ray's VLLMEngineConfig.from_llm_config; unknown keys were reported above.
    frontend_fields = {f.name for f in dataclasses.fields(FrontendArgs)}
    engine_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    frontend = {k: v for k, v in kwargs.items() if k in frontend_fields}
    engine = {k: v for k, v in kwargs.items() if k in engine_fields and k not in frontend_fields}
    try:
        FrontendArgs(**frontend)
    except Exception as exc:
        problems.append(f"vLLM FrontendArgs: {_first_lines(exc)}")
    try:
        engine_args = AsyncEngineArgs(**_ray_normalized(engine))
    except Exception as exc:
        return [*problems, f"vLLM AsyncEngineArgs: {_first_lines(exc)}"]
    problems += _config_problems(engine_args, set(engine))
    if isinstance(engine.get("speculative_config"), dict):
        problems += speculative_config_problems(engine["speculative_config"])
    return problems


def cli_flags(kwargs: dict[str, Any], parser) -> list[str]:
    """Engine kwargs as `vllm serve` flags.

    Rendered the way vLLM's own `--config` YAML loader renders them, except that
    dicts inside lists (lora_modules) become JSON, not Python reprs. An unset
    optional (None) is left out: that is its default.
    """
    flags: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            negative = "--no-" + key.replace("_", "-")
            if value:
                flags.append(flag)
            elif negative in parser._option_string_actions:  # as vLLM's loader does
                flags.append(negative)
        elif isinstance(value, list):
            flags += [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def speculative_config_problems(spec: dict[str, Any]) -> list[str]:
    """Keys and value types of a speculative_config, against vLLM's `SpeculativeConfig` fields.

    Constructing SpeculativeConfig resolves the draft model (it reads the draft's
    and the target's model config), which cannot happen here; each field is
    checked on its own with the field's own type and constraints instead.
    """
    from pydantic import TypeAdapter
    from vllm.config import SpeculativeConfig

    fields = SpeculativeConfig.__pydantic_fields__
    problems = []
    for key, value in spec.items():
        info = fields.get(key)
        if info is None or key in SET_BY_VLLM:
            problems.append(f"speculative_config.{key} is not a SpeculativeConfig field one can set")
            continue
        annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        try:
            TypeAdapter(annotation).validate_python(value)
        except Exception as exc:
            problems.append(f"speculative_config.{key}: {_first_lines(exc)}")
    return problems


def cluster_problems(args: AppArgs, cluster_dir: Path = CLUSTER_DIR) -> list[str]:
    """Every node type the profile names exists in its cluster, with GPUs enough for its engines."""
    try:
        cluster = ClusterSpec.named(args.cluster, cluster_dir)
    except Exception as exc:
        return [_first_lines(exc)]
    problems = []
    placed = [("ingress", args.ingress.node_type, None)]
    placed += [(role, spec.node_type, spec) for role, spec in args.roles().items()]
    gpus_wanted: dict[str, int] = {}
    for name, node_type, spec in placed:
        group = cluster.group_for(node_type) if node_type else None
        if group is None:
            problems.append(f"{name}: node_type {node_type!r} is not a node type of the cluster "
                            f"({[g.node_type for g in cluster.groups()]})")
            continue
        if spec is None or args.accelerator != "gpu":
            continue
        world = engine_world_size(args.engine_kwargs_for(name))
        if group.num_gpus < world:
            problems.append(f"{name}: one replica needs {world} GPUs on one node; {node_type} nodes have "
                            f"{group.num_gpus}")
        if group.accelerator_type != args.accelerator_type:
            problems.append(f"{name}: {node_type} nodes carry accelerator {group.accelerator_type!r}, "
                            f"the profile asks {args.accelerator_type!r}")
        gpus_wanted[node_type] = gpus_wanted.get(node_type, 0) + world * spec.num_replicas
    for node_type, wanted in gpus_wanted.items():
        # Necessary, not sufficient: each replica's bundles must also pack onto single nodes.
        group = cluster.group_for(node_type)
        if wanted > group.num_gpus * group.max_replicas:
            problems.append(f"the engines on {node_type} want {wanted} GPUs; at most {group.max_replicas} "
                            f"nodes x {group.num_gpus} GPUs exist")
    return problems


class _ParserError(ValueError):
    """What vLLM's argument parser would have printed before exiting."""


@functools.lru_cache(maxsize=1)
def _vllm_parser():
    """`vllm serve`'s parser: the frontend and engine arguments, as vLLM 0.29 registers them."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _RaisingParser(FlexibleArgumentParser):
        def error(self, message):
            raise _ParserError(message)

    return make_arg_parser(_RaisingParser(prog="vllm serve"))


def _ray_normalized(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Nested config dicts turned into vLLM's config classes exactly as Ray Serve LLM does before
    `AsyncEngineArgs(**kwargs)` (a private helper of Ray 2.60, pinned with it)."""
    from ray.llm._internal.serve.engines.vllm.vllm_engine import _normalize_vllm_engine_kwargs

    return _normalize_vllm_engine_kwargs(copy.deepcopy(engine_kwargs))


def _config_problems(engine_args, given: set[str]) -> list[str]:
    """vLLM's cross-config rules, from a `VllmConfig` built without a model."""
    from vllm.config import AttentionConfig, CacheConfig, LoRAConfig, ParallelConfig, VllmConfig

    def section(cls, renames: dict[str, str] | None = None) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        renames = renames or {}
        return {renames.get(k, k): getattr(engine_args, k) for k in given if renames.get(k, k) in names}

    problems = []
    if engine_args.enable_lora:
        try:  # not part of the model-free VllmConfig: its checks read the model config
            LoRAConfig(**section(LoRAConfig))
        except Exception as exc:
            problems.append(f"vLLM LoRAConfig: {_first_lines(exc)}")
    try:
        attention = copy.deepcopy(engine_args.attention_config)
        if engine_args.attention_backend is not None:
            attention.backend = AttentionConfig.validate_backend_before(engine_args.attention_backend)
        VllmConfig(parallel_config=ParallelConfig(**section(ParallelConfig)),
                   cache_config=CacheConfig(**section(CacheConfig, {"kv_cache_dtype": "cache_dtype"})),
                   kv_transfer_config=engine_args.kv_transfer_config,
                   attention_config=attention)
    except Exception as exc:
        problems.append(f"vLLM VllmConfig: {_first_lines(exc)}")
    return problems


def _first_lines(exc: BaseException, limit: int = 6) -> str:
    """An exception's message, short enough for a list of problems."""
    lines = [line for line in str(exc).splitlines() if line.strip() and "errors.pydantic.dev" not in line]
    text = " | ".join(lines[:limit])
    # A KeyError's message is only the key: the type says what happened.
    return text if isinstance(exc, ValueError) and text else f"{type(exc).__name__}: {text}"
