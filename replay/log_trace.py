"""Pointsman's own decision and outcome log (``outcome_log``) as a replay trace.

``load_log_trace(path, limit=, since_s=, until_s=, start_s=, end_s=) -> LogTrace``: one
``TraceRequest`` per logged decision that has an outcome with a completion token count, in time
order: arrival = decision time - the first one's, prompt tokens = the outcome's usage (else the
logged request features'), output tokens = the outcome's ``completion_tokens``; the other
decisions in the window are left out and counted (the CLI warns): ``skipped`` (no outcome with a
completion token count) and ``no_output`` (0 completion tokens: an error or a cancelled request,
which no replay can size: like the Azure and Mooncake loaders, which refuse a 0, it is not replayed
as 1 token). ``since_s``/``until_s``
select decisions by Unix time; ``start_s``/``end_s`` slice as the other traces do
(``datasets.traces``: ``start_s <= arrival < end_s``, seconds from the first record, arrivals not
rebased; ``limit`` counts the records in the window). ``texts[i]``: the stored prompt text as one
user message when the log kept prompts (``store_prompts=True``), else None; ``quality[i]``: the
outcome's ``judge_score`` (on its judge's own scale) when the gateway reported one, else None: the
quality of what *did* run, not of what a replayed policy would pick, so it is reported separately.
The log is only read (its file must exist).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pointsman.datasets.traces import TraceRequest
from pointsman.errors import DataError
from pointsman.outcome_log.store import OutcomeLog


@dataclass(frozen=True)
class LogTrace:
    """``requests`` (``TraceRequest``, arrival order), ``texts`` and ``quality`` per request
    (see the module docstring); decisions in the window left out: ``skipped``, without a usable
    outcome (none reported, or none with a completion token count), and ``no_output``, whose outcome
    reports 0 completion tokens (an error or a cancelled request)."""

    requests: list[TraceRequest]
    texts: list[list[dict[str, str]] | None]
    quality: list[float | None]
    skipped: int
    no_output: int = 0


def load_log_trace(path: str | Path, *, limit: int | None = None, since_s: float | None = None,
                   until_s: float | None = None, start_s: float | None = None,
                   end_s: float | None = None) -> LogTrace:
    """Read the outcome log at ``path`` as a trace (see the module docstring). Raises
    ``DataError`` when the file does not exist or is not an outcome log."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such outcome log")
    requests: list[TraceRequest] = []
    texts: list[list[dict[str, str]] | None] = []
    quality: list[float | None] = []
    skipped = no_output = 0
    first: float | None = None
    with OutcomeLog(path) as log:
        for d in log.joined(since_s=since_s, until_s=until_s):
            o = next((o for o in d.outcomes if not o.shadow and o.usage.completion_tokens is not None), None)
            completion = o.usage.completion_tokens if o is not None else None
            prompt = 0 if o is None else o.usage.prompt_tokens or int(d.request_features.get("prompt_tokens") or 0)
            usable = completion is not None and prompt >= 1
            if usable and first is None:
                first = d.time_s
            arrival_s = d.time_s - first if first is not None else 0.0
            if end_s is not None and arrival_s >= end_s:
                break
            if start_s is not None and arrival_s < start_s:
                continue
            if not usable or o is None or completion is None:
                skipped += 1  # in the window, but nothing says what it cost to serve
                continue
            if completion == 0:
                no_output += 1  # it ran and produced nothing: not a 1-token request
                continue
            requests.append(TraceRequest(arrival_s, prompt, completion, prompt_id=d.decision_id))
            texts.append([{"role": "user", "content": d.prompt_text}] if d.prompt_text else None)
            quality.append(o.quality.judge_score)
            if limit is not None and len(requests) >= limit:
                break
    return LogTrace(requests, texts, quality, skipped, no_output)


__all__ = ["LogTrace", "load_log_trace"]
