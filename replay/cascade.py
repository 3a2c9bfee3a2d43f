"""The cascade in replay: a policy's ``verify`` rules applied to each on-prem answer.

``apply_cascade(result, rows, fleet, sim, policy, decisions, drafts)`` turns a policy's replay
into its cascade: for every request that completed on an on-prem target, the *draft* is the
answer of the model standing for that target in the request's outcome row (the target's
``replay.quality_columns`` for the row's source, else the source's first weak model), read
from ``drafts`` (``DraftBook``: AlpacaEval's ``model_outputs_long.csv.gz``). Its features and
the shipped verifier's ``p_bad`` (``estimator/verifier.py``, with the decision's ``p_hard``)
feed ``policy.escalation.judge``; an escalation to a frontier tier pays **both calls**:

- the draft ran in full on-prem (the simulated GPU time and load are unchanged), then the
  frontier call starts when the draft ends: ``ttft_s`` = draft e2e + the tier's TTFT, ``e2e_s``
  = draft e2e + the frontier call's e2e (TTFT + TPOT x (output - 1), the tier's medians),
  ``tpot_s`` the tier's;
- the frontier bill (``FrontierSpec`` list prices, no prompt cache) is the request's cost;
- its quality is the frontier's (``outcome_draw.quality_of``), ``escalated`` true.

Approximations (stated in ``docs/cascade.md``): the verify step runs after the simulation,
on the request's own signals (prompt tokens, output cap, ``p_hard``) with the fleet read as
idle and no budget (``signals.example_signals``); escalations add no load to the on-prem fleet
(they go to API tiers); an escalation to an on-prem target is not modelled (kept as the draft).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from pointsman.datasets.drafts import read_drafts
from pointsman.datasets.sources import get_source
from pointsman.errors import DataError
from pointsman.estimator.draft import Draft, draft_features
from pointsman.estimator.verifier import HeuristicVerifier, Verifier
from pointsman.policy.escalation import draft_signals, judge
from pointsman.policy.fleet import Fleet
from pointsman.policy.live import StaticSignals
from pointsman.policy.rules.compiler import CompiledPolicy
from pointsman.policy.signals.namespaces import (
    DifficultySignals,
    EndpointSignals,
    RequestSignals,
    Snapshot,
    example_endpoint,
    example_signals,
    relative_key,
)
from pointsman.replay.outcome_draw import OutcomeRow
from pointsman.replay.results import ReplayResult, RequestResult
from pointsman.replay.sim_fleet import SimFleet

#: Where the shared answers live (``../shared/datasets`` beside the repository).
DEFAULT_DRAFTS = Path("../shared/datasets/alpacaeval/model_outputs_long.csv.gz")


class DraftBook:
    """Answers per (model, prompt id), read from a drafts file on first use of each model
    (``datasets.drafts.read_drafts``). ``text(model, prompt_id)``: the answer or None."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._models: dict[str, dict[str, str]] = {}

    def text(self, model: str, prompt_id: str) -> str | None:
        """``model``'s answer to ``prompt_id``, None when the file has none (or not that model)."""
        if model not in self._models:
            try:
                self._models[model] = read_drafts(self.path, model)
            except DataError:
                self._models[model] = {}
        return self._models[model].get(prompt_id)


def draft_model(row: OutcomeRow, target: str, columns: Mapping[str, Mapping[str, str]]) -> str:
    """The model whose answer is ``target``'s draft for ``row`` (see the module)."""
    named = columns.get(target, {}).get(row.source)
    return named if named else get_source(row.source).weak[0]


def apply_cascade(result: ReplayResult, rows: Sequence[OutcomeRow | None], fleet: Fleet, sim: SimFleet,
                  policy: CompiledPolicy, decisions: Mapping[int, tuple[str, str, str, float | None]],
                  drafts: DraftBook, columns: Mapping[str, Mapping[str, str]],
                  verifier: Verifier | None = None) -> ReplayResult:
    """The policy's replay with its cascade applied (see the module); ``decisions``: the
    ``EngineRouter``'s (rule, target, mode, p_hard) per request index; ``columns``:
    ``outcome_draw.quality_columns(fleet)``. Unchanged without a ``verify`` section."""
    if policy.verify is None:
        return result
    verifier = verifier or HeuristicVerifier()
    frontier = {f.name: f for f in sim.frontier}
    base = example_signals(policy.variables, fleet.targets)
    endpoints: dict[str, EndpointSignals] = {relative_key("endpoint", t, r.role): example_endpoint() for t in fleet.targets
                 for r in policy.verify.rules if r.target == t}
    out: list[RequestResult] = []
    for r in result.requests:
        row = rows[r.index] if r.index < len(rows) else None
        if r.rejected is not None or r.frontier or row is None or r.target is None or r.e2e_s is None:
            out.append(r)
            continue
        text = drafts.text(draft_model(row, r.target, columns), row.prompt_id)
        if text is None:
            out.append(r)
            continue
        p_hard = decisions.get(r.index, ("", "", "", None))[3]
        features = draft_features(Draft(text=text, finish_reason="stop"), r.prompt_tokens, p_hard)
        draft = draft_signals(features, verifier.p_bad(features), verifier.version, r.target, True)
        request: RequestSignals = {**base["request"], "prompt_tokens": r.prompt_tokens,
                                   "max_output_tokens": max(1, r.output_tokens)}
        difficulty: DifficultySignals = {"p_hard": p_hard, "available": p_hard is not None}
        signals: Snapshot = {**base, "_endpoint": endpoints, "request": request, "difficulty": difficulty}
        verdict = judge(fleet, policy, {"request": request, "difficulty": difficulty},
                        StaticSignals(fleet, policy, signals), draft)
        spec = frontier.get(verdict.target or "")
        if verdict.action != "escalate" or spec is None:
            out.append(r)
            continue
        call_s = spec.ttft_median_s + spec.tpot_median_s * max(0, r.output_tokens - 1)
        bill = (r.prompt_tokens * spec.input_usd_per_mtok + r.output_tokens * spec.output_usd_per_mtok) / 1e6
        out.append(dataclasses.replace(
            r, target=spec.name, frontier=True, ttft_s=r.e2e_s + spec.ttft_median_s,
            tpot_s=spec.tpot_median_s if r.output_tokens > 1 else None, e2e_s=r.e2e_s + call_s,
            finish_s=(r.finish_s or r.arrival_s + r.e2e_s) + call_s, cost_usd=r.cost_usd + bill, escalated=True))
    return dataclasses.replace(result, requests=out)
