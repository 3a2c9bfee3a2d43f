"""One fleet shape replayed and priced per month; the worker processes that replay shapes in parallel.

``evaluate(inputs, shape, scale) -> ShapeResult``: the shape's fleet file (``ShapeSpace.fleet_text``)
is validated and the policy compiled against it (a policy that does not compile on that fleet
makes the shape invalid: ``ShapeResult.error``), then replayed exactly as ``pointsman replay``
would (``replay.runs.replay_all`` with the same seed, prompts, outcome rows, SLO class and cascade
drafts, the policy with the shape's settings (``plan.tuning``); arrival times scaled by ``scale``
with ``replay.goodput.scaled``) and priced:

- what the window's time costs (``replay.summary``: on-prem GPU-hours and idle power) times
  ``HOURS_PER_MONTH x 3600 / window_s``, and what its traffic costs (frontier bills, power above
  idle while busy; output tokens likewise) times ``HOURS_PER_MONTH x 3600 / span``, the span from
  the first arrival to the last: the trace's traffic as if it went on all month (the window also
  holds the drain after the last arrival, which is no traffic: dividing the bills by it priced a
  month of a 300-request Mooncake slice, 87 s of arrivals in a 127 s window, at 69% of its traffic);
  a replica busy longer than the span (an overloaded pool, or answers still decoding after the last
  arrival) draws busy power for the whole month at most, so its busy seconds count up to the span;
- plus the shared KV tiers' DRAM (``plan.prices``);
- effective price per token = the monthly total / the month's output tokens (per 1M).

``Workers``: a pool of spawned processes (not forked: onnxruntime sessions do not survive a fork),
each loading the estimator once and keeping its estimates (``MemoEstimator``), so a request's
difficulty is estimated once per worker, not once per shape.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pointsman.datasets.traces import TraceRequest
from pointsman.errors import FleetError, PolicyError
from pointsman.estimator.estimate import Estimator
from pointsman.plan.prices import HOURS_PER_MONTH
from pointsman.plan.shapes import Shape, ShapeSpace
from pointsman.policy.fleet import Fleet, parse_fleet
from pointsman.policy.rules.compiler import CompiledPolicy, compile_policy, load_policy
from pointsman.replay.cascade import DraftBook
from pointsman.replay.engine_router import TraceMessages
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.goodput import MemoEstimator, meets, scaled
from pointsman.replay.outcome_draw import OutcomeRow
from pointsman.replay.runs import replay_all
from pointsman.replay.summary import SLO, busy_energy_usd_of, pool_loads


@dataclass
class PlanInputs:
    """What every replay of a plan shares: the ``trace`` (already windowed), per request its
    prompt ``texts`` and outcome ``rows`` (or None), the ``policy_path``, ``slo`` and ``slo_class``,
    the simulator ``seed``, the plots' ``bin_s``, the shape ``space`` and the cascade's ``drafts``
    (None: a policy's verify section is not replayed, as ``pointsman replay --no-cascade``)."""

    trace: Sequence[TraceRequest]
    texts: Sequence[TraceMessages | None] | None
    rows: Sequence[OutcomeRow | None] | None
    policy_path: Path
    slo: SLO
    slo_class: str
    space: ShapeSpace
    seed: int = 0
    bin_s: float = 10.0
    drafts: DraftBook | None = None


@dataclass(frozen=True)
class ShapeResult:
    """One shape at one traffic ``scale``, priced per month (USD) as the module docstring says.

    ``usd_per_month`` = ``onprem_usd_per_month`` (GPU rent + energy) + ``frontier_usd_per_month`` +
    ``kv_usd_per_month``; ``usd_per_mtok``: effective price per 1M output tokens;
    ``slo_attainment``: share of requests meeting both objectives; ``quality`` mean 0-1 (NaN
    without outcome rows); ``utilization`` / ``prefill_utilization`` / ``decode_utilization``:
    busy shares of the provisioned on-prem GPU time; ``per_target``: per on-prem target
    ``{"prefill": u, "decode": u}``; ``series``: ``t_s`` and per target its prefill and decode
    utilization per time bin; ``error``: why the shape is invalid (then every number is NaN); ``requests``: requests replayed;
    ``inputs``: which inputs of the plan (``search`` window or ``full`` trace) it ran on;
    ``misses``: per on-prem target the requests routed there that missed the SLO, by first cause
    (``rejected``, ``ttft``, ``tpot``): where the shape is short of capacity; ``load``: per on-prem
    pool its work over its GPU time in the arrival span (``replay.summary.pool_loads``): above 1 the
    pool is ``overloaded``."""

    shape: Shape
    scale: float
    label: str
    gpus: int
    usd_per_month: float = math.nan
    onprem_usd_per_month: float = math.nan
    frontier_usd_per_month: float = math.nan
    kv_usd_per_month: float = math.nan
    usd_per_mtok: float = math.nan
    slo_attainment: float = math.nan
    quality: float = math.nan
    frontier_share: float = math.nan
    ttft_p99_s: float = math.nan
    tpot_p99_s: float = math.nan
    utilization: float = math.nan
    prefill_utilization: float = math.nan
    decode_utilization: float = math.nan
    per_target: dict[str, dict[str, float]] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None
    requests: int = 0
    inputs: str = ""
    misses: dict[str, dict[str, int]] = field(default_factory=dict)
    load: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the shape was replayed (its fleet and policy were valid)."""
        return self.error is None

    @property
    def peak_load(self) -> tuple[str, float]:
        """(pool, load) of the most loaded on-prem pool (``load``); ("", 0.0) without one."""
        return max(self.load.items(), key=lambda kv: kv[1], default=("", 0.0))

    @property
    def overloaded(self) -> bool:
        """Whether a pool's work exceeds its GPU time over the arrival span (``peak_load`` above 1):
        in steady state its queues grow without bound, so its SLO attainment holds only because the
        trace ends and the backlog drains after the last arrival."""
        return self.peak_load[1] > 1.0

    def meets(self, goal: float) -> bool:
        """Whether the shape meets the SLO ``goal``: replayed, not ``overloaded``, and its SLO
        attainment at least ``goal``. The one test of "meets the goal" (search, recommendation,
        validation candidates, growth)."""
        return self.ok and not self.overloaded and self.slo_attainment >= goal


def compile_shape(inputs: PlanInputs, shape: Shape) -> tuple[Fleet, CompiledPolicy]:
    """(fleet, compiled policy) of ``shape`` (its policy settings applied); raises ``FleetError`` /
    ``PolicyError``."""
    fleet = parse_fleet(inputs.space.fleet_text(shape), "<plan shape>")
    if inputs.space.policy_as_written(shape):
        return fleet, load_policy(inputs.policy_path, fleet)
    return fleet, compile_policy(inputs.space.policy_text(shape), fleet, str(inputs.policy_path))


def evaluate(inputs: PlanInputs, estimator: Estimator, shape: Shape, scale: float = 1.0) -> ShapeResult:
    """Replay and price ``shape`` at ``scale`` (module docstring)."""
    t0 = time.perf_counter()
    space = inputs.space
    label, gpus = space.label(shape), space.gpus_of(shape)
    try:
        fleet, policy = compile_shape(inputs, shape)
    except (FleetError, PolicyError) as exc:
        return ShapeResult(shape, scale, label, gpus, error=str(exc).splitlines()[0], requests=len(inputs.trace))
    sim = sim_fleet(fleet)
    trace = list(inputs.trace) if scale == 1.0 else scaled(inputs.trace, scale)
    run = replay_all(trace, fleet, sim, {"plan": policy}, estimator, texts=inputs.texts, rows=inputs.rows,
                     seed=inputs.seed, baselines=False, slo=inputs.slo, timeline_bin_s=inputs.bin_s,
                     slo_class=inputs.slo_class, cascade=inputs.drafts)[0]
    s, result = run.summary, run.result
    if s.window_s <= 0:  # every arrival at one instant and nothing served: no rate to scale to a month
        return ShapeResult(shape, scale, label, gpus, requests=len(trace),
                           error="the replay window is 0 s (all arrivals at one instant, none served): "
                                 "no monthly cost")
    # GPU rent and idle power are paid for the window's time; frontier bills, busy power and output
    # tokens for the traffic, which arrives over the trace's span, not over the window's drain after it
    month = HOURS_PER_MONTH * 3600 / s.window_s
    traffic_s = trace[-1].arrival_s - trace[0].arrival_s if trace else 0.0
    traffic = HOURS_PER_MONTH * 3600 / traffic_s if traffic_s > 0 else month
    # a replica's busy power is billed for at most the whole arrival span: a month has no more GPU time
    span = traffic_s if traffic_s > 0 else s.window_s
    targets = {t.name: t for t in result.fleet.on_prem}
    busy_usd = 0.0
    for rs in result.replicas:
        busy_s = rs.prefill_busy_s + rs.decode_busy_s
        busy_usd += busy_energy_usd_of(rs, targets[rs.target]) * min(1.0, span / busy_s) if busy_s > 0 else 0.0
    onprem = (s.onprem_cost_usd - s.onprem_busy_energy_usd) * month + busy_usd * traffic
    frontier = s.frontier_cost_usd * traffic
    kv = space.kv_usd_per_month(shape)
    total = onprem + frontier + kv
    tokens = s.output_tokens * traffic
    series: dict[str, list[float]] = {}
    n = int(s.window_s // inputs.bin_s) + 1
    series["t_s"] = [i * inputs.bin_s for i in range(n)]
    for t in result.fleet.on_prem:
        tl = result.timeline.get(t.name, {})
        for phase in ("prefill", "decode"):
            busy = list(tl.get(f"{phase}_busy_gpu_s", []))[:n]
            busy += [0.0] * (n - len(busy))
            series[f"{t.name}/{phase}"] = [b / (t.gpus * inputs.bin_s) for b in busy]
    misses: dict[str, dict[str, int]] = {name: {"rejected": 0, "ttft": 0, "tpot": 0} for name in targets}
    for r in result.requests:
        if r.routed_target not in targets or meets(r, inputs.slo):
            continue
        cause = "rejected" if r.rejected is not None or r.ttft_s is None else \
            "ttft" if r.ttft_s > inputs.slo.ttft_s else "tpot"
        misses[r.routed_target][cause] += 1
    return ShapeResult(
        shape, scale, label, gpus, usd_per_month=total, onprem_usd_per_month=onprem,
        frontier_usd_per_month=frontier, kv_usd_per_month=kv,
        usd_per_mtok=total / tokens * 1e6 if tokens else math.nan, slo_attainment=s.slo_attainment,
        quality=s.quality, frontier_share=s.frontier_share, ttft_p99_s=s.ttft_p99_s, tpot_p99_s=s.tpot_p99_s,
        utilization=s.prefill_utilization + s.decode_utilization, prefill_utilization=s.prefill_utilization,
        decode_utilization=s.decode_utilization, per_target=s.utilization, series=series,
        wall_s=time.perf_counter() - t0, requests=len(trace), misses=misses,
        load=pool_loads(result))


# -- worker processes ------------------------------------------------------------------------

#: One replay to run: (which inputs by name, shape, traffic scale).
Job = tuple[str, Shape, float]

_WORKER: tuple[Mapping[str, PlanInputs], Estimator] | None = None


def _init_worker(inputs: Mapping[str, PlanInputs], make_estimator: Callable[[], Estimator]) -> None:
    global _WORKER
    _WORKER = (inputs, MemoEstimator(make_estimator()))


def _run(job: Job) -> ShapeResult:
    assert _WORKER is not None
    key, shape, scale = job
    return replace(evaluate(_WORKER[0][key], _WORKER[1], shape, scale), inputs=key)


class Workers:
    """Evaluates jobs (``Job``: which of ``inputs``, shape, scale) in ``processes`` spawned worker
    processes (in this process when 1). ``make_estimator``: a picklable callable returning the
    estimator; each worker calls it once and keeps its estimates (``MemoEstimator``), so a worker
    estimates a request's difficulty once, whatever the shape. Use as a context manager;
    ``map(jobs)`` yields results in the jobs' order (not as they finish: a plan is the same on any
    number of workers)."""

    def __init__(self, inputs: Mapping[str, PlanInputs], make_estimator: Callable[[], Estimator],
                 processes: int = 2) -> None:
        self.inputs, self.processes = inputs, processes
        self._make = make_estimator
        self._pool: multiprocessing.pool.Pool | None = None
        self._memo: MemoEstimator | None = None

    def __enter__(self) -> Workers:
        if self.processes > 1:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(self.processes, initializer=_init_worker, initargs=(self.inputs, self._make))
        else:
            self._memo = MemoEstimator(self._make())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def map(self, jobs: Iterable[Job]) -> Iterator[ShapeResult]:
        """Each job's ``ShapeResult``, in the jobs' order."""
        jobs = list(jobs)
        if self._pool is None:
            assert self._memo is not None, "use Workers as a context manager"
            for key, shape, scale in jobs:
                yield replace(evaluate(self.inputs[key], self._memo, shape, scale), inputs=key)
            return
        yield from self._pool.imap(_run, jobs)


__all__ = ["Job", "PlanInputs", "ShapeResult", "Workers", "compile_shape", "evaluate"]
