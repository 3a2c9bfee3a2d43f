"""Write one fleet shape of ``pointsman plan``'s search space as a fleet file (and the policy it is
replayed with), to replay a shape the plan did not recommend by hand::

    python scripts/shape_fleet.py --pools onprem-8b=1 --pools onprem-70b=0,1,3 --prefill-tp onprem-70b=2 --out /tmp/s
    pointsman replay TRACE --fleet /tmp/s/fleet.yaml --policy /tmp/s/policy.yaml --no-baselines

``--pools TARGET=A[,P,D]``: aggregated, prefill and decode replicas (targets not named keep the
base fleet's counts; the shared KV tier is dropped unless ``--kv-level`` keeps it);
``--prefill-tp TARGET=X``: prefill replicas X (1, 2, 4) times the template's GPUs;
``--step-tokens TARGET=N``: the step budget of its aggregated and decode pools (``STEP_TOKENS``). The policy is
written as ``plan.shapes.ShapeSpace.policy_text`` gives it (the policy's settings as written; a P/D
pool below its ``disaggregation.min_pool_gpus`` lowers that guard). Prints the shape's label and GPUs.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import yaml

from pointsman.plan.shapes import Pools, ShapeSpace
from pointsman.plan.tuning import TuningSpace
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH
from pointsman.replay.fleet_map import sim_fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", type=Path, default=DEFAULT_FLEET_PATH)
    ap.add_argument("--policy", type=Path, default=DEFAULT_POLICY_PATH)
    ap.add_argument("--pools", action="append", default=[], metavar="TARGET=A[,P,D]")
    ap.add_argument("--prefill-tp", action="append", default=[], metavar="TARGET=X")
    ap.add_argument("--step-tokens", action="append", default=[], metavar="TARGET=N",
                    help="step budget (max_num_batched_tokens) of the target's aggregated and decode pools")
    ap.add_argument("--kv-level", action="append", default=[], metavar="TARGET=I",
                    help="index of the tier capacity (0 = none, the default here)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fleet = load_fleet(args.fleet)
    kv = {t.name: t.replica.kv_bytes_per_token for t in sim_fleet(fleet).on_prem}
    space = ShapeSpace.of(yaml.safe_load(args.fleet.read_text(encoding="utf-8")), fleet, kv)
    space = space.with_policy(TuningSpace(yaml.safe_load(args.policy.read_text(encoding="utf-8"))))
    shape = space.base
    for t in space.targets:
        shape = shape.with_pools(t.name, replace(shape.of(t.name), kv_level=0))

    def pairs(items: list[str]) -> dict[str, str]:
        return dict(item.split("=", 1) for item in items)

    for name, counts in pairs(args.pools).items():
        a, p, d = ([int(x) for x in counts.split(",")] + [0, 0])[:3]
        shape = shape.with_pools(name, Pools(a, p, d, shape.of(name).kv_level))
    for name, tp in pairs(args.prefill_tp).items():
        shape = shape.with_pools(name, replace(shape.of(name), prefill_tp=int(tp)))
    for name, budget in pairs(args.step_tokens).items():
        shape = shape.with_pools(name, replace(shape.of(name), max_num_batched_tokens=int(budget)))
    for name, level in pairs(args.kv_level).items():
        shape = shape.with_pools(name, replace(shape.of(name), kv_level=int(level)))
    if not space.valid(shape):
        raise SystemExit(f"not a valid shape of the plan's space: {space.label(shape)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.yaml").write_text(space.fleet_text(shape, f"shape {space.label(shape)}"), encoding="utf-8")
    (args.out / "policy.yaml").write_text(space.policy_text(shape, f"{args.policy} for {space.label(shape)}"),
                                          encoding="utf-8")
    print(f"{space.label(shape)}: {space.gpus_of(shape)} GPUs -> {args.out}/fleet.yaml, {args.out}/policy.yaml")


if __name__ == "__main__":
    main()
