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

**Early verification** (the policy's ``verify.prefix_tokens`` N): the gateway verifies the
draft's first N tokens while it streams and cancels it on escalate. ``EarlyVerify`` decides at
routing time, in the simulator's loop (``EngineRouter(cut=...)``): the verdict on the draft's
first N tokens (``estimator.draft.draft_prefix``: its first 4N characters, ``partial``; a draft no longer than
that is whole), and an escalated draft is simulated with its output cut to N tokens
(``Assignment.output_tokens``), so it holds its replica for its prefill and N decode steps only.
``apply_cascade(..., early=...)`` then turns each cut draft into its escalation: the frontier
call starts when the N-th token is out (``escalation_delay_s`` = the cut draft's e2e), and the
request answers the trace's whole output from the frontier. Drafts the prefix accepted run on.

Approximations (stated in ``docs/cascade.md``): the verify step reads the request's own signals
(prompt tokens, output cap, ``p_hard``) with the fleet read as idle and no budget
(``signals.example_signals``); escalations add no load to the on-prem fleet (they go to API
tiers); an escalation to an on-prem target is not modelled (kept as the draft, counted in
``ReplayResult.unmodelled_escalations`` and named under the report's table); the draft's
length in tokens is its characters / 4 (as ``draft_features`` counts without usage).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from pointsman.datasets.drafts import read_drafts
from pointsman.datasets.sources import get_source
from pointsman.datasets.traces import TraceRequest
from pointsman.errors import DataError
from pointsman.estimator.draft import Draft, draft_features, draft_prefix
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
from pointsman.replay.hardware import FrontierSpec
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


class _Judge:
    """A policy's verify rules on one draft, as ``apply_cascade`` and ``EarlyVerify`` run them."""

    def __init__(self, fleet: Fleet, sim: SimFleet, policy: CompiledPolicy, verifier: Verifier | None) -> None:
        assert policy.verify is not None
        self.fleet, self.policy = fleet, policy
        self.verifier = verifier or HeuristicVerifier()
        self.frontier = {f.name: f for f in sim.frontier}
        self.base = example_signals(policy.variables, fleet.targets)
        self.endpoints: dict[str, EndpointSignals] = {
            relative_key("endpoint", t, r.role): example_endpoint() for t in fleet.targets
            for r in policy.verify.rules if r.target == t}

    def escalation(self, draft: Draft, target: str, prompt_tokens: int, output_tokens: int,
                   p_hard: float | None) -> FrontierSpec | str | None:
        """The frontier tier the verify rules escalate ``draft`` (``target``'s answer) to, the name of
        the on-prem target they escalate it to (not modelled), or None (accepted)."""
        features = draft_features(draft, prompt_tokens, p_hard)
        signals_draft = draft_signals(features, self.verifier.p_bad(features), self.verifier.version, target, True)
        request: RequestSignals = {**self.base["request"], "prompt_tokens": prompt_tokens,
                                   "max_output_tokens": max(1, output_tokens)}
        difficulty: DifficultySignals = {"p_hard": p_hard, "available": p_hard is not None}
        signals: Snapshot = {**self.base, "_endpoint": self.endpoints, "request": request, "difficulty": difficulty}
        verdict = judge(self.fleet, self.policy, {"request": request, "difficulty": difficulty},
                        StaticSignals(self.fleet, self.policy, signals), signals_draft)
        if verdict.action != "escalate" or verdict.target is None:
            return None
        return self.frontier.get(verdict.target, verdict.target)


class EarlyVerify:
    """The ``EngineRouter``'s ``cut`` for a policy with ``verify.prefix_tokens`` (see the module):
    ``cut(index, request, target, p_hard)`` is the prefix length N when the verify rules escalate
    the draft's first N tokens (recorded in ``escalations``: index -> (target, N, the request's own
    output tokens, the frontier tier)), else None."""

    def __init__(self, rows: Sequence[OutcomeRow | None], fleet: Fleet, sim: SimFleet, policy: CompiledPolicy,
                 drafts: DraftBook, columns: Mapping[str, Mapping[str, str]], verifier: Verifier | None = None) -> None:
        assert policy.verify is not None and policy.verify.prefix_tokens is not None
        self.rows, self.drafts, self.columns = rows, drafts, columns
        self.prefix_tokens = policy.verify.prefix_tokens
        self.judge = _Judge(fleet, sim, policy, verifier)
        self.escalations: dict[int, tuple[str, int, int, FrontierSpec]] = {}
        self.unmodelled: dict[int, str] = {}  # index -> on-prem target its prefix was escalated to

    def __call__(self, index: int, request: TraceRequest, target: str, p_hard: float | None) -> int | None:
        """N when the draft's first N tokens are escalated, else None."""
        self.escalations.pop(index, None)
        self.unmodelled.pop(index, None)
        row = self.rows[index] if index < len(self.rows) else None
        text = None if row is None else self.drafts.text(draft_model(row, target, self.columns), row.prompt_id)
        if text is None:
            return None
        spec = self.judge.escalation(draft_prefix(text, self.prefix_tokens), target, request.prompt_tokens,
                                     request.output_tokens, p_hard)
        if isinstance(spec, str):
            self.unmodelled[index] = spec
        if not isinstance(spec, FrontierSpec):
            return None
        self.escalations[index] = (target, self.prefix_tokens, request.output_tokens, spec)
        return self.prefix_tokens


def _escalate(r: RequestResult, spec: FrontierSpec, delay_s: float, output_tokens: int) -> RequestResult:
    """``r`` (a draft that ran ``delay_s`` seconds from arrival) answered by ``spec`` from then on."""
    call_s = spec.ttft_median_s + spec.tpot_median_s * max(0, output_tokens - 1)
    bill = (r.prompt_tokens * spec.input_usd_per_mtok + output_tokens * spec.output_usd_per_mtok) / 1e6
    return dataclasses.replace(
        r, target=spec.name, frontier=True, output_tokens=output_tokens, ttft_s=delay_s + spec.ttft_median_s,
        tpot_s=spec.tpot_median_s if output_tokens > 1 else None, e2e_s=delay_s + call_s,
        finish_s=r.arrival_s + delay_s + call_s, cost_usd=r.cost_usd + bill, escalated=True,
        escalation_delay_s=delay_s)


def apply_cascade(result: ReplayResult, rows: Sequence[OutcomeRow | None], fleet: Fleet, sim: SimFleet,
                  policy: CompiledPolicy, decisions: Mapping[int, tuple[str, str, str, float | None]],
                  drafts: DraftBook, columns: Mapping[str, Mapping[str, str]],
                  verifier: Verifier | None = None,
                  early: Mapping[int, tuple[str, int, int, FrontierSpec]] | None = None,
                  early_unmodelled: Mapping[int, str] | None = None) -> ReplayResult:
    """The policy's replay with its cascade applied (see the module); ``decisions``: the
    ``EngineRouter``'s (rule, target, mode, p_hard) per request index; ``columns``:
    ``outcome_draw.quality_columns(fleet)``; ``early``: ``EarlyVerify.escalations`` of a run with
    early verification (then only those drafts escalate, each after its N-th token), and
    ``early_unmodelled`` its ``unmodelled``. Unchanged without a ``verify`` section."""
    if policy.verify is None:
        return result
    judged = _Judge(fleet, sim, policy, verifier) if early is None else None
    out: list[RequestResult] = []
    unmodelled: Counter[str] = Counter()
    for r in result.requests:
        row = rows[r.index] if r.index < len(rows) else None
        if r.rejected is not None or r.frontier or row is None or r.target is None or r.e2e_s is None:
            out.append(r)
            continue
        if early is not None:
            cut = early.get(r.index)
            # escalated at its N-th token, if it ran where it was routed (a fallback ran in full)
            if cut is not None and cut[0] == r.target and r.output_tokens == min(cut[1], cut[2]):
                out.append(_escalate(r, cut[3], r.e2e_s, cut[2]))
            else:
                out.append(r)
                if r.index in (early_unmodelled or {}):
                    unmodelled[(early_unmodelled or {})[r.index]] += 1
            continue
        assert judged is not None
        text = drafts.text(draft_model(row, r.target, columns), row.prompt_id)
        p_hard = decisions.get(r.index, ("", "", "", None))[3]
        spec = None if text is None else judged.escalation(draft_prefix(text, None), r.target, r.prompt_tokens,
                                                           r.output_tokens, p_hard)
        if isinstance(spec, str):
            unmodelled[spec] += 1
        out.append(_escalate(r, spec, r.e2e_s, r.output_tokens) if isinstance(spec, FrontierSpec) else r)
    return dataclasses.replace(result, requests=out, unmodelled_escalations=dict(unmodelled))
