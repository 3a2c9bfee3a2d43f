"""The signal-source contract: what ``decide``, the filters and the engine ask of the fleet for
one decision. ``live.LiveSignals`` answers from the live ``FleetState``; ``live.StaticSignals``
from a fixed snapshot (policy cases). Values are CEL values (``SignalValue``), laid out as
``namespaces.SIGNALS`` declares them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.policy.cost import CostEstimate
    from pointsman.policy.fleet import Fleet
    from pointsman.policy.signals.namespaces import BudgetSignals, CacheSignals, EndpointSignals, RequestSignals
    from pointsman.request import RequestView

#: A value a policy expression can read: CEL int, double, bool, string or null.
SignalValue: TypeAlias = int | float | bool | str | None
#: One keyed namespace value (``load[target]``): field name -> value. A ``Mapping[str, object]``
#: so both the namespaces' TypedDicts and the lazily computed ``live.TargetLoad`` are one.
SignalMap: TypeAlias = Mapping[str, object]


class SignalSource(Protocol):
    """Signals of one decision, computed as far as they are read.

    ``fleet``: the fleet decided over; ``request``: the ``request`` namespace. Keyed namespaces
    take a target (``load``, ``cache``) or ``target/role`` (``endpoint``). ``cost`` is in USD on
    ``target`` in ``mode`` (default: the target's first mode) with ``cached_tokens`` of the
    prompt cached (default: the best hit the source knows). ``age(path)`` is the age in seconds
    of a signal path as the policy wrote it (for the trace). ``view``: the request itself (its media's sizes,
    ``RequestView.media``), None when the source has none (a policy case).
    """

    view: RequestView | None

    @property
    def fleet(self) -> Fleet:
        """The fleet this decision is over."""
        ...

    @property
    def request(self) -> RequestSignals:
        """The ``request`` namespace."""
        ...

    def load(self, target: str) -> SignalMap:
        """``load[target]``."""
        ...

    def cache(self, target: str) -> CacheSignals:
        """``cache`` for a rule routing to ``target``."""
        ...

    def endpoint(self, key: str) -> EndpointSignals:
        """``endpoint`` for ``target/role``: the picker's first choice there."""
        ...

    def local_hit_ratio(self, target: str, role: str = "aggregated") -> float:
        """Share 0-1 of the prompt cached on the endpoint a request would run on at ``target``: an aggregated one
        (what the P/D rules of thumb read), or with ``role="prefill"`` the prefill endpoint of a disaggregated one."""
        ...

    def budget(self) -> BudgetSignals:
        """The ``budget`` namespace."""
        ...

    def predict(self, target: str) -> SignalMap:
        """``predict[target]``: the request's predicted latency there (``PredictSignals``)."""
        ...

    def output_tokens(self, target: str) -> int:
        """Output tokens expected on ``target`` (the request's cap, else the fleet's defaults)."""
        ...

    def cost(self, target: str, mode: str | None = None, cached_tokens: int | None = None) -> CostEstimate:
        """Estimated cost of the request on ``target`` (USD; see the class docstring)."""
        ...

    def min_cost(self, target: str) -> CostEstimate:
        """The least ``cost`` of the request on ``target`` wherever the engine may place it (USD): the cheapest of its
        modes and, for aggregated, of a decode endpoint prefilling locally, each with the best cached prefix the
        source knows. A lower bound: what the ``budget`` filter checks."""
        ...

    def target_prompt_tokens(self, target: str) -> int:
        """The request's prompt tokens on ``target``: its images, audio and files counted by the target's rules
        (``cost.target_prompt_tokens``); what ``cost`` prices and the P/D mode's thresholds read."""
        ...

    def healthy_endpoints(self, target: str) -> int:
        """Endpoints of ``target`` not marked unhealthy."""
        ...

    def pd_pool_gpus(self, target: str) -> int:
        """GPUs of ``target``'s healthy prefill and decode endpoints (``pd_mode.pd_pool_gpus``)."""
        ...

    def budget_limited(self) -> bool:
        """True when some budget applies to the request."""
        ...

    def budget_fits(self, usd: float) -> bool:
        """Would a reservation of ``usd`` pass every budget now."""
        ...

    def budget_binding(self) -> BudgetSignals | None:
        """The binding budget's signals, or None when unlimited."""
        ...

    def age(self, path: str) -> float:
        """Age in seconds of a signal path (0 for values computed now)."""
        ...


def number(values: SignalMap, key: str, default: float = 0.0) -> float:
    """``values[key]`` as a float: ``default`` when absent or null; raises ``TypeError`` for a
    non-number (a bool is not a number here)."""
    v = values.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"signal {key!r} is {type(v).__name__}, not a number")
    return float(v)
