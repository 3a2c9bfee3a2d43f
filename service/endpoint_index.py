"""A fleet's endpoints as gateways name them: by ``host:port`` and by host (``policy.decision.host_port`` of each
endpoint URL), for the ext_proc picker's subset hint and served endpoint and for an outcome's
``served_endpoint`` (``POST /v1/outcomes``). ``endpoint_index(fleet)`` builds one per fleet and keeps the
latest."""

from __future__ import annotations

from collections.abc import Iterable

from pointsman.policy.decision import host_port
from pointsman.policy.fleet import Fleet


class EndpointIndex:
    """``fleet``'s endpoint ids by ``host:port`` (``by_host_port``) and by host (``by_host``), in the fleet's
    order, and each endpoint's target (``target_of``); an endpoint whose URL has no host is in neither.
    ``EndpointIndex(fleet)``."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.by_host_port: dict[str, list[str]] = {}
        self.by_host: dict[str, list[str]] = {}
        self.target_of: dict[str, str] = {}
        for eid, info in fleet.endpoints.items():
            try:
                hp = host_port(info.url)
            except ValueError:
                continue
            self.by_host_port.setdefault(hp, []).append(eid)
            self.by_host.setdefault(hp.rsplit(":", 1)[0], []).append(eid)
            self.target_of[eid] = info.target

    def subset(self, entries: Iterable[str]) -> frozenset[str]:
        """Endpoint ids named by subset entries (``ip:port``, or ``ip``: every port); unknown ones name none."""
        out: set[str] = set()
        for entry in entries:
            named = self.by_host_port.get(entry) or self.by_host.get(entry) or self.by_host.get(entry.strip("[]")) or []
            out.update(named)
        return frozenset(out)

    def target(self, served: str) -> str | None:
        """The target of the endpoint at ``served`` (``ip:port``), or None when the fleet has none there
        (or several targets share it)."""
        targets = {self.target_of[e] for e in self.by_host_port.get(served, ())}
        return targets.pop() if len(targets) == 1 else None

    def named(self, target: str | None, named: str) -> list[str]:
        """Ids of ``target``'s endpoints (every target's when None) that ``named`` names, as a gateway knows an
        endpoint: its id (the URL), its ``name``, its ``host:port`` (Envoy's served endpoint) or a base URL with
        that ``host:port`` (LiteLLM's ``api_base``; one whose path differs still names it: a gateway may call
        ``/v1`` or not). Several when a ``host:port`` is shared (a URL matching one exactly, trailing ``/``
        aside, picks it); none when unknown."""
        fleet = self.fleet
        eid = fleet.endpoint_id(named)
        if eid is not None:
            return [eid] if target is None or fleet.endpoints[eid].target == target else []
        try:
            hp = host_port(named if "://" in named else f"http://{named}")
        except ValueError:
            return []
        out = [e for e in self.by_host_port.get(hp, ()) if target is None or self.target_of[e] == target]
        exact = [e for e in out if fleet.endpoints[e].url.rstrip("/") == named.rstrip("/")]
        return exact if len(exact) == 1 else out


_latest: EndpointIndex | None = None


def endpoint_index(fleet: Fleet) -> EndpointIndex:
    """The ``EndpointIndex`` of ``fleet``: the last one built when it is of this very fleet object (one per
    reload), else a new one, kept."""
    global _latest
    idx = _latest
    if idx is None or idx.fleet is not fleet:
        _latest = idx = EndpointIndex(fleet)
    return idx
