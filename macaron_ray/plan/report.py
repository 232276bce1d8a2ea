"""`macaron plan`: the capacity plan of each profile as a table on stdout and JSON on disk."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.plan.capacity import GIB, PlanError, ProfilePlan, plan_profile

DEPLOYMENTS_DIR = PACKAGE_DIR.parent / "deployments"
DEFAULT_OUT = Path(".bench/plan.json")


def human(values: int) -> str:
    """774,752,169,984 -> 774.8B; 2,976,000,000,000 -> 2.976T (the report's way of writing them)."""
    if values >= 10**12:
        return f"{values / 10**12:.3f}T"
    if values >= 10**9:
        return f"{values / 10**9:.1f}B"
    if values >= 10**6:
        return f"{values / 10**6:.1f}M"
    return f"{values:,}"


def format_report(plans: list[ProfilePlan]) -> str:
    lines = ["Residency (stored values): MoL = base + N adapters; replicated = N merged copies of the base",
             f"{'profile':<22} {'base':>22} {'adapters (each)':>26} {'MoL':>8} {'replicated':>10} {'fewer':>7}"]
    for p in plans:
        r = p.residency
        each = {c.values for c in r.adapters.values()}
        adapters = (f"{len(r.adapters)} x {next(iter(each)):,}" if len(each) == 1
                    else " + ".join(f"{c.values:,}" for c in r.adapters.values()))
        sources = {c.source for c in r.adapters.values()}
        lines.append(f"{p.profile:<22} {r.base.values:>22,} {adapters:>26} {human(r.mol_values):>8} "
                     f"{human(r.replicated_values):>10} {r.fewer_pct:>6.1f}%")
        lines.append(f"{'':<22} {'(' + r.base.source + ')':>22} {'(' + ', '.join(sorted(sources)) + ')':>26}")
    lines += ["", "KV-token capacity per engine replica (logical tokens = per-device tokens x DCP)",
              f"{'profile':<22} {'role':<8} {'devices':>7} {'KV GiB/device':>13} {'bytes/token/device':>18} "
              f"{'DCP':>4} {'KV tokens':>12}"]
    for p in plans:
        for k in p.kv:
            lines.append(f"{p.profile:<22} {k.role:<8} {k.devices:>7} {k.kv_bytes_per_device / GIB:>13.2f} "
                         f"{k.kv_bytes_per_token_per_device:>18,} {k.dcp:>4} {k.kv_tokens:>12,}")
    return "\n".join(lines)


def run(profiles: list[Path], out: Path) -> list[ProfilePlan]:
    """Plan every profile, print the table, write the JSON. Prepares and starts nothing."""
    from macaron_ray.serve.args import load_profile

    plans = [plan_profile(load_profile(p)) for p in profiles]
    print(format_report(plans))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"profiles": [p.to_json() for p in plans]}, indent=2) + "\n")
    print(f"wrote {out}")
    return plans


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("profiles", nargs="*", type=Path,
                        help="serve deploy files (default: every deployments/*.yaml)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.set_defaults(func=run_from_args)
    return parser


def add_plan_parser(sub) -> None:
    """Register `macaron plan` on the CLI's subcommands (`build_parser`'s `sub`)."""
    add_arguments(sub.add_parser("plan", help="MoL vs replicated residency and KV-token capacity per profile"))


def run_from_args(args: argparse.Namespace) -> int:
    try:
        run(args.profiles or sorted(DEPLOYMENTS_DIR.glob("*.yaml")), args.out)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = add_arguments(argparse.ArgumentParser(prog="macaron plan", description=__doc__)).parse_args(argv)
    return args.func(args)
