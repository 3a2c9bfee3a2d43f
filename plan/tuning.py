"""Policy settings a plan searches with the fleet shape: routing thresholds and the cascade's.

A **knob** is a numeric policy variable (``variables.<name>``, e.g. ``p_hard_frontier``) or the
cascade's ``verify.prefix_tokens``, with the values the plan may give it. ``pointsman plan --tune
NAME=V1,V2,...`` names them; a value ``qP`` is the P-quantile of the difficulty estimator's
``p_hard`` over the planned trace's prompts (``resolve``), so a threshold follows the shipped
estimator when it is retrained instead of being a number tuned to an old one; a value ``cP`` is
the P-quantile of the trace's requests' estimated price on the frontier target with the highest
output price (what ``cost("<that target>")`` gives a request there without a cached prefix: its
prompt at the input price, the fleet's default output length at the output price), so a price
cap follows the trace's prompt lengths. Without ``--tune`` (``default_knobs``): every variable
whose name starts with ``p_hard`` over ``DEFAULT_QUANTILES`` of the trace, every ``p_bad*``
variable over ``DEFAULT_P_BAD``, every variable whose name ends with ``_max_usd`` over
``DEFAULT_COST_QUANTILES`` and ``verify.prefix_tokens`` over ``DEFAULT_PREFIX_TOKENS`` when the
policy sets it.

A knob's values always hold the policy's own value (the base), sorted; a ``Tuning`` is one index
per knob, and the base tuning is the policy as written. ``policy_text(tuning)`` writes the policy
with those values (YAML, comments dropped); ``label(tuning)`` names the values that differ from
the policy's own (``p_hard_frontier=0.612``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

#: The knob ``verify.prefix_tokens`` (the cascade's early verification, docs/cascade.md).
PREFIX_TOKENS = "verify.prefix_tokens"

#: Quantiles of the trace's p_hard searched for a ``p_hard*`` variable without ``--tune`` (a fine grid:
#: the search bisects it against the quality floor, ``plan.search``, so 13 values cost about 4 replays).
DEFAULT_QUANTILES = (0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98)

#: Quantiles of the trace's frontier price per request searched for a ``*_max_usd`` variable.
DEFAULT_COST_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Verifier thresholds searched for a ``p_bad*`` variable without ``--tune``.
DEFAULT_P_BAD = (0.3, 0.4, 0.5, 0.6)

#: Prefix lengths searched for ``verify.prefix_tokens`` without ``--tune`` (when the policy sets it).
DEFAULT_PREFIX_TOKENS = (16, 32, 64, 128)

#: One knob setting per knob, as indices into ``Knob.values``.
Tuning = tuple[int, ...]


@dataclass(frozen=True)
class Knob:
    """``name`` (a policy variable, or ``PREFIX_TOKENS``: 0 = the whole draft is verified), its
    ``values`` (sorted, the policy's own among them) and ``base``, the index of the policy's own
    value."""

    name: str
    values: tuple[float, ...]
    base: int

    def text(self, i: int) -> str:
        """``values[i]`` as written in a label and a policy file (integers without a point)."""
        v = self.values[i]
        return str(int(v)) if v == int(v) and self.name == PREFIX_TOKENS else f"{v:.4g}"


def parse_tune(spec: str) -> tuple[str, list[str]]:
    """``NAME=V1,V2`` -> (NAME, [V1, V2]); raises ``ValueError`` with what is wrong."""
    name, sep, values = spec.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not items:
        raise ValueError(f"{spec!r}: expected NAME=V1,V2,... (a policy variable or {PREFIX_TOKENS}; "
                         "a value qP is the P-quantile of the trace's p_hard)")
    return name.strip(), items


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values`` (linear interpolation, as numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _own(doc: Mapping[str, object], name: str) -> float | None:
    if name == PREFIX_TOKENS:
        verify = doc.get("verify")
        value = verify.get("prefix_tokens") if isinstance(verify, dict) else None
    else:
        variables = doc.get("variables")
        value = variables.get(name) if isinstance(variables, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def resolve(doc: Mapping[str, object], specs: Sequence[tuple[str, Sequence[str]]],
            p_hard: Sequence[float], costs_usd: Sequence[float] = ()) -> tuple[Knob, ...]:
    """The knobs of ``specs`` ((name, raw values) pairs) against the policy document ``doc``;
    ``p_hard``: the trace's scores, for ``qP`` values; ``costs_usd``: its requests' frontier
    prices, for ``cP`` values (module docstring). Raises ``ValueError`` for a name that is not a
    numeric variable of the policy (or ``PREFIX_TOKENS`` without a ``verify`` section), a value
    that is not a number, a quantile outside 0-1 or without scores or prices."""
    knobs = []
    for name, raw in specs:
        own = _own(doc, name)
        if name == PREFIX_TOKENS:
            if not isinstance(doc.get("verify"), dict):
                raise ValueError(f"{name}: the policy has no verify section")
            own = 0.0 if own is None else own  # 0: the whole draft is verified
        if own is None:
            raise ValueError(f"{name}: not a numeric variable of the policy")
        values = set()
        for v in raw:
            try:
                if v.startswith(("q", "c")):
                    q = float(v[1:])
                    of = p_hard if v.startswith("q") else costs_usd
                    if not 0 <= q <= 1 or not of:
                        raise ValueError
                    values.add(round(quantile(of, q), 3 if v.startswith("q") else 5))
                else:
                    x = float(v)
                    if not math.isfinite(x):
                        raise ValueError
                    values.add(x)
            except ValueError:
                raise ValueError(f"{name}={v}: expected a number, qP or cP with P in [0, 1]"
                                 + ("" if p_hard else " (no p_hard scores for a quantile)")) from None
        if name == PREFIX_TOKENS and any(x < 0 or x != int(x) for x in values):
            raise ValueError(f"{name}: expected whole numbers of tokens (0: verify the whole draft)")
        values.add(own)
        ordered = tuple(sorted(values))
        knobs.append(Knob(name, ordered, ordered.index(own)))
    return tuple(knobs)


def default_knobs(doc: Mapping[str, object]) -> list[tuple[str, list[str]]]:
    """Without ``--tune``: every numeric ``p_hard*`` variable over ``DEFAULT_QUANTILES`` of the
    trace's p_hard, every numeric ``p_bad*`` variable (a verifier threshold) over
    ``DEFAULT_P_BAD``, every numeric ``*_max_usd`` variable over ``DEFAULT_COST_QUANTILES`` of the
    trace's frontier prices, and ``verify.prefix_tokens`` over ``DEFAULT_PREFIX_TOKENS`` when the
    policy sets it."""
    variables = doc.get("variables")
    out: list[tuple[str, list[str]]] = []
    for n in (variables if isinstance(variables, dict) else {}):
        name = str(n)
        if _own(doc, name) is None:
            continue
        if name.startswith("p_hard"):
            out.append((name, [f"q{q:g}" for q in DEFAULT_QUANTILES]))
        elif name.startswith("p_bad"):
            out.append((name, [f"{v:g}" for v in DEFAULT_P_BAD]))
        elif name.endswith("_max_usd"):
            out.append((name, [f"c{q:g}" for q in DEFAULT_COST_QUANTILES]))
    if _own(doc, PREFIX_TOKENS) is not None:
        out.append((PREFIX_TOKENS, [str(v) for v in DEFAULT_PREFIX_TOKENS]))
    return out


@dataclass(frozen=True)
class TuningSpace:
    """The policy document ``doc`` (YAML as loaded) and its ``knobs``; ``base`` is the policy as
    written."""

    doc: Mapping[str, object]
    knobs: tuple[Knob, ...] = ()

    @property
    def base(self) -> Tuning:
        """The policy's own setting of every knob."""
        return tuple(k.base for k in self.knobs)

    def neighbors(self, tuning: Tuning) -> list[Tuning]:
        """Settings one step away: one knob to its next value up or down."""
        out = []
        for i, k in enumerate(self.knobs):
            for d in (-1, 1):
                j = tuning[i] + d
                if 0 <= j < len(k.values):
                    out.append(tuning[:i] + (j,) + tuning[i + 1:])
        return out

    def toward_quality(self, before: Tuning, after: Tuning) -> bool:
        """Whether ``after`` moves a knob the way that sends more to the frontier tiers (more
        quality, more cost): a ``p_hard*`` or ``p_bad*`` threshold down, a ``*_max_usd`` cap up
        (by the knobs' names, as ``default_knobs`` reads them); other knobs: False."""
        for k, a, b in zip(self.knobs, before, after, strict=True):
            if a != b:
                if k.name.startswith(("p_hard", "p_bad")):
                    return b < a
                if k.name.endswith("_max_usd"):
                    return b > a
        return False

    def threshold_axes(self) -> tuple[int | None, int | None]:
        """(index of the first ``p_hard*`` knob, index of the first ``*_max_usd`` knob), None where the
        policy has none: the frontier threshold (quality falls as its index rises) and the price cap
        (quality rises with its index) that ``plan.search`` bisects against the quality floor. In the
        default policy: ``p_hard_frontier`` and ``hard_prompt_max_usd``, the hard-prompt rule's two."""
        names = [k.name for k in self.knobs]
        return (next((i for i, n in enumerate(names) if n.startswith("p_hard")), None),
                next((i for i, n in enumerate(names) if n.endswith("_max_usd")), None))

    def values(self, tuning: Tuning) -> dict[str, float]:
        """Knob name -> value of ``tuning``."""
        return {k.name: k.values[i] for k, i in zip(self.knobs, tuning, strict=True)}

    def label(self, tuning: Tuning) -> str:
        """The knobs set off the policy's own values, ``name=value`` (``verify.`` dropped), or ''."""
        return " ".join(f"{k.name.removeprefix('verify.')}={k.text(i)}"
                        for k, i in zip(self.knobs, tuning, strict=True) if i != k.base)

    def policy_text(self, tuning: Tuning, header: str = "", min_pool_gpus: int | None = None) -> str:
        """The policy document with ``tuning`` applied (and ``disaggregation.min_pool_gpus`` set when
        given), as YAML after ``header`` comment lines."""
        doc = yaml.safe_load(yaml.safe_dump(dict(self.doc)))  # a deep copy of plain data
        if min_pool_gpus is not None:
            doc.setdefault("disaggregation", {})["min_pool_gpus"] = min_pool_gpus
        for k, i in zip(self.knobs, tuning, strict=True):
            v = k.values[i]
            if k.name == PREFIX_TOKENS:
                doc["verify"]["prefix_tokens"] = int(v) if v else None
                if not v:
                    del doc["verify"]["prefix_tokens"]
            else:
                doc["variables"][k.name] = int(v) if isinstance(doc["variables"][k.name], int) and v == int(v) else v
        comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        return comments + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


__all__ = ["DEFAULT_P_BAD", "DEFAULT_PREFIX_TOKENS", "DEFAULT_QUANTILES", "PREFIX_TOKENS", "Knob", "Tuning",
           "TuningSpace", "default_knobs", "parse_tune", "quantile", "resolve"]
