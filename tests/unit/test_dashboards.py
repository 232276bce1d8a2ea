"""Dashboards as code and alert rules: committed JSON = generated, every query names a real metric,
promtool checks and unit-tests the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from macaron_ray.observability import metrics as M
from macaron_ray.observability.dashboards import all_dashboards, dashboard_json, metric_names
from tests.prometheus import panel_queries

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
SUFFIXES = ("_bucket", "_sum", "_count", "_total")


@cache
def _library_source(package: str) -> str:
    """Every .py file of an installed package, concatenated (metric names are string literals there)."""
    import importlib

    root = Path(importlib.import_module(package).__file__).parent
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py"))


def metric_exists(series: str) -> bool:
    """True when `series` is what one of our metrics, a vLLM metric (through Ray: `vllm:x` ->
    `ray_vllm_x`) or a Ray Serve metric (`serve_x` -> `ray_serve_x`) is exported as."""
    if series.startswith("ray_macaron_"):
        return any(series in spec.series_names() for spec in M.ALL)
    base = series
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            candidates = {base, base.removesuffix(suffix)}
            break
    else:
        candidates = {base}
    if series.startswith("ray_vllm_"):
        source = _library_source("vllm.v1.metrics") + _library_source("vllm.distributed.kv_transfer")
        return any(f'"vllm:{c.removeprefix("ray_vllm_")}"' in source for c in candidates)
    if series.startswith("ray_serve_"):
        source = _library_source("ray.serve")
        # Serve names its ingress metrics per protocol: f"serve_num_{protocol_name}_requests".
        candidates |= {c.replace("_http_", "_{protocol_name}_") for c in candidates}
        return any(f'"serve_{c.removeprefix("ray_serve_")}"' in source for c in candidates)
    return False


def test_the_committed_dashboards_are_what_the_code_generates():
    generated = {f"{spec.uid}.json": dashboard_json(spec) for spec in all_dashboards()}
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert set(committed) == set(generated), "run `macaron dashboards generate`"
    for name, text in generated.items():
        assert committed[name] == text, f"dashboards/{name} is stale: run `macaron dashboards generate`"


def test_every_panel_query_names_a_metric_that_exists():
    seen = set()
    for uid, title, query in panel_queries():
        names = metric_names(query.promql)
        assert names, (uid, title, query.promql)
        for name in names:
            assert metric_exists(name), f"{uid} / {title}: {name} is not an exported metric"
        seen |= names
    # Every MoL metric is on a dashboard.
    for spec in M.ALL:
        assert seen & set(spec.series_names()), f"{spec.name} is on no dashboard"


def test_the_name_check_rejects_a_typo():
    assert metric_exists("ray_vllm_time_to_first_token_seconds_bucket")
    assert metric_exists("ray_serve_deployment_replica_healthy")
    assert not metric_exists("ray_vllm_time_to_frist_token_seconds_bucket")
    assert not metric_exists("ray_serve_deployment_replica_happy")
    assert not metric_exists("ray_macaron_route_seconds_bucket")


def test_panels_are_well_formed():
    for spec in all_dashboards():
        doc = json.loads(dashboard_json(spec))
        assert doc["uid"] == spec.uid and doc["title"] == spec.title
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
        for panel in doc["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["description"].endswith("?") and panel["targets"]
            assert [t["refId"] for t in panel["targets"]] == list("ABCDEFGH"[:len(panel["targets"])])
        assert doc["templating"]["list"][0]["name"] == "datasource"


def test_the_readme_lists_every_panel_and_its_question():
    readme = (ROOT / "README.md").read_text()
    for spec in all_dashboards():
        for panel in spec.panels():
            assert f"| {panel.title} | {panel.question} |" in readme, panel.title


def test_the_provisioning_files_point_at_the_dashboards_and_prometheus():
    provider = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "macaron.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    source = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert source["datasources"][0]["type"] == "prometheus"
    local = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    assert local["rule_files"] == ["alerts.yaml"]


# -- alert rules --------------------------------------------------------------------------------


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus, installed by `make install`"
    return subprocess.run([promtool, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_alert_rules():
    result = _promtool("check", "rules", "alerts.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_each_alert_fires_on_a_failing_series_and_stays_silent_on_a_healthy_one():
    result = _promtool("test", "rules", "alerts_test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((DASHBOARDS / "alerts_test.yaml").read_text())["tests"]
    rules = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())["groups"][0]["rules"]
    for rule in rules:
        cases = [case for t in tests for case in t["alert_rule_test"] if case["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in cases), f"{rule['alert']} is never tested firing"
        assert any(not c["exp_alerts"] for c in cases), f"{rule['alert']} is never tested silent"


def test_every_alert_reads_metrics_that_exist():
    rules = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())["groups"][0]["rules"]
    expected = {"MacaronRouterNonCanonicalOutput", "MacaronRollbackRateHigh", "MacaronRouteHopSlow",
                "MacaronNoHealthyReplica", "MacaronStoreErrors", "MacaronKVTransferFailures"}
    assert {r["alert"] for r in rules} == expected
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names and all(metric_exists(n) for n in names), (rule["alert"], names)


@pytest.mark.parametrize("bad", ["ray_macaron_turn_seconds_count{", "sum by (le) rate(x[5m])"])
def test_promtool_rejects_a_broken_rule(tmp_path, bad):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "g", "rules": [{"alert": "Broken", "expr": bad}]}]}))
    result = subprocess.run([shutil.which("promtool"), "check", "rules", str(tmp_path / "rules.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and re.search(r"parse error|unexpected", result.stdout + result.stderr)
