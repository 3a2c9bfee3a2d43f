"""Simulator fidelity: the replay simulator against published serving measurements.

    .venv/bin/python scripts/fidelity.py                # the table (markdown) for docs/replay.md
    .venv/bin/python scripts/fidelity.py --calibrate    # re-fit the efficiencies on the calibration rows
    .venv/bin/python scripts/fidelity.py --quick        # fewer requests per row (a smoke run)

What is simulated: one replica of the packaged fleet's ``onprem-8b`` (Llama 3.1 8B, FP8
weights, TP1) or ``onprem-70b`` (Llama 3.3 70B, FP8 weights, TP2) on H100 SXM, with the
latency coefficients the packaged fleet file gives the simulator
(``policy/defaults/fleet.yaml``, ``replay:`` sections) and the benchmark's own memory and
batch settings (below). Nothing here is fitted on a held-out row.

Rows (all H100 SXM, FP8 checkpoints ``nvidia/Llama-3.1-8B-Instruct-FP8`` and
``nvidia/Llama-3.3-70B-Instruct-FP8``). Their KV cache is FP8: NVIDIA Model Optimizer's FP8
export writes ``"kv_cache_quant_algo": "FP8"`` into ``hf_quant_config.json`` (the example in
its ``convert_hf_quant_config_format``), which TensorRT-LLM's ``kv_cache_dtype auto``
follows; so the runs below halve the fleet's BF16 KV bytes per token, for capacity and for
the KV read of a decode step (with a BF16 KV cache the calibration cannot reach the
128/2048 row even at the HBM peak):

- **TensorRT-LLM max-throughput table** (``NVIDIA/TensorRT-LLM``
  ``docs/source/performance/perf-overview.md`` @00f37686, ``trtllm-bench throughput``):
  N requests of exactly ISL/OSL tokens sent at t = 0; total output tokens / last finish.
  The rows 2048/128 and 128/2048 are the ones the packaged fleet already cites: they are
  the **calibration** rows (``--calibrate`` fits one compute efficiency ``mfu``, used for
  prefill and decode, and one HBM ``bandwidth_efficiency`` per model to them). Every other
  row is **held out**. Benchmark settings: ``--kv_cache_free_gpu_mem_fraction 0.95`` (the
  KV pool is 95% of the memory left after weights and a 4 GB/GPU activation reserve), a
  batch of at most 2048 sequences (TRT-LLM batches far beyond vLLM's 1024; an
  assumption), 8192 tokens per step, no admission limit, and TensorRT-LLM's default
  capacity scheduler ``GUARANTEED_NO_EVICT`` (KV for prompt + output reserved at admission,
  no preemption: ``kv_admission="reserve"``). The packaged fleet itself is simulated as
  vLLM (incremental KV, preemption); ``--vllm`` runs these rows that way too.
- **NVIDIA NIM latency sweep** (https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance,
  NIM 1.8.0, Llama-3.3-70B-Instruct, 2 x H100 80GB, FP8, TP2, 5000 input / 500 output
  tokens): a closed loop of C concurrent clients (genai-perf); mean TTFT, mean ITL
  (= TPOT) and output tokens/s. Simulated with ``closed_loop_clients=C`` over 4 x C
  requests (at least 40) and measured in the steady window while every client is busy
  (``closed_loop``); KV at 0.9 of free memory and the TensorRT-LLM scheduler as above
  (NIM's optimized H100 profiles run TensorRT-LLM; assumptions). All held out.

Errors are (simulated - published) / published. The held-out median absolute error is
the headline; the ranking check compares the order of the held-out throughput rows per
model (Spearman's rho and the pairs the simulator swaps).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import click

from pointsman.datasets.traces import TraceRequest
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.hardware import H100_SXM, LLAMA_3_1_8B, LLAMA_3_3_70B, ModelSpec, ReplicaSpec, replica_spec_for
from pointsman.replay.router import Assignment, FleetView
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate

#: (ISL, OSL, requests, published output tokens/s, calibration row?) per model; TRT-LLM perf overview @00f37686.
TRT_ROWS: dict[str, list[tuple[int, int, int, float, bool]]] = {
    "onprem-8b": [
        (128, 128, 30000, 28312, False), (128, 2048, 3000, 22714, True), (128, 4096, 1500, 14325, False),
        (500, 2000, 3000, 17660, False), (1000, 1000, 3000, 15220, False), (1000, 2000, 1500, 13899, False),
        (2048, 128, 3000, 3450, True), (2048, 2048, 1500, 9305, False), (5000, 500, 1500, 3459, False),
        (20000, 2000, 1000, 1351, False),
    ],
    "onprem-70b": [
        (128, 128, 30000, 6378, False), (128, 2048, 3000, 6651, True), (128, 4096, 1500, 4199, False),
        (500, 2000, 3000, 5222, False), (1000, 1000, 3000, 4205, False), (1000, 2000, 1500, 4146, False),
        (2048, 128, 3000, 762, True), (2048, 2048, 1500, 3082, False), (5000, 500, 1500, 898, False),
        (20000, 2000, 1000, 437, False),
    ],
}
#: NIM 1.8.0, Llama-3.3-70B FP8 TP2, 5000/500: (concurrency, TTFT ms, ITL ms, output tok/s).
NIM_70B_ROWS = [
    (1, 406.77, 18.58, 51.67), (5, 546.70, 21.83, 218.48), (25, 688.69, 38.75, 623.40), (50, 834.51, 59.73, 814.37),
    (100, 7996.25, 92.91, 917.26), (150, 34794.22, 92.86, 920.90), (200, 61680.22, 93.06, 920.54),
    (250, 88605.32, 93.20, 920.12),
]
MODELS: dict[str, tuple[ModelSpec, int]] = {"onprem-8b": (LLAMA_3_1_8B, 1), "onprem-70b": (LLAMA_3_3_70B, 2)}
#: TensorRT-LLM benchmark batch limit (an assumption; its CUDA graphs go to 8192) and token budget.
BENCH_MAX_SEQS = 2048
BENCH_TOKENS_PER_STEP = 8192


@dataclass(frozen=True)
class Row:
    """One comparison: what, the published and simulated values, calibration or held out."""

    model: str
    source: str
    case: str
    metric: str
    published: float
    simulated: float
    calibration: bool

    @property
    def error(self) -> float:
        """(simulated - published) / published."""
        return (self.simulated - self.published) / self.published


def _fleet_spec(target: str) -> ReplicaSpec:
    """The packaged fleet's replica spec of ``target``'s aggregated pool (calibrated latency)."""
    sim = sim_fleet(load_fleet(DEFAULT_FLEET_PATH))
    return next(t for t in sim.on_prem if t.name == target).replica


#: KV bytes per element in the benchmarks (FP8 KV cache, see the module docstring).
BENCH_KV_BYTES = 1


def _kv_blocks(model: ModelSpec, gpus: int, fraction: float, block_tokens: int) -> int:
    """KV blocks when the KV pool is ``fraction`` of the memory left after FP8 weights and a
    4 GB/GPU activation reserve (TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction``); FP8 KV."""
    free = gpus * H100_SXM.hbm_bytes - model.params * 1.0 - gpus * 4e9
    kv_bytes = model.kv_bytes_per_token * BENCH_KV_BYTES / model.dtype_bytes
    return math.floor(fraction * free / (kv_bytes * block_tokens))


#: The benchmarked engine's KV admission (``ReplicaSpec.kv_admission``); ``--vllm`` sets "vllm".
BENCH_ADMISSION = ["reserve"]


def bench_spec(target: str, fraction: float, base: ReplicaSpec | None = None) -> ReplicaSpec:
    """``target``'s fleet spec (or ``base``) with a benchmark's memory, KV dtype, scheduler and batch settings."""
    spec = base or _fleet_spec(target)
    model, gpus = MODELS[target]
    kv = BENCH_KV_BYTES / model.dtype_bytes
    return dataclasses.replace(spec, kv_capacity_blocks=_kv_blocks(model, gpus, fraction, spec.block_tokens),
                               kv_bytes_per_token=int(spec.kv_bytes_per_token * kv),
                               decode_per_kv_token_s=spec.decode_per_kv_token_s * kv,
                               max_num_seqs=BENCH_MAX_SEQS, max_num_batched_tokens=BENCH_TOKENS_PER_STEP,
                               kv_admission=BENCH_ADMISSION[0])


def _one_replica(spec: ReplicaSpec) -> SimFleet:
    return SimFleet(on_prem=(OnPremTarget(name="bench", replica=spec, aggregated_replicas=1, max_waiting=None),))


def _route(request: TraceRequest, view: FleetView, /) -> Assignment:
    return Assignment("bench")


def offline_tok_s(spec: ReplicaSpec, isl: int, osl: int, n: int) -> float:
    """Output tokens/s of ``n`` requests of ``isl``/``osl`` tokens all sent at t = 0."""
    res = simulate([TraceRequest(0.0, isl, osl) for _ in range(n)], _one_replica(spec), _route)
    return n * osl / res.end_s


def closed_loop(spec: ReplicaSpec, clients: int, isl: int, osl: int, n: int) -> tuple[float, float, float]:
    """(mean TTFT s, mean TPOT s, output tokens/s) of ``clients`` closed-loop clients sending
    ``n`` requests (n > 2 x clients), measured in the steady window while every client is busy:
    from the ``clients``-th completion (the warm-up round, all sent at t = 0, is over) to the
    completion that sends the last request (the drain after it runs with fewer clients)."""
    res = simulate([TraceRequest(0.0, isl, osl) for _ in range(n)], _one_replica(spec), _route,
                   closed_loop_clients=clients)
    finishes = sorted(r.finish_s for r in res.requests if r.finish_s is not None)
    t_a, t_b = finishes[clients - 1], finishes[n - clients - 1]
    steady = [r for r in res.requests if t_a <= r.arrival_s <= t_b and r.ttft_s is not None and r.tpot_s is not None]
    ttft = statistics.fmean(r.ttft_s for r in steady if r.ttft_s is not None)
    tpot = statistics.fmean(r.tpot_s for r in steady if r.tpot_s is not None)
    return ttft, tpot, (n - 2 * clients) * osl / (t_b - t_a)


def trt_rows(target: str, spec: ReplicaSpec, scale: float = 1.0, only_calibration: bool = False) -> list[Row]:
    out = []
    for isl, osl, n, published, calibration in TRT_ROWS[target]:
        if only_calibration and not calibration:
            continue
        k = max(50, int(n * scale))
        out.append(Row(target, "TRT-LLM", f"{isl}/{osl}", "output tok/s", published,
                       offline_tok_s(spec, isl, osl, k), calibration))
    return out


def nim_rows(spec: ReplicaSpec, scale: float = 1.0) -> list[Row]:
    out = []
    for c, ttft_ms, itl_ms, tok_s in NIM_70B_ROWS:
        n = max(40, 4 * c) if scale >= 1 else max(12, 3 * c)
        ttft, tpot, rate = closed_loop(spec, c, 5000, 500, n)
        case = f"5000/500 c={c}"
        out += [Row("onprem-70b", "NIM", case, "TTFT ms", ttft_ms, ttft * 1000, False),
                Row("onprem-70b", "NIM", case, "ITL ms", itl_ms, tpot * 1000, False),
                Row("onprem-70b", "NIM", case, "output tok/s", tok_s, rate, False)]
    return out


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    def ranks(x: Sequence[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1)) if n > 1 else 1.0


def _calibrated(target: str, mfu: float, bw: float) -> ReplicaSpec:
    """``target``'s fleet spec with latency coefficients re-derived at ``mfu`` and ``bw``."""
    model, gpus = MODELS[target]
    fleet = _fleet_spec(target)
    derived = replica_spec_for(model, H100_SXM, gpus, prefill_mfu=mfu, decode_mfu=mfu, bandwidth_efficiency=bw,
                               weight_dtype="fp8", step_overhead_s=fleet.step_overhead_s,
                               prefill_overhead_s=fleet.prefill_overhead_s, kv_capacity_blocks=fleet.kv_capacity_blocks,
                               kv_bytes_per_token=fleet.kv_bytes_per_token)
    return dataclasses.replace(fleet, prefill_s_per_token=derived.prefill_s_per_token,
                               prefill_s_per_token_pair=derived.prefill_s_per_token_pair,
                               decode_base_s=derived.decode_base_s, decode_per_seq_s=derived.decode_per_seq_s,
                               decode_per_kv_token_s=derived.decode_per_kv_token_s)


def calibrate(target: str, scale: float) -> tuple[float, float]:
    """Fit (mfu, bandwidth_efficiency) of ``target`` to its two calibration rows: alternate
    bisections, mfu on the prefill-heavy 2048/128 row, bandwidth on the decode-heavy 128/2048 row."""
    rows = {f"{i}/{o}": (i, o, max(50, int(n * scale)), p) for i, o, n, p, c in TRT_ROWS[target] if c}
    mfu, bw = 0.5, 0.8

    def tok_s(case: str, m: float, b: float) -> float:
        i, o, n, _ = rows[case]
        return offline_tok_s(bench_spec(target, 0.95, _calibrated(target, m, b)), i, o, n)

    def solve(case: str, fixed: float, is_mfu: bool) -> float:
        lo, hi = 0.05, 1.0
        target_tok = rows[case][3]
        for _ in range(14):
            mid = (lo + hi) / 2
            got = tok_s(case, mid, fixed) if is_mfu else tok_s(case, fixed, mid)
            lo, hi = (mid, hi) if got < target_tok else (lo, mid)
        return (lo + hi) / 2

    for _ in range(4):
        mfu = solve("2048/128", bw, True)
        bw = solve("128/2048", mfu, False)
    return mfu, bw


def _markdown(rows: Sequence[Row]) -> str:
    """Two markdown tables: TensorRT-LLM throughput rows, then the NIM sweep (one row per load)."""
    lines = ["| model | ISL/OSL | published tok/s | simulated tok/s | error | row |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        if r.source == "TRT-LLM":
            lines.append(f"| {r.model} | {r.case} | {r.published:,.0f} | {r.simulated:,.0f} | {r.error:+.1%} | "
                         f"{'calibration' if r.calibration else 'held out'} |")
    nim = [r for r in rows if r.source == "NIM"]
    if nim:
        lines += ["", "| onprem-70b, NIM 5000/500 | TTFT ms published | simulated | error | ITL ms published | "
                  "simulated | error | tok/s published | simulated | error |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for case in dict.fromkeys(r.case for r in nim):
            cells = []
            for metric in ("TTFT ms", "ITL ms", "output tok/s"):
                r = next(x for x in nim if x.case == case and x.metric == metric)
                cells.append(f"{r.published:,.1f} | {r.simulated:,.1f} | {r.error:+.1%}")
            lines.append(f"| {case.split()[-1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@click.command()
@click.option("--calibrate", "do_calibrate", is_flag=True, help="Fit mfu and bandwidth efficiency per model.")
@click.option("--quick", is_flag=True, help="A tenth of the requests per row (a smoke run).")
@click.option("--vllm", is_flag=True, help="Simulate the rows with vLLM's KV admission and preemption instead.")
def main(do_calibrate: bool, quick: bool, vllm: bool) -> None:
    scale = 0.1 if quick else 1.0
    if vllm:
        BENCH_ADMISSION[0] = "vllm"
    t0 = time.perf_counter()
    if do_calibrate:
        for target in TRT_ROWS:
            mfu, bw = calibrate(target, scale)
            click.echo(f"{target}: prefill_mfu = decode_mfu = {mfu:.3f}, bandwidth_efficiency = {bw:.3f}")
        click.echo(f"({time.perf_counter() - t0:.0f} s)")
        return
    rows: list[Row] = []
    for target in TRT_ROWS:
        rows += trt_rows(target, bench_spec(target, 0.95), scale)
    rows += nim_rows(bench_spec("onprem-70b", 0.90), scale)
    click.echo(_markdown(rows))
    held = [r for r in rows if not r.calibration]
    click.echo(f"\nheld-out rows: {len(held)}; median |error| {statistics.median(abs(r.error) for r in held):.1%}")
    for metric in ("output tok/s", "TTFT ms", "ITL ms"):
        sel = [abs(r.error) for r in held if r.metric == metric]
        if sel:
            click.echo(f"  {metric}: {len(sel)} rows, median |error| {statistics.median(sel):.1%}, "
                       f"max {max(sel):.1%}")
    for target in TRT_ROWS:
        sel = [r for r in held if r.model == target and r.source == "TRT-LLM"]
        pub, sim = [r.published for r in sel], [r.simulated for r in sel]
        swapped = [f"{a.case} vs {b.case}" for i, a in enumerate(sel) for b in sel[i + 1:]
                   if (a.published - b.published) * (a.simulated - b.simulated) < 0]
        click.echo(f"  ranking {target} (TRT-LLM held-out rows): Spearman rho {_spearman(pub, sim):.3f}; "
                   f"swapped pairs: {', '.join(swapped) or 'none'}")
    click.echo(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
