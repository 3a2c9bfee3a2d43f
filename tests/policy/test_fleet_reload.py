"""A reloaded fleet keeps the live state of the endpoints it still has and drops the others;
error outcomes trip a per-endpoint breaker that recovers after its cool-down."""

from __future__ import annotations

from pathlib import Path

from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState

E0 = "http://llama-8b-0.inference.internal:8000/v1"
E1 = "http://llama-8b-1.inference.internal:8000/v1"
E2 = "http://llama-8b-2.inference.internal:8000/v1"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def reloaded_fleet(tmp_path: Path):
    text = DEFAULT_FLEET_PATH.read_text().replace(
        '{name: llama-8b-1, url: "http://llama-8b-1.inference.internal:8000/v1"}',
        '{name: llama-8b-2, url: "http://llama-8b-2.inference.internal:8000/v1"}')
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_fleet(path)


def dispatch(st, did, endpoint, session="", hashes=()):
    record = DispatchRecord(did, "onprem-8b", "aggregated", endpoint, None, (), 0.01, False, 200, 1.0, 1.0,
                            st.monotonic())
    return st.dispatch(Dispatch(record, list(hashes), False, session))


def test_reload_keeps_unchanged_endpoints_and_drops_removed_ones(tmp_path):
    clock = Clock()
    old = FleetState(load_fleet(), monotonic=clock)
    dispatch(old, "d0", E0, session="s0", hashes=[1, 2, 3])
    dispatch(old, "d1", E1, session="s1", hashes=[7, 8])
    old.push_load(E0, {"num_requests_running": 5})
    old.set_health(E1, False, "drained")
    old.set_health("llama-70b-1", False, "drained")
    new = old.rebuild(reloaded_fleet(tmp_path))
    assert new.fleet.revision != old.fleet.revision
    assert new.board.get(E0, clock.t).inflight_requests == 1 and new.board.get(E0, clock.t).num_requests_running == 5
    assert new.board.get(E1, clock.t) is None                                     # removed: no load left
    index = new.prefix_index("onprem-8b", False)
    assert index.match([1, 2, 3]) == {E0: 3} and index.match([7, 8]) == {}
    assert new.session("s0") == ("onprem-8b", E0) and new.session("s1") is None
    assert new.unhealthy() == {"http://llama-70b-1.inference.internal:8000/v1": "drained"}
    assert new.healthy_endpoints("onprem-8b") == 2 and E2 in new.fleet.endpoints
    settled = new.settle("d0", prompt_tokens=200, completion_tokens=10)  # dispatched before the reload
    assert settled.target == "onprem-8b" and settled.released_load == 1
    assert new.board.get(E0, clock.t).inflight_requests == 0


def test_error_outcomes_trip_a_breaker_that_recovers():
    clock = Clock()
    st = FleetState(load_fleet(), monotonic=clock)
    for i in range(4):
        dispatch(st, f"e{i}", E0)
        st.observe_outcome(f"e{i}", ok=False)
    assert st.is_healthy(E0)
    dispatch(st, "e4", E0)
    st.observe_outcome("e4", ok=False)
    assert not st.is_healthy(E0) and "5 error outcomes in a row" in st.unhealthy()[E0]
    clock.t += 29.0
    assert st.recover() == [] and not st.is_healthy(E0)
    clock.t += 1.0
    assert st.recover() == [E0] and st.is_healthy(E0)
    dispatch(st, "e5", E0)
    st.observe_outcome("e5", ok=False)                                  # half-open: one more error re-trips
    assert not st.is_healthy(E0)
    clock.t += 30.0
    st.recover()
    dispatch(st, "ok", E0)
    st.observe_outcome("ok", ok=True)
    assert st.is_healthy(E0)
    for _ in range(4):
        st.observe_outcome("x", ok=False, endpoint=E0)
    assert st.is_healthy(E0)                                             # the ok outcome reset the count
    st.observe_outcome("unknown-decision", ok=False)                     # ignored
    assert st.is_healthy(E0)
