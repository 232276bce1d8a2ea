"""Every `serve deploy` profile against what consumes it (Ray Serve, Ray Serve LLM, vLLM 0.29), and
the Ray cluster definitions the GPU profiles run on. Nothing is started: GPU profiles cannot run here.

Each check of `validate_profile` has a negative test below proving it can fail.
"""

from __future__ import annotations

import copy
from pathlib import Path
import typing

import pytest
import yaml

from macaron_ray.cluster.spec import CLUSTER_DIR, ClusterSpec
from macaron_ray.engine.local_server import LocalEngineSpec
from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.serve.args import VLLM_MAX_LORA_RANKS, AppArgs, load_profile, node_type_resource
from macaron_ray.serve.validate import check_engine_kwargs, engine_world_size, validate_profile

DEPLOYMENTS = PACKAGE_DIR.parent / "deployments"
PROFILES = sorted(DEPLOYMENTS.glob("*.yaml"))
GPU_PROFILES = [p for p in PROFILES if load_profile(p).accelerator == "gpu"]
CLUSTERS = sorted(CLUSTER_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_profile_is_accepted_by_serve_appargs_and_vllm(path):
    assert validate_profile(path) == []


def test_both_gpu_profiles_exist_and_name_their_cluster():
    assert {p.name for p in GPU_PROFILES} == {"tall-h20.yaml", "venti-b300.yaml"}
    for path in GPU_PROFILES:
        args = load_profile(path)
        assert args.cluster and args.store.kind == "redis" and args.kv_buffer_device == "cuda"
        assert args.base.chat_template is None and args.adapters != "embedded"


def test_venti_long_context_settings():
    args = load_profile(DEPLOYMENTS / "venti-b300.yaml")
    decode, prefill = args.engine_kwargs_for("decode"), args.engine_kwargs_for("prefill")
    assert decode["decode_context_parallel_size"] == 8 and decode["speculative_config"]["method"] == "eagle3"
    assert decode["attention_backend"] == "FLASHMLA_SPARSE" and decode["kv_cache_dtype"] == "fp8_ds_mla"
    assert decode["max_model_len"] >= 10**6 and prefill["max_model_len"] >= 10**6
    assert decode["tensor_parallel_size"] == 8 and decode["enable_expert_parallel"] is True


@pytest.mark.parametrize("path", GPU_PROFILES, ids=lambda p: p.name)
def test_llm_config_constructs_without_preparing_anything(path, tmp_path, monkeypatch):
    from macaron_ray.model import prepare

    monkeypatch.setenv("MACARON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(prepare, "prepare_base_model", lambda *a, **k: pytest.fail("must not prepare"))
    monkeypatch.setattr(prepare, "base_model_dir", lambda *a, **k: pytest.fail("must not touch the cache"))
    args = load_profile(path)
    for role in args.roles():
        config = args.llm_config(role)
        assert config.model_loading_config.model_source == args.base.source
        assert config.accelerator_type == args.accelerator_type
        assert config.log_engine_metrics is True  # vLLM's metrics, exported through Ray
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("path", [p for p in PROFILES if p not in GPU_PROFILES], ids=lambda p: p.name)
def test_cpu_engines_export_their_metrics_and_the_ingress_keeps_labels_private(path):
    args = load_profile(path)
    assert all(args.llm_config(role).log_engine_metrics is True for role in args.roles())
    assert args.ingress.debug_headers is False and args.ingress.otlp_endpoint is None


def test_lora_ranks_are_vllms():
    from vllm.config.lora import MaxLoRARanks

    assert VLLM_MAX_LORA_RANKS == typing.get_args(MaxLoRARanks)
    # Tall's rank-48 adapters are served with the next rank vLLM accepts.
    assert load_profile(DEPLOYMENTS / "tall-h20.yaml").engine_kwargs_for("decode")["max_lora_rank"] == 64


def test_engines_put_lora_only_where_the_adapters_train_it():
    # GPU adapters do not declare their modules: vLLM's default (every supported module) stays.
    assert "lora_target_modules" not in load_profile(DEPLOYMENTS / "tall-h20.yaml").engine_kwargs_for("decode")
    spec = LocalEngineSpec.from_manifest(Path("/models/base"), port=8000)
    cmd = spec.command()
    i = cmd.index("--lora-target-modules")
    assert cmd[i + 1:i + 5] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    # vLLM's own parser reads the flag as the engine's LoRAConfig.target_modules.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", "m", "--enable-lora", *cmd[i:i + 5]])
    assert AsyncEngineArgs.from_cli_args(parsed).lora_target_modules == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_planner_default_gpu_memory_utilization_is_vllms():
    from vllm.config import CacheConfig

    from macaron_ray.plan.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

    assert CacheConfig().gpu_memory_utilization == VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


# -- each check can fail -------------------------------------------------------------------------


def _problems(tmp_path, mutate, name="venti-b300.yaml", cluster_dir=CLUSTER_DIR) -> list[str]:
    doc = yaml.safe_load((DEPLOYMENTS / name).read_text())
    mutate(doc, doc["applications"][0]["args"])
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return validate_profile(path, cluster_dir=cluster_dir)


def _one(problems: list[str], *fragments: str) -> None:
    assert problems, "the broken profile was accepted"
    assert any(all(f in p for f in fragments) for p in problems), problems


def test_a_bad_serve_field_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: doc.update(proxy_location="Nowhere")), "ServeDeploySchema")


def test_an_unknown_args_key_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args.update(max_concurrency=4)), "args", "max_concurrency")


def test_an_unknown_engine_key_is_refused_by_vllm_and_by_ray(tmp_path):
    problems = _problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(max_modle_len=4096))
    _one(problems, "argument parser", "--max-modle-len")
    _one(problems, "Ray Serve LLM", "max_modle_len")


def test_a_bad_choice_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(kv_cache_dtype="fp9")),
         "argument parser", "invalid choice: 'fp9'")


def test_a_bad_type_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(max_num_seqs="many")),
         "argument parser", "--max-num-seqs")


def test_an_unknown_attention_backend_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(attention_backend="FLASHMLA_SPARSER")),
         "VllmConfig", "Unknown attention backend")


def test_an_unknown_tool_parser_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(tool_call_parser="glm99")),
         "tool_call_parser 'glm99'")


def test_a_bad_nested_config_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(
        compilation_config={"cudagraph_mode": "SOMETIMES"})), "SOMETIMES")


def test_a_bad_speculative_config_is_refused(tmp_path):
    def mutate(doc, args):
        args["decode"]["engine_kwargs"]["speculative_config"].update(method="eagle4", num_spec_tokens=3)

    problems = _problems(tmp_path, mutate)
    _one(problems, "speculative_config.method")
    _one(problems, "speculative_config.num_spec_tokens")


def test_vllms_cross_config_rules_run(tmp_path):
    # DCP must divide TP.
    _one(_problems(tmp_path, lambda doc, args: args["decode"]["engine_kwargs"].update(
        decode_context_parallel_size=3)), "VllmConfig", "divisible by dcp_size=3")


def test_prefill_context_parallelism_next_to_nixl_is_refused(tmp_path):
    # Why venti-b300's prefill is TP8 x DCP8 and not the report's CP8: vLLM 0.29 refuses PCP under NIXL.
    def mutate(doc, args):
        args["prefill"]["engine_kwargs"].update(tensor_parallel_size=1, prefill_context_parallel_size=8,
                                                decode_context_parallel_size=1)
        args["prefill"]["placement_group_config"] = {
            "bundles": [{"GPU": 1, "macaron_node_b300_prefill": 0.001}] * 8, "strategy": "STRICT_PACK"}

    _one(_problems(tmp_path, mutate), "prefill", "NIXL does not support prefill context parallelism")


def test_a_lora_rank_vllm_does_not_serve_is_refused():
    # AppArgs rounds ranks up (and forbids max_lora_rank in profiles), so check the kwargs directly.
    problems = check_engine_kwargs({"enable_lora": True, "max_loras": 1, "max_lora_rank": 24})
    _one(problems, "argument parser", "--max-lora-rank")
    _one(problems, "LoRAConfig", "max_lora_rank")


def test_a_placement_group_smaller_than_the_engine_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["decode"].update(
        placement_group_config={"bundles": [{"GPU": 1}] * 4})), "decode", "holds 4 GPUs", "world size is 8")


def test_a_bad_placement_group_config_is_refused_by_ray(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["decode"].update(
        placement_group_config={"bundle_per_worker": {"GPU": 1}, "strategy": "WHEREVER"})), "Ray Serve LLM")


def test_a_node_type_missing_from_the_cluster_is_refused(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["decode"].update(node_type="b300-spare")),
         "cluster b300", "b300-spare")


def test_a_node_with_too_few_gpus_is_refused(tmp_path):
    cluster = yaml.safe_load((CLUSTER_DIR / "b300.yaml").read_text())
    decode = next(g for g in cluster["workers"] if g["node_type"] == "b300-decode")
    decode.update(num_gpus=4, container={**decode["container"], "nvidia_gpus": 4})
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "b300.yaml").write_text(yaml.safe_dump(cluster))
    _one(_problems(tmp_path, lambda doc, args: None, cluster_dir=tmp_path / "clusters"),
         "decode", "needs 8 GPUs", "have 4")


def test_more_engines_than_a_node_type_holds_are_refused(tmp_path):
    # Tall's three engines fill an H20 node; eight TP4 decode replicas want more GPUs than 4 nodes have.
    _one(_problems(tmp_path, lambda doc, args: args["decode"].update(num_replicas=8), name="tall-h20.yaml"),
         "engines on h20 want")


def test_a_cpu_profile_cannot_use_a_cuda_kv_buffer(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args.update(kv_buffer_device="cuda"), name="local-cpu.yaml"),
         "kv_buffer_device")


def test_a_sqlite_store_is_refused_with_more_than_one_ingress_replica(tmp_path):
    """Limits and conversations are per replica with SQLite: one file on one node cannot be shared."""
    _one(_problems(tmp_path, lambda doc, args: args["ingress"].update(num_replicas=2), name="local-cpu.yaml"),
         "store.kind 'sqlite' is one file on one node")


def test_topology_keys_are_refused_in_engine_kwargs(tmp_path):
    _one(_problems(tmp_path, lambda doc, args: args["engine_kwargs"].update(max_loras=8)),
         "max_loras is set by the topology")


# -- cluster definitions --------------------------------------------------------------------------


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.name)
def test_cluster_renders_ray_start_flags_ray_accepts(path):
    from ray._private.label_utils import parse_node_labels_string
    from ray.scripts.scripts import start

    cluster = ClusterSpec.named(path.stem)
    for group in cluster.groups():
        head_address = None if group is cluster.head else "10.0.0.1:6379"
        # Ray's own `ray start` command parses the flags (click; nothing starts).
        params = start.make_context("start", group.ray_start_args(head_address=head_address)).params
        assert params["head"] is (head_address is None)
        assert (params["num_cpus"], params["num_gpus"]) == (group.num_cpus, group.num_gpus)
        assert params["object_store_memory"] == group.object_store_memory_bytes
        assert yaml.safe_load(params["resources"])[node_type_resource(group.node_type)] == 1
        assert parse_node_labels_string(params["labels"] or "") == group.labels


def test_gpu_clusters_label_their_accelerators():
    for name, accelerator in (("b300", "B300"), ("h20", "H20")):
        gpu_groups = [g for g in ClusterSpec.named(name).groups() if g.num_gpus]
        assert gpu_groups and {g.accelerator_type for g in gpu_groups} == {accelerator}
        assert all(g.num_gpus == 8 and g.container.nvidia_gpus == 8 for g in gpu_groups)


def test_local_cluster_is_a_head_and_one_worker_of_the_local_node_type():
    cluster = ClusterSpec.named("local-cpu")
    assert cluster.head.node_type == "cpu" and len(cluster.workers) == 1
    assert all(g.num_gpus == 0 for g in cluster.groups())


@pytest.mark.parametrize("path", GPU_PROFILES, ids=lambda p: p.name)
def test_gpu_profile_engines_fit_their_cluster_nodes(path):
    args = load_profile(path)
    cluster = ClusterSpec.named(args.cluster)
    assert cluster.group_for(args.ingress.node_type) is not None
    for role, spec in args.roles().items():
        group = cluster.group_for(spec.node_type)
        assert group.accelerator_type == args.accelerator_type
        assert group.num_gpus >= engine_world_size(args.engine_kwargs_for(role))


def _h20_cluster(**gpu_group) -> dict:
    raw = yaml.safe_load((CLUSTER_DIR / "h20.yaml").read_text())
    raw["workers"][1].update(gpu_group)
    return raw


@pytest.mark.parametrize("change, message", [
    ({"resources": {"macaron_node_gpu": 1}}, "macaron_node_h20: 1"),
    ({"labels": {}}, "ray.io/accelerator-type"),
    ({"num_gpus": 4}, "nvidia_gpus"),
    ({"replicas": 5}, "min_replicas <= replicas <= max_replicas"),
    ({"object_store_memory_bytes": 1024}, "greater than or equal"),
    ({"gpus": 8}, "Extra inputs"),
])
def test_cluster_spec_is_strict(change, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        ClusterSpec.model_validate(_h20_cluster(**change))


def test_appargs_capacity_is_strict():
    from pydantic import ValidationError

    args = load_profile(DEPLOYMENTS / "venti-b300.yaml").model_dump()
    bad = copy.deepcopy(args)
    bad["capacity"]["adapter_values"]["L9"] = 1
    with pytest.raises(ValidationError, match="not adapters"):
        AppArgs.model_validate(bad)
    bad = copy.deepcopy(args)
    bad["capacity"]["kv_bytes_per_token"] = 1
    with pytest.raises(ValidationError, match="Extra inputs"):
        AppArgs.model_validate(bad)


def test_a_local_engine_refuses_a_port_another_server_holds(tmp_path):
    """Else the other server would answer the start's health check for the new engine."""
    import socket

    from macaron_ray.engine.local_server import LocalEngineSpec, LocalVLLMServer

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        spec = LocalEngineSpec(model_dir=tmp_path, adapters={}, port=held.getsockname()[1])
        server = LocalVLLMServer(spec)
        with pytest.raises(RuntimeError, match="already in use"):
            server.start(timeout_s=5)
        assert server._proc is None  # nothing was started
