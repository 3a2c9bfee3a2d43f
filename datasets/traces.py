"""Serving-trace loaders: Mooncake JSONL and the Azure LLM inference CSV, as one record type.

Every loader yields ``TraceRequest`` records in file order, with ``arrival_s``
counted in seconds from the trace's first record. Both public traces in
``../shared/datasets`` are sorted by time; a record that goes back in time is a
``DataError`` (the replay would otherwise silently reorder it).

Formats (see ``../shared/datasets/README.md``, sections B1 and B2):

- **Mooncake** (FAST'25 release, ``*.jsonl`` or ``*.jsonl.gz``): one JSON object
  per line with ``timestamp`` (ms, relative), ``input_length``, ``output_length``
  and optional ``hash_ids`` (chained prefix-block hashes, ``MOONCAKE_BLOCK_TOKENS``
  = 512 tokens per block; the last block may be partial).
- **Azure LLM inference trace 2023** (Splitwise, ``*.csv`` or ``*.csv.gz``):
  columns ``TIMESTAMP`` (``2023-11-16 18:17:03.9799600``, 7 fractional digits,
  parsed exactly to the nanosecond), ``ContextTokens``, ``GeneratedTokens``.

Slicing: ``start_s``/``end_s`` keep records with ``start_s <= arrival_s < end_s``
(arrival times are *not* rebased to the window); ``limit`` keeps the first N
records that pass the window. Reading stops as soon as the window or the limit
is exhausted, so slicing a long trace is cheap.

Only the standard library is used (csv, json, gzip): the loaders run in the
serving environment without pandas.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TypeAlias

from pointsman.errors import DataError

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces (Mooncake FAST25-release README)."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""Required header of the Azure LLM inference trace CSVs."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a serving trace.

    - ``arrival_s``: arrival time in seconds from the trace's first record (float, >= 0).
    - ``prompt_tokens``: input (context) tokens, >= 1.
    - ``output_tokens``: generated tokens, >= 1.
    - ``block_hashes``: chained prefix-block hashes, one per ``MOONCAKE_BLOCK_TOKENS``
      block of the prompt (last block may be partial), or ``None`` when the trace has
      no prefix information. Equal leading hashes mean a reusable prefix KV cache.
    - ``session_id``: conversation/session key when the trace has one, else ``None``.
    - ``prompt_id``: key into an outcome table (``prompt_id`` column of the shared
      outcome datasets) when known, else ``None``.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] | None = None
    session_id: str | None = None
    prompt_id: str | None = None


def _open_text(path: Path) -> io.TextIOBase:
    """Open ``path`` for text reading, gunzipping ``*.gz``, a leading UTF-8 byte-order mark dropped (as Excel
    and PowerShell save CSV); raises DataError if unreadable."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise DataError(f"{path}: cannot open trace: {exc.strerror or exc}") from None


def _positive_int(value: object, where: str, column: str) -> int:
    """Parse a token count (int or decimal string) that must be >= 1."""
    parsed = value
    if isinstance(value, str):
        text = value.strip()
        parsed = int(text) if text.isascii() and text.isdigit() else None
    if isinstance(parsed, bool) or not isinstance(parsed, int) or parsed < 1:  # JSON true is not a count
        raise DataError(f"{where}: column {column!r}: expected an integer >= 1, got {value!r}")
    return parsed


class _Slicer:
    """Applies the time window, the limit and the monotonic-time check, in file order."""

    def __init__(self, limit: int | None, start_s: float | None, end_s: float | None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit, self.start_s, self.end_s = limit, start_s, end_s
        self.kept = 0
        self.last_s = 0.0

    def check(self, arrival_s: float, where: str, column: str) -> str:
        """Return 'keep', 'skip' or 'stop' for a record at ``arrival_s``."""
        if arrival_s < self.last_s:
            raise DataError(
                f"{where}: column {column!r}: time goes back ({arrival_s:.6f} s after trace start, "
                f"previous record {self.last_s:.6f} s); the trace must be sorted by arrival"
            )
        self.last_s = arrival_s
        if self.end_s is not None and arrival_s >= self.end_s:
            return "stop"
        if self.start_s is not None and arrival_s < self.start_s:
            return "skip"
        if self.limit is not None and self.kept >= self.limit:
            return "stop"
        self.kept += 1
        return "keep"

    def done(self) -> bool:
        return self.limit is not None and self.kept >= self.limit


#: One record as a trace reader yields it: arrival (s from the first record), ``file:line``, the
#: time column's name, and the function that parses the rest of the record.
_Row: TypeAlias = tuple[float, str, str, Callable[[], TraceRequest]]


def _sliced(rows: Generator[_Row, None, None], limit: int | None, start_s: float | None,
            end_s: float | None) -> Iterator[TraceRequest]:
    """The records of ``rows`` (``(arrival_s, where, time column, build)`` in file order) that
    pass the window and the limit (``_Slicer``); ``build()`` parses the rest of a record and runs
    only for a kept one. ``rows`` is not started when the limit is 0, and is closed as soon as
    the window or the limit is exhausted."""
    sl = _Slicer(limit, start_s, end_s)
    if sl.done():
        return
    with closing(rows):
        for arrival_s, where, column, build in rows:
            verdict = sl.check(arrival_s, where, column)
            if verdict == "stop":
                return
            if verdict == "skip":
                continue
            yield build()
            if sl.done():
                return


def iter_mooncake(
    path: str | Path,
    *,
    limit: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> Iterator[TraceRequest]:
    """Yield the requests of a Mooncake trace (``.jsonl`` or ``.jsonl.gz``) in file order.

    ``arrival_s`` = (timestamp - first timestamp) / 1000. ``block_hashes`` is the
    tuple of ``hash_ids`` (``None`` if the key is absent). Blank lines are skipped.
    Raises ``DataError("file:line: ...")`` naming the key for invalid JSON, a missing
    or non-integer field, a ``hash_ids`` that is not a list of integers or does not hold one
    id per ``MOONCAKE_BLOCK_TOKENS``-token block of the prompt, or time going backwards.
    """
    return _sliced(_mooncake_rows(Path(path)), limit, start_s, end_s)


def _mooncake_rows(path: Path) -> Generator[_Row, None, None]:
    """``_sliced`` rows of a Mooncake trace (see ``iter_mooncake``)."""
    t0_ms: float | None = None
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON: {exc.msg} at column {exc.colno}") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in row:
                    raise DataError(f"{where}: missing column {key!r}")
            ts = row["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts or ts < 0:
                raise DataError(f"{where}: column 'timestamp': expected a number of ms >= 0, got {ts!r}")
            if t0_ms is None:
                t0_ms = ts
            arrival_s = (ts - t0_ms) / 1000.0
            yield arrival_s, where, "timestamp", partial(_mooncake_request, row, where, arrival_s)


def _mooncake_request(row: dict[str, object], where: str, arrival_s: float) -> TraceRequest:
    """The ``TraceRequest`` of one kept Mooncake record (its counts and ``hash_ids`` checked)."""
    prompt = _positive_int(row["input_length"], where, "input_length")
    output = _positive_int(row["output_length"], where, "output_length")
    hashes = row.get("hash_ids")
    if hashes is None:
        return TraceRequest(arrival_s, prompt, output, None)
    if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise DataError(f"{where}: column 'hash_ids': expected a list of integers")
    blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(hashes) != blocks:  # the simulator's prefix cache and the frontier's prompt cache read one id per block
        raise DataError(f"{where}: column 'hash_ids': {len(hashes)} block ids for {prompt} prompt tokens; expected "
                        f"{blocks} (one per {MOONCAKE_BLOCK_TOKENS}-token block, the last may be partial)")
    return TraceRequest(arrival_s, prompt, output, tuple(hashes))


_AZURE_TS = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?")


def _azure_timestamp_ns(text: str) -> int | None:
    """``'2023-11-16 18:17:03.9799600'`` -> integer nanoseconds since the Unix epoch (read as UTC).

    Parsed exactly: ``datetime.fromisoformat`` would silently drop the 7th digit.
    Returns None when the text is not a timestamp of that shape.
    """
    m = _AZURE_TS.fullmatch(text.strip())
    if m is None:
        return None
    try:
        whole = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC)
    except ValueError:
        return None
    frac = m.group(2) or ""
    return int(whole.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def iter_azure_llm(
    path: str | Path,
    *,
    limit: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> Iterator[TraceRequest]:
    """Yield the requests of an Azure LLM inference trace CSV (2023 format) in file order.

    Columns ``TIMESTAMP, ContextTokens, GeneratedTokens`` (order free, extra columns
    ignored). ``arrival_s`` is exact to the nanosecond relative to the first row.
    No prefix hashes, sessions or prompt ids. Raises ``DataError`` naming
    ``file:line`` and the column for a missing header column, a bad timestamp, a
    token count that is not an integer >= 1, or time going backwards.
    """
    return _sliced(_azure_rows(Path(path)), limit, start_s, end_s)


def _azure_rows(path: Path) -> Generator[_Row, None, None]:
    """``_sliced`` rows of an Azure LLM inference trace (see ``iter_azure_llm``)."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}:1: empty file, expected header {','.join(AZURE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise DataError(
                f"{path}:1: missing column(s) {', '.join(map(repr, missing))}; header has {header}"
            )
        i_ts, i_ctx, i_gen = (header.index(c) for c in AZURE_COLUMNS)
        width = max(i_ts, i_ctx, i_gen) + 1
        t0_ns: int | None = None
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < width:
                raise DataError(f"{where}: expected {len(header)} columns, got {len(row)}")
            ns = _azure_timestamp_ns(row[i_ts])
            if ns is None:
                raise DataError(
                    f"{where}: column 'TIMESTAMP': expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', got {row[i_ts]!r}"
                )
            if t0_ns is None:
                t0_ns = ns
            arrival_s = (ns - t0_ns) / 1e9
            yield arrival_s, where, "TIMESTAMP", partial(
                _azure_request, arrival_s, row[i_ctx], row[i_gen], where)


def _azure_request(arrival_s: float, context_tokens: str, generated_tokens: str, where: str) -> TraceRequest:
    """The ``TraceRequest`` of one kept Azure record (its token counts checked)."""
    return TraceRequest(arrival_s, _positive_int(context_tokens, where, "ContextTokens"),
                        _positive_int(generated_tokens, where, "GeneratedTokens"))


def load_trace(
    path: str | Path,
    *,
    limit: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> list[TraceRequest]:
    """Load a whole trace into a list, picking the format from the file name.

    ``*.jsonl[.gz]`` -> Mooncake, ``*.csv[.gz]`` -> Azure LLM. Same slicing options
    and errors as ``iter_mooncake`` / ``iter_azure_llm``; an unknown extension is a
    ``DataError``.
    """
    path = Path(path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    loader = {".jsonl": iter_mooncake, ".csv": iter_azure_llm}.get(Path(name).suffix)
    if loader is None:
        raise DataError(f"{path}: unknown trace format (expected *.jsonl[.gz] Mooncake or *.csv[.gz] Azure)")
    return list(loader(path, limit=limit, start_s=start_s, end_s=end_s))
