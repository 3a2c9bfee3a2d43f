"""The cascade in replay: a policy's ``verify`` rules applied to each on-prem answer.

For every request routed to an on-prem target, the *draft* is the answer of the model standing
for that target in the request's outcome row (the target's ``replay.quality_columns`` for the
row's source, else the source's first weak model), read from ``drafts`` (``DraftBook``:
AlpacaEval's ``model_outputs_long.csv.gz``). ``CascadeVerify`` gives the ``EngineRouter`` its
features and the shipped verifier's ``p_bad`` (``estimator/verifier.py``, with the decision's
``p_hard``) as the ``draft`` namespace, and the router verifies it in the simulator's loop the way
``POST /v1/verify`` does: a complete draft's hold becomes its cost, then ``RoutingEngine.verify``
(the verify rules on the signals read then: load, budget; an escalation's estimated cost reserved
on the request's budget scopes; a target refusing the hold moves on to the next, none left accepts the
draft, rule ``no-eligible-escalation``; a rule whose targets the ``budget`` filter excluded is skipped); the draft is
settled at its cost, and the escalated call settles its bill when it completes, all at simulated
time (``replay.engine_router``).
``apply_cascade(result, verified)`` then gives each escalated request **both calls**:

- the draft ran on-prem (the simulated GPU time and load are unchanged), then the frontier call
  starts when the draft ends: ``ttft_s`` = draft e2e + the tier's TTFT, ``e2e_s`` = draft e2e +
  the frontier call's e2e (TTFT + TPOT x (output - 1), the tier's medians), ``tpot_s`` the tier's;
- the frontier bill (``FrontierSpec`` list prices, no prompt cache) is added to the request's cost;
- its quality is the frontier's (``outcome_draw.quality_of``), ``escalated`` true.

**Early verification** (the policy's ``verify.prefix_tokens`` N): the gateway verifies the
draft's first N tokens while it streams and cancels it on escalate. The router verifies at
routing time, right after the decision's dispatch: the verdict on the draft's first N tokens
(``estimator.draft.draft_prefix``: its first 4N characters, ``partial``; a draft no longer than
that is whole; the draft's estimate stays held), and an escalated draft is simulated with its
output cut to N tokens (``Assignment.output_tokens``), so it holds its replica for its prefill and
N decode steps only; the frontier call starts when the N-th token is out (``escalation_delay_s`` =
the cut draft's e2e) and answers the trace's whole output. Drafts the prefix accepted run on.

Approximations (stated in ``docs/cascade.md``): escalations add no load to the on-prem fleet (they
go to API tiers); an escalation to an on-prem target is not modelled (its hold released, kept as
the draft, counted in ``ReplayResult.unmodelled_escalations`` and named under the report's table);
the draft's length in tokens is its characters / 4 (as ``draft_features`` counts without usage).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from pointsman.datasets.drafts import read_drafts
from pointsman.datasets.sources import get_source
from pointsman.errors import DataError
from pointsman.estimator.draft import draft_features, draft_prefix
from pointsman.estimator.verifier import HeuristicVerifier, Verifier
from pointsman.policy.escalation import draft_signals
from pointsman.policy.rules.compiler import CompiledPolicy
from pointsman.policy.signals.namespaces import DraftSignals
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


class CascadeVerify:
    """A policy's cascade for the ``EngineRouter`` (its ``cascade``), which runs the verify step with ``RoutingEngine.verify``
    as ``POST /v1/verify`` does (see the module). ``prefix_tokens``: the policy's ``verify.prefix_tokens`` N (None: whole
    drafts, verified at their completion). ``draft(index, target, prompt_tokens, p_hard)``: the ``draft`` namespace
    (``escalation.draft_signals``) of ``target``'s answer to trace request ``index`` (its first N tokens with N), or None
    when ``rows``/``drafts`` have none. ``escalated(index, drafted, prompt_tokens, draft_tokens, output_tokens, target)``
    records an escalation (of a request of ``prompt_tokens``) and returns the frontier call's (seconds, USD), or None for an
    on-prem ``target`` (not modelled: counted in ``unmodelled``). After the run: ``escalations``: index -> (drafted target,
    draft tokens, output tokens, ``FrontierSpec``); ``unmodelled``: index -> on-prem target; ``refused``: index -> {rule or
    target: reason} of drafts an escalating rule matched but that were not escalated: the filters (``budget``) excluded
    its targets (the rule skipped, as the service skips it), or each target refused its budget hold or had no healthy
    endpoint (``no-eligible-escalation``)."""

    def __init__(self, rows: Sequence[OutcomeRow | None], sim: SimFleet, policy: CompiledPolicy, drafts: DraftBook,
                 columns: Mapping[str, Mapping[str, str]], verifier: Verifier | None = None) -> None:
        assert policy.verify is not None
        self.rows, self.drafts, self.columns = rows, drafts, columns
        self.prefix_tokens = policy.verify.prefix_tokens
        self.verifier = verifier or HeuristicVerifier()
        self.frontier = {f.name: f for f in sim.frontier}
        self.escalations: dict[int, tuple[str, int, int, FrontierSpec]] = {}
        self.unmodelled: dict[int, str] = {}
        self.refused: dict[int, dict[str, str]] = {}

    def draft(self, index: int, target: str, prompt_tokens: int, p_hard: float | None) -> DraftSignals | None:
        """See the class."""
        row = self.rows[index] if index < len(self.rows) else None
        text = None if row is None else self.drafts.text(draft_model(row, target, self.columns), row.prompt_id)
        if text is None:
            return None
        features = draft_features(draft_prefix(text, self.prefix_tokens), prompt_tokens, p_hard)
        return draft_signals(features, self.verifier.p_bad(features), self.verifier.version, target, True)

    def escalated(self, index: int, drafted: str, prompt_tokens: int, draft_tokens: int, output_tokens: int,
                  target: str) -> tuple[float, float] | None:
        """See the class; the call answers ``output_tokens`` (the trace's), no prompt cache."""
        spec = self.frontier.get(target)
        if spec is None:
            self.unmodelled[index] = target
            return None
        self.escalations[index] = (drafted, draft_tokens, output_tokens, spec)
        return _call(spec, prompt_tokens, output_tokens)


def _call(spec: FrontierSpec, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """An escalated call on ``spec``: (seconds: the tier's TTFT + TPOT x (output - 1) medians, USD: list prices)."""
    return (spec.ttft_median_s + spec.tpot_median_s * max(0, output_tokens - 1),
            (prompt_tokens * spec.input_usd_per_mtok + output_tokens * spec.output_usd_per_mtok) / 1e6)


def _escalate(r: RequestResult, spec: FrontierSpec, delay_s: float, output_tokens: int) -> RequestResult:
    """``r`` (a draft that ran ``delay_s`` seconds from arrival) answered by ``spec`` from then on."""
    call_s, bill = _call(spec, r.prompt_tokens, output_tokens)
    return dataclasses.replace(
        r, target=spec.name, frontier=True, output_tokens=output_tokens, ttft_s=delay_s + spec.ttft_median_s,
        tpot_s=spec.tpot_median_s if output_tokens > 1 else None, e2e_s=delay_s + call_s,
        finish_s=r.arrival_s + delay_s + call_s, cost_usd=r.cost_usd + bill, escalated=True,
        escalation_delay_s=delay_s)


def apply_cascade(result: ReplayResult, verified: CascadeVerify) -> ReplayResult:
    """The run's result with its cascade applied (see the module): each request ``verified.escalations``
    holds (the router dropped those whose draft did not run as escalated) answered by its frontier tier
    after its draft, ``unmodelled_escalations`` and ``refused_escalations`` counted, ``end_s`` (the
    window's end) moved to the last escalated answer when it comes later."""
    out = []
    for r in result.requests:
        esc = verified.escalations.get(r.index)
        out.append(r if esc is None or r.e2e_s is None else _escalate(r, esc[3], r.e2e_s, esc[2]))
    # the window runs to the last answer, an escalated one's included (the fleet is provisioned until then)
    end_s = max([result.end_s] + [r.finish_s for r in out if r.escalated and r.finish_s is not None])
    return dataclasses.replace(result, requests=out, end_s=end_s,
                               unmodelled_escalations=dict(Counter(verified.unmodelled.values())),
                               refused_escalations=len(verified.refused))
