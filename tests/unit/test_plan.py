"""`macaron plan`: header-only value counts, MoL vs replicated residency, KV-token capacity."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from macaron_ray.adapters.manifest import BUILT_DIR, Manifest
from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.plan import PlanError, count_values, plan_profile, plan_residency, read_header
from macaron_ray.plan.report import add_plan_parser, human, run
from macaron_ray.serve.args import AppArgs, load_profile

DEPLOYMENTS = PACKAGE_DIR.parent / "deployments"
VENTI_ADAPTER_VALUES = 7_688_042_496
SMOLLM2_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # K and V x layers x KV heads x head_dim x bf16


def _adapter_files():
    return [BUILT_DIR / a.path / "adapter_model.safetensors" for a in Manifest.load().adapters]


@pytest.mark.parametrize("path", _adapter_files(), ids=lambda p: p.parent.name)
def test_header_count_equals_the_tensors_numel(path):
    with safe_open(str(path), "pt") as f:
        numel = sum(f.get_tensor(k).numel() for k in f.keys())
    assert count_values(path) == numel > 0


def test_counting_reads_no_tensor_data(tmp_path):
    # A file cut right after its header counts the same: the count never reads past it.
    source = _adapter_files()[0]
    data = source.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    cut = tmp_path / "header-only.safetensors"
    cut.write_bytes(data[:8 + length])
    assert cut.stat().st_size < source.stat().st_size
    assert count_values(cut) == count_values(source)
    # ...and one cut inside the header is refused, not miscounted.
    (tmp_path / "short.safetensors").write_bytes(data[:8 + length // 2])
    with pytest.raises(ValueError, match="cut short"):
        count_values(tmp_path / "short.safetensors")


def test_metadata_is_not_a_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5), "s": torch.zeros(())}, path, metadata={"format": "pt"})
    assert "__metadata__" not in read_header(path)
    assert count_values(path) == 12 + 5 + 1


def test_venti_residency_reproduces_the_report():
    residency = plan_residency(load_profile(DEPLOYMENTS / "venti-b300.yaml"))
    assert residency.base.values == 744 * 10**9
    assert [c.values for c in residency.adapters.values()] == [VENTI_ADAPTER_VALUES] * 4
    assert residency.mol_values == 744 * 10**9 + 4 * VENTI_ADAPTER_VALUES
    assert residency.replicated_values == 2_976 * 10**9
    assert round(residency.fewer_pct, 1) == 74.0
    assert (human(residency.mol_values), human(residency.replicated_values)) == ("774.8B", "2.976T")


def test_tall_residency_matches_the_reports_50_1b():
    residency = plan_residency(load_profile(DEPLOYMENTS / "tall-h20.yaml"))
    assert human(residency.mol_values) == "50.1B"


def _local(**role) -> AppArgs:
    args = load_profile(DEPLOYMENTS / "local-cpu.yaml").model_dump(exclude_defaults=True)
    for name in ("prefill", "decode"):
        args[name].update(role)
    return AppArgs.model_validate(args)


def test_local_kv_capacity_is_kv_memory_over_the_configs_bytes_per_token():
    plan = plan_profile(_local(kv_cache_gib=1))
    # Two engines: the router's hops run on the prefill engine (router.colocate_with).
    assert [k.role for k in plan.kv] == ["prefill", "decode"]
    assert [k.kv_bytes_per_token_per_device for k in plan.kv] == [SMOLLM2_KV_BYTES_PER_TOKEN] * 2
    assert [k.kv_tokens for k in plan.kv] == [2**30 // SMOLLM2_KV_BYTES_PER_TOKEN] * 2


@pytest.mark.parametrize("name", ["local-cpu.yaml", "local-cpu-aggregated.yaml"])
def test_committed_local_profiles_kv_capacity(name):
    args = load_profile(DEPLOYMENTS / name)
    for kv in plan_profile(args).kv:
        expected = int(args.roles()[kv.role].kv_cache_gib * 2**30) // SMOLLM2_KV_BYTES_PER_TOKEN
        assert (kv.devices, kv.dcp, kv.kv_tokens) == (1, 1, expected)


def test_embedded_base_is_counted_from_its_headers():
    residency = plan_residency(load_profile(DEPLOYMENTS / "local-cpu.yaml"))
    assert residency.base.source == "safetensors header"
    assert 130e6 < residency.base.values < 140e6  # SmolLM2-135M, tied embeddings stored once
    assert residency.adapters["L0"].values == count_values(_adapter_files()[0])


@pytest.mark.parametrize("name", ["tall-h20.yaml", "venti-b300.yaml"])
def test_gpu_engines_leave_room_for_kv(name):
    plan = plan_profile(load_profile(DEPLOYMENTS / name))
    for kv in plan.kv:
        assert kv.kv_bytes_per_device > 0, kv
    decode = next(k for k in plan.kv if k.role == "decode")
    assert decode.kv_tokens >= 1_000_000  # a 1M-token (Venti) / 262K-token (Tall) context fits


def test_venti_dcp8_kv_capacity_agrees_with_the_report():
    # Report: "B300 DCP2, DCP4, and DCP8 with EAGLE ... provide approximately 2.34M, 4.67M, and 9.34M
    # logical KV tokens". The plan's figure (no draft model or activations counted) lands within 1 %.
    decode = next(k for k in plan_profile(load_profile(DEPLOYMENTS / "venti-b300.yaml")).kv if k.role == "decode")
    assert decode.dcp == 8
    assert abs(decode.kv_tokens - 9.34e6) / 9.34e6 < 0.01


def _explicit(adapter_values: dict[str, int], rounding: int = 1) -> AppArgs:
    """The local profile with its adapters listed by path, so a declared count meets a real header."""
    args = load_profile(DEPLOYMENTS / "local-cpu.yaml").model_dump()
    args["adapters"] = [{"label": a.label, "adapter_id": a.adapter_id, "path": str(BUILT_DIR / a.path),
                         "rank": a.rank} for a in Manifest.load().adapters]
    args["capacity"] = {"adapter_values": adapter_values, "adapter_values_rounding": rounding}
    return AppArgs.model_validate(args)


def test_a_declared_count_that_disagrees_with_the_header_is_an_error():
    counted = count_values(_adapter_files()[0])
    assert plan_residency(_explicit({"L0": counted})).adapters["L0"].values == counted
    with pytest.raises(PlanError, match="adapter_values.L0"):
        plan_residency(_explicit({"L0": counted + 1}))
    # A figure published rounded to the thousand agrees within half of that.
    assert plan_residency(_explicit({"L0": round(counted, -3)}, rounding=1000)).adapters["L0"].values == counted


def test_a_missing_fact_is_an_error_not_a_guess():
    args = load_profile(DEPLOYMENTS / "venti-b300.yaml").model_dump()
    del args["capacity"]["adapter_values"]["L3"]
    with pytest.raises(PlanError, match="adapter_values.L3"):
        plan_residency(AppArgs.model_validate(args))
    args = load_profile(DEPLOYMENTS / "venti-b300.yaml").model_dump()
    args["capacity"]["device_memory_gib"] = None
    with pytest.raises(PlanError, match="device_memory_gib"):
        plan_profile(AppArgs.model_validate(args))


def test_planning_gpu_profiles_prepares_nothing(tmp_path, monkeypatch):
    from macaron_ray.model import prepare

    monkeypatch.setenv("MACARON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(prepare, "prepare_base_model", lambda *a, **k: pytest.fail("plan must not prepare"))
    for name in ("tall-h20.yaml", "venti-b300.yaml"):
        plan_profile(load_profile(DEPLOYMENTS / name))
    assert not (tmp_path / "cache").exists()


def test_run_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    run([DEPLOYMENTS / "venti-b300.yaml"], out)
    printed = capsys.readouterr().out
    assert "774.8B" in printed and "2.976T" in printed and "74.0%" in printed
    (venti,) = json.loads(out.read_text())["profiles"]
    assert venti["residency"]["mol_values"] == 774_752_169_984
    assert venti["residency"]["fewer_pct"] == 74.0
    assert [k["role"] for k in venti["kv"]] == ["router", "prefill", "decode"]


def test_plan_subcommand_parses_and_runs(tmp_path, capsys):
    # The same wiring `macaron`'s build_parser gets: `add_plan_parser(sub)`.
    import argparse

    parser = argparse.ArgumentParser(prog="macaron")
    add_plan_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", str(DEPLOYMENTS / "tall-h20.yaml"), "--out", str(tmp_path / "p.json")])
    assert args.func(args) == 0
    assert "50.1B" in capsys.readouterr().out and (tmp_path / "p.json").is_file()
