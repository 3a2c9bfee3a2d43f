"""Eligibility filters: which targets can serve a request at all, and why not.

A filter is a plain function ``(target_name, target, ctx: FilterContext) -> reason | None``
registered by name in ``FILTERS``; ``None`` means eligible. The policy's ``filters``
section switches each on or off (all on by default) and holds the tenant allow-lists.
They run in this order, and the first that removes a target names it:

- ``capabilities``: image inputs need ``capabilities.images``, audio inputs and answers ``capabilities.audio``, file
  inputs ``capabilities.files``; tools need ``capabilities.tools``; a Responses request continuing provider-stored
  state (``request.stored_state``: ``previous_response_id``, ``conversation``, ``item_reference``) a target that holds it
  (``fleet.holds_stored_state``); a request whose ``model`` names a LoRA adapter of the fleet (``lora_adapters``) a
  target serving it (``Fleet.serves``: elsewhere it would run the base model, the adapter dropped).
- ``context-window``: the prompt's tokens on the target (``cost.target_prompt_tokens(window=True)``: the safe-side
  bound ``request.prompt_tokens_upper``, or for a batch of prompts, each its own sequence, its longest prompt's
  ``request.longest_prompt_tokens_upper``; images, audio and files counted as the cost counts them there, but an
  image of unread size, given by URL, or a PDF's page image at the least it bills, a page's text not counted: a target
  is refused only for what surely will not fit)
  plus the client's output cap (1 token when uncapped) must fit the target's ``context_window_tokens``.
- ``tenants``: a target with an allow-list (``filters.tenants``) takes only those tenants
  (a request without a tenant is on no list).
- ``health``: a target needs at least one endpoint not marked unhealthy.
- ``budget``: the least the request may cost on the target wherever it could be placed
  (``SignalSource.min_cost``) must fit every budget of the request (the ledger's admission rule,
  ``BudgetSnapshot.fits``); the reservation checks the placement's own estimate. A zero or
  exhausted budget removes every target. Unlimited requests skip it.

``eligibility(...)`` returns, per target, None or the ``Exclusion`` (filter, reason);
``NoEligibleTarget`` names the filter that removed each candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

from pointsman.errors import RequestError
from pointsman.located import StrictModel
from pointsman.policy.cost import target_prompt_tokens
from pointsman.policy.fleet import Fleet, FrontierTarget, OnPremTarget, holds_stored_state
from pointsman.policy.signals.namespaces import RequestSignals
from pointsman.policy.signals.source import SignalSource
from pointsman.request import MAX_SCOPE_NAME_CHARS, canonical, valid_scope_name


def _tenant_name(value: str) -> str:
    """An allow-list entry, ``request.canonical``; one no request can carry (a space, empty, over 200
    characters: ``routing.tenant`` refuses those) is an error rather than an entry that never matches."""
    value = canonical(value)
    if not valid_scope_name(value):
        raise ValueError(f"{value!r} can never be a request's tenant (routing.tenant is 1-{MAX_SCOPE_NAME_CHARS} "
                         "characters without spaces)")
    return value


class FiltersSpec(StrictModel):
    """Eligibility filters (``policy/selection/filters.py``), each on unless set false; ``tenants`` maps a
    target to the tenants allowed on it (targets not listed take every tenant; a request
    without a tenant is not on any list; names are ``request.canonical``, as a request's tenant is)."""

    context_window: bool = True
    capabilities: bool = True
    tenants: dict[str, list[Annotated[str, AfterValidator(_tenant_name)]]] = {}
    health: bool = True
    budget: bool = True


@dataclass
class FilterContext:
    """What filters read: ``request`` (the ``request`` namespace dict), ``settings`` (the
    policy's ``FiltersSpec``) and ``source`` (the decision's signal source: ``healthy_endpoints(t)``,
    ``budget_limited()``, ``budget_fits(usd)``, ``budget_binding()``, ``min_cost(t)``)."""

    request: RequestSignals
    settings: FiltersSpec
    source: SignalSource


FilterFn = Callable[[str, "OnPremTarget | FrontierTarget", FilterContext], "str | None"]


def context_window(name: str, target: OnPremTarget | FrontierTarget, ctx: FilterContext) -> str | None:
    """Ineligible when the prompt's tokens on the target (``target_prompt_tokens(window=True)``: the safe-side bound,
    a batch's longest prompt's, its media by the target's rules, images of unread size at the least they bill)
    + output cap (1 if uncapped) > context_window_tokens."""
    request = ctx.request
    prompt = target_prompt_tokens(target, request, ctx.source.view, window=True)
    need = prompt + (request["max_output_tokens"] if request["max_output_tokens_set"] else 1)
    if need > target.context_window_tokens:
        return f"needs {need:,} tokens > window {target.context_window_tokens:,}"
    return None


def capabilities(name: str, target: OnPremTarget | FrontierTarget, ctx: FilterContext) -> str | None:
    """Ineligible when the request has images (audio, files, tools) and the target does not take them, continues
    provider-stored state (``request.stored_state``) the target does not hold, or its ``model`` names a LoRA adapter the
    target does not serve (``Fleet.serves``)."""
    caps = target.capabilities
    if ctx.request["has_images"] and not caps.images:
        return "does not accept image inputs"
    if ctx.request["has_audio"] and not caps.audio:
        return "does not accept audio inputs or outputs"
    if ctx.request["has_files"] and not caps.files:
        return "does not accept file inputs"
    if ctx.request["has_tools"] and not caps.tools:
        return "does not support tools"
    if (field := ctx.request.get("stored_state")) and not holds_stored_state(target):  # (a case may omit it)
        return f"does not hold the provider-stored state the request's {field} continues (fleet: stored_state)"
    if not ctx.source.fleet.serves(name, model := ctx.request.get("model")):
        return f"does not serve the LoRA adapter '{model}' the request's model names (fleet: lora_adapters)"
    return None


def tenants(name: str, target: OnPremTarget | FrontierTarget, ctx: FilterContext) -> str | None:
    """Ineligible when the target has an allow-list (``filters.tenants``) without this tenant."""
    allowed = ctx.settings.tenants.get(name)
    if allowed is None:
        return None
    tenant = ctx.request["tenant"]
    if tenant in allowed:
        return None
    return f"tenant '{tenant}' is not on its allow-list" if tenant else "the request has no tenant and it has an allow-list"


def health(name: str, target: OnPremTarget | FrontierTarget, ctx: FilterContext) -> str | None:
    """Ineligible when every endpoint of the target is marked unhealthy."""
    if ctx.source.healthy_endpoints(name) == 0:
        return "no healthy endpoint"
    return None


def budget(name: str, target: OnPremTarget | FrontierTarget, ctx: FilterContext) -> str | None:
    """Ineligible when even the target's cheapest placement (``min_cost``: each mode, a decode endpoint prefilling
    locally, the best cached prefix) does not fit the request's budgets (``budget_refusal``). Where it is placed is
    checked exactly by the reservation (a refused hold moves on to the next candidate)."""
    source = ctx.source
    return budget_refusal(source, source.min_cost(name).usd, lower_bound=True) if source.budget_limited() else None


def budget_refusal(source: SignalSource, usd: float, *, lower_bound: bool = False) -> str | None:
    """Why a reservation of ``usd`` (USD) would not fit the request's budgets, naming the binding one; None
    when it fits or no budget applies. The ``budget`` filter's check (``lower_bound``: ``usd`` is the least the
    target may cost, so the message says "at least"), and a what-if's for each candidate in place of the
    reservation (``RoutingEngine.route(dispatch=False)``, ``policy test``)."""
    if not source.budget_limited() or source.budget_fits(usd):
        return None
    b = source.budget_binding()
    where = f" {b['scope']} has ${b['remaining_usd']:.9f} of ${b['limit_usd']:.9f} left this {b['window']}" if b else ""
    least = " at least" if lower_bound else ""
    return f"estimated{least} ${usd:.9f} does not fit the budget:{where}".rstrip(":")


#: Built-in filters in the order they run, each with the ``FiltersSpec`` switch that enables it
#: (``tenants`` runs when the spec has allow-lists).
FILTERS: dict[str, FilterFn] = {"capabilities": capabilities, "context-window": context_window,
                                "tenants": tenants, "health": health, "budget": budget}
_SWITCH = {"context-window": "context_window", "capabilities": "capabilities", "health": "health", "budget": "budget"}


def enabled(settings: FiltersSpec, filters: dict[str, FilterFn] = FILTERS) -> list[tuple[str, FilterFn]]:
    """The filters the policy's ``FiltersSpec`` switches on, in order (others: always)."""
    out = []
    for name, fn in filters.items():
        switch = _SWITCH.get(name)
        if switch is not None and not getattr(settings, switch):
            continue
        if name == "tenants" and not settings.tenants:
            continue
        out.append((name, fn))
    return out


@dataclass(frozen=True)
class Exclusion:
    """Why a target is ineligible: the ``filter`` that removed it and its ``reason``."""

    filter: str
    reason: str

    def __str__(self) -> str:
        return f"{self.filter}: {self.reason}"


def eligibility(fleet: Fleet, ctx: FilterContext, filters: list[tuple[str, FilterFn]]) -> dict[str, Exclusion | None]:
    """For every target in file order: ``None`` if eligible, else the first ``Exclusion``."""
    out: dict[str, Exclusion | None] = {}
    for name, target in fleet.targets.items():
        out[name] = None
        for fname, fn in filters:
            reason = fn(name, target, ctx)
            if reason is not None:
                out[name] = Exclusion(fname, reason)
                break
    return out


class NoEligibleTarget(RequestError):
    """No rule produced an eligible target; ``exclusions`` says which filter removed which
    target (``considered``: the candidates of the rules that matched, in order). The message
    reads ``no eligible target: onprem-8b (budget: ...); frontier-small (health: ...)``."""

    def __init__(self, exclusions: dict[str, Exclusion | None], considered: list[str]) -> None:
        self.exclusions = exclusions
        self.considered = considered
        parts = [f"{t} ({exclusions[t]})" if exclusions.get(t) else t for t in considered]
        super().__init__("no eligible target: " + "; ".join(parts))

    @property
    def by_budget(self) -> bool:
        """True when a budget refused the request: some target was excluded by the ``budget`` filter or
        its reservation (``budget_exhausted``: 429, never to be routed around). The budget filter runs
        last, so such a target passed every other filter: the request could be served, only over its
        budget, whatever the others were excluded by (an image on text-only targets, a prompt longer
        than their window, an unhealthy pool); routing it without Pointsman would spend past it."""
        return any(x is not None and x.filter == "budget" for x in self.exclusions.values())
