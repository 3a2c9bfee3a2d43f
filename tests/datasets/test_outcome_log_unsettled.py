"""What a process killed between the outcome log's commit and the settlement leaves to settle when it starts
again (``OutcomeLog.append_outcomes(unsettled=True)``, ext_proc's outcomes, which no gateway resends): every
non-shadow outcome stored here and every one forwarded to its owner's log (kept in the outbox; settled here,
where it arrived), as a hypothesis property over the mix. Before, the forwarded ones were not kept: a kill in
between lost their settlement (this test failed on the first forwarded, non-shadow item)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.outcome import parse_outcomes
from pointsman.outcome_log.store import OutcomeLog

#: Per outcome: (forwarded to another replica's log, shadow).
ITEMS = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS)
def test_every_outcome_settled_here_is_kept_unsettled_until_settled(tmp_path_factory, items):
    log = OutcomeLog(tmp_path_factory.mktemp("unsettled") / "outcomes.db")
    try:
        outcomes = parse_outcomes([{"decision_id": f"d{i}", "shadow": shadow, "served_target": "onprem-8b",
                                    "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
                                   for i, (_, shadow) in enumerate(items)])
        here = [o for o, (away, _) in zip(outcomes, items) if not away]
        away = [("owner-log", o) for o, (gone, _) in zip(outcomes, items) if gone]
        log.append_outcomes(here, known={o.decision_id: "onprem-8b" for o in here}, unsettled=True, forwards=away)
        kept = {o.key for o in log.unsettled_outcomes()}
        assert kept == {o.key for o in outcomes if not o.shadow}
        log.settled(sorted(kept))
        assert log.unsettled_outcomes() == []
    finally:
        log.close()
