"""Setting a policy's ``p_hard`` threshold from recent logged traffic (``pointsman calibrate``).

Two ways to choose the threshold ``t`` of a policy variable (``p_hard_frontier`` by
default; a request goes to the frontier when ``p_hard >= t``):

- a **frontier share** ``s``: ``t`` is the (1 − s) quantile of ``p_hard`` over the recent
  decisions, so about ``s`` of that traffic would go to the frontier;
- a **budget** in USD per day: ``t`` is the lowest threshold whose projected frontier spend
  over the window, per day, stays within the budget. Projected spend = the sum, over the
  decisions at or above ``t``, of each request's cost on the frontier target
  (``policy.cost.estimate_cost`` at list prices, with the larger of the decision's prompt
  tokens and the prompt tokens its logged outcomes reported, and the completion tokens of a
  logged frontier answer when there is one, else of any logged answer, else the fleet's
  output estimate), divided by the days the window's traffic
  covers: from its first decision (or the window's start, if later) to the window's end or now,
  whichever is earlier (at least ``MIN_SPAN_S``, one second; below a day the projection is printed
  with a warning).

``p_hard`` of each recent decision is re-scored with the serving model (``model``) when it
was logged by another model version: from the logged head input when it is in the
model's feature space, else from stored prompt text; decisions it cannot score are left
out (counted).

Writing: the new value replaces the variable in the policy YAML through a ruamel.yaml
round trip (comments and layout kept; an end-of-line comment records the calibration),
the new text is compiled with ``policy.compiler.compile_policy`` against the fleet, and
only a policy that compiles replaces the file — via a temporary file in the same folder,
fsync and an atomic rename, so a reader never sees a half-written or invalid file.

Budget pacing: a policy like ``policy/defaults/policies/budget-pacing.yaml`` raises the bar
by ``pace_gain × max(0, budget.pace_gap)`` when spend runs ahead of the clock; with
``pace_bound`` the calibration also sets ``pace_gain = pace_bound − t``, so the paced
threshold stays within ``[t, pace_bound]`` (``pace_gap`` is at most 1).
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pointsman.errors import DataError, PolicyError, Problem

if TYPE_CHECKING:  # pragma: no cover
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.features import RequestFeatures
    from pointsman.outcome_log.records import LoggedDecision
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.fleet import Fleet
    from pointsman.policy.rules.compiler import CompiledPolicy

#: The shortest span (seconds) the $/day projection divides by: only there so one decision logged
#: this instant does not divide by zero. A longer floor understated the rate of a short log (20
#: decisions logged in seconds were projected as an hour's spend, 1/6 of a 10-minute log's $/day),
#: so a budget threshold admitted that many times the budget; the real span errs high instead.
MIN_SPAN_S = 1.0
DAY_S = 86400.0
#: Logged traffic (days) below which a $/day projection gets a warning: a shorter window has not
#: seen a whole daily cycle (night and day load, batch jobs), so scaling it to a day can be far off.
MIN_PROJECTION_DAYS = 1.0


def span_text(days: float) -> str:
    """A span of logged traffic in the unit that reads: ``2.50 days``, ``3.0 h`` below a day, ``10.0 min``
    below an hour."""
    hours = days * 24.0
    return f"{days:.2f} days" if days >= 1.0 else f"{hours:.1f} h" if hours >= 1.0 else f"{hours * 60.0:.1f} min"


def projection_warning(traffic: RecentTraffic) -> str | None:
    """A warning when less than ``MIN_PROJECTION_DAYS`` of logged traffic backs the $/day
    projection (None otherwise), saying how long the logged traffic spans (minutes below an hour)."""
    if traffic.span_days >= MIN_PROJECTION_DAYS:
        return None
    return (f"the $/day projection rests on {len(traffic.p_hard)} decisions over {span_text(traffic.span_days)} "
            "of logged traffic "
            f"(less than {MIN_PROJECTION_DAYS:g} day): it has not seen a whole daily cycle; calibrate again once "
            f"a day or more is logged (--window-days, --since)")


@dataclass
class RecentTraffic:
    """Recent decisions as the calibration sees them: ``p_hard`` float64 (n,) under the serving
    model, ``frontier_cost_usd`` float64 (n,) on the frontier target, ``span_days`` the traffic
    covers, ``rescored`` (how many were re-scored), ``skipped`` (by reason), ``routable`` bool (n,):
    which of them the threshold's rule routes once p_hard clears it (``rule_routes``; None: all)."""

    p_hard: np.ndarray
    frontier_cost_usd: np.ndarray
    span_days: float
    rescored: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    routable: np.ndarray | None = None


@dataclass
class Calibration:
    """The chosen ``threshold`` for ``variable``, how: ``method`` (``frontier-share`` or
    ``budget``), the resulting ``frontier_share`` and projected ``spend_usd_per_day`` on the
    recent traffic, ``n`` decisions, ``updates`` (every variable written) and ``note``."""

    variable: str
    threshold: float
    method: str
    frontier_share: float
    spend_usd_per_day: float
    n: int
    updates: dict[str, float]
    note: str = ""


def frontier_target_of(policy: CompiledPolicy, variable: str) -> str:
    """The target of the first rule whose condition reads ``variables.<variable>``.
    Raises ``DataError`` when no rule reads it."""
    for rule in policy.rules:
        if f"variables.{variable}" in rule.signals:
            return rule.target
    raise DataError(f"{policy.file}: no rule reads variables.{variable}; name the frontier target with --target")


def rule_routes(policy: CompiledPolicy, fleet: Fleet, variable: str, requests: list[dict[str, object]]) -> np.ndarray:
    """Per logged request (its ``request_features``): whether the first rule reading
    ``variables.<variable>`` routes it once ``p_hard`` clears the threshold: the rule alone, run on
    the request's prompt tokens and output cap at ``p_hard`` 1 with an idle fleet (the signals a
    policy case starts from), ``cost()`` from the fleet's prices. Its other conditions (the default
    policy's ``cost("frontier-large") <= variables.hard_prompt_max_usd``) keep some requests off the
    frontier at any threshold; a condition that errors routes nothing. All true when no rule reads
    the variable."""
    import dataclasses

    from pointsman.policy.cases import case_signals
    from pointsman.policy.live import StaticSignals
    from pointsman.policy.rules.evaluator import evaluate
    from pointsman.policy.selection.filters import NoEligibleTarget

    rule = next((r for r in policy.rules if f"variables.{variable}" in r.signals), None)
    if rule is None:  # no rule reads it (a --target named): nothing to tell the requests apart by
        return np.ones(len(requests), dtype=bool)
    alone = dataclasses.replace(policy, rules=(rule,))
    out = np.zeros(len(requests), dtype=bool)
    for i, rf in enumerate(requests):
        tokens = max(1, int(rf.get("billed_prompt_tokens") or rf.get("prompt_tokens") or 0))  # type: ignore[call-overload]
        cap = rf.get("max_output_tokens")
        request = {"prompt_tokens": tokens, "prompt_tokens_upper": max(tokens, int(rf.get("prompt_tokens_upper") or 0)),  # type: ignore[call-overload]
                   **({"max_output_tokens": int(cap), "max_output_tokens_set": True} if cap else {})}  # type: ignore[call-overload]
        signals = case_signals(fleet, policy, {"request": request, "difficulty": {"p_hard": 1.0, "available": True}})
        source = StaticSignals(fleet, policy, signals)
        try:
            evaluate(alone, signals, {t: source.cost(t).usd for t in fleet.targets})
        except NoEligibleTarget:
            continue
        out[i] = True
    return out


def _completion_tokens(decision: LoggedDecision, frontier: str) -> int | None:
    best = None
    for o in decision.outcomes:
        n = o.usage.completion_tokens
        if n is None:
            continue
        if (o.served_target or decision.target) == frontier:
            return n
        best = n if best is None else best
    return best


def recent_traffic(log: OutcomeLog, fleet: Fleet, frontier: str, model: DifficultyEstimator | None = None, *,
                   since_s: float | None = None, until_s: float | None = None,
                   policy: CompiledPolicy | None = None, variable: str | None = None) -> RecentTraffic:
    """The decisions in ``[since_s, until_s)`` with ``p_hard`` under ``model`` (a
    ``DifficultyEstimator``; None keeps the logged values) and their frontier cost; with ``policy``
    and ``variable``, which of them its rule routes (``rule_routes``). Raises ``DataError`` when no
    decision is usable."""
    from pointsman.estimator.feature_space import feature_space_of
    from pointsman.policy.cost import estimate_cost

    target = fleet.targets.get(frontier)
    if target is None:
        raise DataError(f"unknown target {frontier!r}; the fleet has {', '.join(fleet.targets)}")
    version = model.version if model is not None else None
    space = feature_space_of(model) if model is not None else None
    p: list[float] = []
    cost: list[float] = []
    times: list[float] = []
    features: list[dict[str, object]] = []
    vec_rows: list[int] = []
    vecs: list[np.ndarray] = []
    text_rows: list[int] = []
    texts: list[RequestFeatures] = []
    skipped = {"no_estimate": 0, "other_model": 0}
    for d in log.joined(since_s=since_s, until_s=until_s):
        idx = len(p)
        if model is None or d.estimator_version == version:
            if d.p_hard is None:
                skipped["no_estimate"] += 1
                continue
            p.append(float(d.p_hard))
        elif space is not None and d.feature_space == space and d.head_input is not None:
            vec_rows.append(idx)
            vecs.append(d.head_input)
            p.append(np.nan)
        elif d.prompt_text:
            text_rows.append(idx)
            texts.append(d.features())
            p.append(np.nan)
        else:
            skipped["other_model"] += 1
            continue
        rf = d.request_features
        # the larger of Pointsman's count (the one that priced it) and what an upstream reported (billed)
        prompt = max([int(rf.get("billed_prompt_tokens") or rf.get("prompt_tokens") or 0)]
                     + [o.usage.prompt_tokens for o in d.outcomes if o.usage.prompt_tokens is not None])
        out = _completion_tokens(d, frontier)
        if out is None:
            out = fleet.output_tokens(frontier, rf.get("max_output_tokens"))
        cost.append(estimate_cost(frontier, target, target.modes[0], prompt, int(out)).usd)
        times.append(d.time_s)
        features.append({**rf, "prompt_tokens": prompt, "billed_prompt_tokens": prompt})
    if not p:
        raise DataError(f"{log.path}: no recent decision with a p_hard to calibrate on ({skipped})")
    p_arr = np.asarray(p, dtype=np.float64)
    if model is not None and vecs:
        p_arr[vec_rows] = model.predict_matrix(np.stack(vecs))
    if model is not None and texts:
        p_arr[text_rows] = model.estimate_batch(texts)
    t = np.asarray(times)
    start = t.min() if since_s is None else max(float(since_s), float(t.min()))
    # nothing is logged after now: an until_s ahead of it (a window named up to next week) ends the span now
    end = max(float(t.max()), time.time() if until_s is None else min(float(until_s), time.time()))
    span = max(end - start, MIN_SPAN_S) / DAY_S
    routable = rule_routes(policy, fleet, variable, features) if policy is not None and variable is not None else None
    return RecentTraffic(p_arr, np.asarray(cost), span, len(vecs) + len(texts), skipped, routable)


def threshold_for_share(p: np.ndarray, share: float) -> float:
    """The (1 − ``share``) quantile of ``p`` (``method="higher"``, a value that occurs), 1.0 for
    share 0; unless another threshold (an observed value >= 0, or 1.0) routes a share (``p >= t``)
    strictly nearer ``share``: many decisions tied at one value (a repeated prompt) put the quantile
    inside the tie, which routes them all. Raises ``ValueError`` for a share outside [0, 1]."""
    from pointsman.training.reports import operating_threshold

    best = operating_threshold(p, share)
    if share == 0.0 or len(p) == 0:
        return best
    ordered = np.sort(p)
    candidates = np.append(np.unique(ordered[ordered >= 0.0]), 1.0)
    shares = (len(ordered) - np.searchsorted(ordered, candidates, side="left")) / len(ordered)
    gaps = np.abs(shares - share)
    i = int(np.argmin(gaps))
    return float(candidates[i]) if gaps[i] < abs(float(np.mean(p >= best)) - share) else best


def threshold_for_budget(p: np.ndarray, cost_usd: np.ndarray, span_days: float, budget_usd_per_day: float
                         ) -> tuple[float, float]:
    """(threshold, projected USD per day): the lowest threshold among the observed ``p`` values whose
    routed requests (``p >= threshold``) cost at most ``budget_usd_per_day × span_days``; (1.0,
    spend at 1.0) when even the hardest request alone is over budget."""
    if budget_usd_per_day < 0:
        raise ValueError(f"budget must be >= 0, got {budget_usd_per_day}")
    order = np.argsort(-p, kind="stable")
    ps, cs = p[order], np.cumsum(cost_usd[order])
    allowed = budget_usd_per_day * span_days * (1.0 + 1e-9)  # float sums of exact budgets still fit
    best_t, best_spend = 1.0, float(cost_usd[p >= 1.0].sum()) / span_days
    values = np.unique(ps)[::-1]
    for v in values:  # descending thresholds: spend grows
        last = np.searchsorted(-ps, -v, side="right") - 1  # last index with p >= v
        spend = cs[last]
        if spend > allowed:
            break
        best_t, best_spend = float(v), float(spend) / span_days
    return best_t, best_spend


def calibrate(traffic: RecentTraffic, variable: str, *, frontier_share: float | None = None,
              budget_usd_per_day: float | None = None, bounds: tuple[float, float] = (0.0, 1.0),
              pace_bound: float | None = None) -> Calibration:
    """Choose the threshold (exactly one of ``frontier_share`` / ``budget_usd_per_day``), clamped to
    ``bounds``; with ``pace_bound``, also ``pace_gain = pace_bound − threshold`` (>= 0)."""
    if (frontier_share is None) == (budget_usd_per_day is None):
        raise ValueError("give exactly one of frontier_share and budget_usd_per_day")
    lo, hi = bounds
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"bounds must satisfy 0 <= low <= high <= 1, got {bounds}")
    cost = traffic.frontier_cost_usd
    # a decision the rule never routes (its other conditions) counts as below every threshold
    p = traffic.p_hard if traffic.routable is None else np.where(traffic.routable, traffic.p_hard, -1.0)
    if frontier_share is not None:
        t, method = threshold_for_share(p, frontier_share), "frontier-share"
    else:
        assert budget_usd_per_day is not None  # exactly one of the two is given (checked above)
        t, _ = threshold_for_budget(p, cost, traffic.span_days, float(budget_usd_per_day))
        method = "budget"
    clamped = float(min(max(t, lo), hi))
    note = "" if clamped == t or t < 0.0 else f"clamped from {t:.4g} to [{lo:g}, {hi:g}]"
    if traffic.routable is not None and not traffic.routable.all():
        note = "; ".join(filter(None, [note, f"{int((~traffic.routable).sum())} of {len(p)} decisions the rule would "
                                             "not route at any threshold (its other conditions)"]))
    written = short_threshold(p, clamped)
    routed = p >= written
    share = float(routed.mean())
    if frontier_share is not None and abs(share - frontier_share) > max(0.02, 1.0 / len(p)):
        from pointsman.training.reports import operating_threshold

        at = operating_threshold(p, frontier_share)  # the value the asked share falls on: the tie that splits it
        tied = int(np.sum(p == at))
        note = "; ".join(filter(None, [note, f"{tied} of {len(p)} decisions share p_hard {at:.4g}: the nearest "
                                             f"share the threshold can give is {share:.3f}, not {frontier_share:g}"]))
    updates = {variable: written}
    if pace_bound is not None:
        if not written <= pace_bound <= 1.0:
            raise ValueError(f"pace bound {pace_bound} must be between the threshold {written:g} and 1")
        updates["pace_gain"] = round(pace_bound - written, 4)
    return Calibration(variable, written, method, share, float(cost[routed].sum()) / traffic.span_days, len(p),
                       updates, note)


def short_threshold(p: np.ndarray, threshold: float) -> float:
    """The shortest decimal (2 to 17 digits, rounded down) that routes exactly the ``p`` values the
    exact ``threshold`` routes (``p >= threshold``): what ``calibrate`` writes into the policy, so the
    file does what its report says. Rounding to a fixed 4 digits wrote 0.0 for a threshold of 2.7e-7
    and sent every request to the frontier."""
    below = p[p < threshold]
    floor = float(below.max()) if below.size else -np.inf
    exact = Decimal(repr(float(threshold)))
    for digits in range(2, 18):
        r = float(exact.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_FLOOR))
        if floor < r <= threshold:
            return r
    return float(threshold)


def _yaml() -> YAML:
    from ruamel.yaml import YAML

    y = YAML()  # round-trip: keeps comments, key order and quoting
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    y.representer.add_representer(float, _represent_float)
    return y


def _represent_float(representer: Any, value: float) -> Any:
    """A float as the policy loader (PyYAML, YAML 1.1) reads a float back: positional notation, no
    exponent (ruamel's YAML 1.2 writes 1e-09, which YAML 1.1 reads as a string)."""
    text = np.format_float_positional(value, trim="0", unique=True)
    return representer.represent_scalar("tag:yaml.org,2002:float", text)


def rewrite_variables(text: str, updates: dict[str, float], file: str, comment: str | None = None) -> str:
    """``text`` (policy YAML) with ``variables.<name>`` set to each value of ``updates``; other text
    unchanged as far as a ruamel.yaml round trip allows. Raises ``PolicyError`` (located at the
    ``variables`` section) when a variable is not declared there."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError

    y = _yaml()
    try:
        data = y.load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PolicyError([Problem(file, (mark.line + 1) if mark else 0, (mark.column + 1) if mark else 0,
                                   "yaml-syntax", str(getattr(exc, "problem", exc)))]) from None
    variables = data.get("variables") if isinstance(data, dict) else None
    if not isinstance(variables, CommentedMap):  # what the round-trip loader makes of every mapping
        raise PolicyError([Problem(file, 1, 1, "missing-key", "the policy has no 'variables' section to calibrate")])
    line = getattr(variables.lc, "line", 0) + 1
    for name, value in updates.items():
        if name not in variables:
            from pointsman.located import did_you_mean

            raise PolicyError([Problem(file, line, 1, "unknown-variable",
                                       f"variables has no '{name}'{did_you_mean(name, list(variables))} "
                                       f"(it declares {', '.join(map(str, variables))})")])
        variables[name] = float(value)
        if comment:
            _set_eol_comment(variables, name, comment)
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def _set_eol_comment(mapping: CommentedMap, key: str, comment: str) -> None:
    """Put ``# comment`` at the end of ``key``'s line, replacing an end-of-line comment already
    there but keeping the comment lines that follow it (ruamel attaches those to the same token)."""
    items = mapping.ca.items.get(key)
    token = items[2] if items and len(items) > 2 else None
    if token is None:
        mapping.yaml_add_eol_comment(comment, key)
        return
    _, sep, rest = token.value.partition("\n")
    token.value = f" # {comment}" + sep + rest


def write_policy(path: str | Path, updates: dict[str, float], fleet: Fleet, comment: str | None = None) -> str:
    """Set ``updates`` in the policy file at ``path``, compile the result against ``fleet`` and
    atomically replace the file; returns the new text. Raises ``PolicyError`` (every problem,
    located) and leaves the file untouched when the result would not compile."""
    from pointsman.located import read_text
    from pointsman.policy.rules.compiler import compile_policy

    path = Path(path)
    text = read_text(path, PolicyError)
    new = rewrite_variables(text, updates, str(path), comment)
    compile_policy(new, fleet, str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return new


def calibration_comment(cal: Calibration, model_version: str | None) -> str:
    """The end-of-line comment recorded next to a calibrated variable."""
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    how = (f"{100 * cal.frontier_share:.1f}% frontier share" if cal.method == "frontier-share"
           else f"budget, projected ${cal.spend_usd_per_day:,.2f}/day")
    return f"pointsman calibrate {when}: {how} on {cal.n} decisions" + (f" ({model_version})" if model_version else "")
