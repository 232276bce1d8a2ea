"""`macaron bench all`: every benchmark of the suite in order, each writing its JSON; a failure is reported."""

from __future__ import annotations

import json

from macaron_ray import cli


def test_bench_all_runs_the_suite_in_order_and_reports_each(monkeypatch, tmp_path):
    ran: list[tuple[str, str]] = []

    def fake(name):
        def run(args):
            ran.append((name, str(args.out)))
            if name == "ownview":
                raise RuntimeError("engine did not start")
            args.out.write_text("{}")
            return 0
        return run

    for name in cli.BENCH_SUITE:
        monkeypatch.setattr(cli, f"_bench_{name}", fake(name))
    args = cli.build_parser().parse_args(["bench", "all", "--dir", str(tmp_path), "--skip", "pd"])
    assert args.func(args) == 1  # one benchmark failed; the rest still ran
    suite = ["routing", "quality", "multihop", "ownview", "hops", "ingress", "memory"]
    assert ran == [(n, str(tmp_path / f"{n}.json")) for n in suite]
    report = json.loads((tmp_path / "all.json").read_text())
    assert list(report) == suite
    assert report["ownview"]["exit"] == "RuntimeError: engine did not start"
    assert all(report[n]["exit"] == 0 for n in suite if n != "ownview")
