"""`macaron bench memory`'s parts that need no cluster: charging processes to deployments, the
before/after comparison, the report, the equality prompts."""

from __future__ import annotations

from pathlib import Path

import yaml

from macaron_ray.bench import memory
from macaron_ray.loadtest.traces import load_traces

ROOT = Path(__file__).resolve().parents[2]


class _Proc:
    def __init__(self, pid: int, parent: "_Proc | None" = None):
        self.pid, self._parent = pid, parent

    def parent(self):
        return self._parent


def test_engine_processes_are_charged_to_their_replicas_deployment():
    raylet = _Proc(1)
    replica = _Proc(2, raylet)
    core = _Proc(3, replica)
    worker = _Proc(4, core)
    ingress = _Proc(5, raylet)
    busy = _Proc(6, raylet)
    titles = {1: "/venv/ray/core/src/ray/raylet/raylet", 2: "ray::ServeReplica:macaron:Prefill:base",
              3: "VLLM::EngineCore", 4: "VLLM::Worker", 5: "ray::ServeReplica:macaron:MoLIngress",
              6: "ray::ServeReplica:macaron:Decode:base.handle_request_with_rejection"}
    groups = [memory._group(p, titles) for p in (raylet, replica, core, worker, ingress, busy)]
    assert groups == [memory.RAY_GROUP, "Prefill:base", "Prefill:base", "Prefill:base", "MoLIngress", "Decode:base"]


def _side(pss_gib: float, peak_gib: float, routes: list, answers: dict) -> dict:
    return {"idle": {"pss_bytes": pss_gib * 2**30}, "load": {"peak": {"pss_bytes": peak_gib * 2**30}},
            "outputs": {"routes": routes, "answers": answers}}


def test_compare_counts_equal_outputs_and_checks_the_peak_against_the_target():
    before = _side(8.0, 8.8, ["L0", "L2"], {"L0": ["a", "b"], "L1": ["c", "d"]})
    after = _side(5.0, 5.5, ["L0", "L2"], {"L0": ["a", "b"], "L1": ["c", "x"]})
    result = memory.compare(before, after)
    assert (result["equal_routes"], result["routes"], result["equal_answers"], result["answers"]) == (2, 2, 3, 4)
    assert result["token_for_token_equal"] is False
    assert result["pss_idle_ratio_after_over_before"] == 5.0 / 8.0
    assert result["pss_peak_ratio_after_over_before"] == 5.5 / 8.8
    assert result["meets_target"] is True
    over = memory.compare(before, _side(5.0, 6.1, ["L0", "L2"], {"L0": ["a", "b"], "L1": ["c", "d"]}))
    assert over["token_for_token_equal"] is True and over["meets_target"] is False


def test_the_report_prints_both_topologies():
    def side(gib: float) -> dict:
        groups = {"Decode:base": {"processes": 2, "pss_bytes": 2**30}, "ray": {"processes": 20, "pss_bytes": 2**30}}
        return {"idle": {"pss_bytes": gib * 2**30, "processes": 22, "groups": groups},
                "load": {"conversations": 8, "requests": {"sent": 41, "ok": 40}, "samples": 30, "wall_s": 91.2,
                         "peak": {"pss_bytes": gib * 2**30}, "mean_pss_bytes": gib * 2**30},
                "route_hop_p50_s": 0.2}
    result = {"profile": "local-cpu.yaml", "before": side(8.0), "after": side(5.5), "target_pss_gib": 6.0,
              "pss_idle_ratio_after_over_before": 0.69, "pss_peak_ratio_after_over_before": 0.69,
              "meets_target": True, "equal_routes": 12, "routes": 12, "equal_answers": 48, "answers": 48}
    text = memory.format_report(result)
    assert "before idle  8.00" in text and "after  idle  5.50" in text
    assert "40 requests answered in 91 s" in text
    assert "Decode:base 1.00 (2)" in text and "target peak <= 6 GiB: met" in text
    assert "routes 12/12 equal, greedy answers 48/48 equal" in text


def test_equality_prompts_take_each_conversations_turns_in_rounds():
    convs = load_traces().conversations
    prompts = memory.prompts_from_traces(len(convs) + 1)
    assert prompts == [c.turns[0].user for c in convs] + [convs[0].turns[1].user]


def test_the_before_topology_is_local_cpu_until_2026_12_04(tmp_path):
    path = memory.before_config(ROOT / "deployments" / "local-cpu.yaml", tmp_path / "b.yaml", port=9999,
                                store=tmp_path / "b.db")
    doc = yaml.safe_load(path.read_text())
    args = doc["applications"][0]["args"]
    assert doc["http_options"]["port"] == 9999
    assert args["router"] == {"cpu_cores": "0", "kv_cache_gib": 0.125, "node_type": "cpu"}
    assert args["prefill"]["kv_cache_gib"] == 0.125 and args["prefill"]["engine_kwargs"] == {"enforce_eager": True}
    assert "distributed_executor_backend" not in args["engine_kwargs"]
    assert args["store"] == {"kind": "sqlite", "path": str(tmp_path / "b.db")}
