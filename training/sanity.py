"""The sanity suite: does the difficulty model rank an obviously hard request above an obviously
easy one in the same register? (``pointsman evaluate --pairs``, the promotion gate, issue 21.)

A pairs file is JSON Lines, one pair per line::

    {"id": "code-001", "category": "code", "lang": "en", "easy": <request>, "hard": <request>}

where a request is a string (one user message) or a list of OpenAI chat messages (tool calls and
tool results allowed). The shipped suite, ``datasets/sanity_pairs.jsonl`` (spec ``"sanity"``), is
written by hand and never trained on.

- ``read_pairs(spec) -> list[SanityPair]``: the pairs of a file (or ``"sanity"``); ``DataError``
  ``file:line: field 'name': problem`` on the first bad line.
- ``score_request(estimator, request) -> float``: ``p_hard`` of one request through the service's
  path (``parse_route_request``, ``tokenized_features``, ``estimate`` with the query token ids when
  the estimator takes them, as ``policy.engine.RoutingEngine`` does).
- ``concordance(model, pairs) -> SanityReport``: the share of pairs with p_hard(hard) >
  p_hard(easy) (ties count half) with its 95% Wilson interval, per category, and the approval check:
  a hard conversation whose last user turn is a short approval ("yes, go on") after an assistant
  reply must score within ``APPROVAL_TOLERANCE`` of the request it approves, alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Any, TypeAlias

import numpy as np

from pointsman.datasets.splits import group_key
from pointsman.errors import DataError, EstimatorError, RequestError
from pointsman.estimator.estimate import Estimator, TokenIdsEstimator
from pointsman.estimator.features import tokenized_features
from pointsman.request import parse_route_request

#: A request as a pairs file holds it: one user message, or a list of OpenAI chat messages.
Request: TypeAlias = str | list[dict[str, Any]]

#: ``--pairs sanity``: the suite shipped in the package.
SHIPPED = "sanity"
#: An approval: a last user turn of at most this many words (and characters) after an assistant turn.
APPROVAL_MAX_WORDS = 5
APPROVAL_MAX_CHARS = 40
#: The approval check: |p_hard(conversation) - p_hard(request alone)| <= this.
APPROVAL_TOLERANCE = 0.05
FIELDS = ("id", "category", "lang", "easy", "hard")


def shipped_pairs_path() -> Path:
    """The shipped suite inside the installed package (``datasets/sanity_pairs.jsonl``)."""
    return Path(str(resources.files("pointsman.datasets").joinpath("sanity_pairs.jsonl")))


def shipped_suite_paths() -> tuple[Path, Path]:
    """Both shipped suites: the one ``promote`` checks and the holdout suite a second author wrote
    (``datasets/sanity_holdout_pairs.jsonl``). No training reads either."""
    return shipped_pairs_path(), shipped_pairs_path().with_name("sanity_holdout_pairs.jsonl")


def suite_conversation_keys() -> frozenset[str]:
    """The conversation key (``datasets.splits.group_key`` of the first user text, the key the outcome log
    keeps) of every request, easy and hard, of both shipped suites: logged decisions with these keys are
    the suites' own requests, which ``train --from-outcomes`` leaves out."""
    return frozenset(group_key(messages_of(r)) for path in shipped_suite_paths() for p in read_pairs(path)
                     for r in (p.easy, p.hard))


def suite_requests(groups: np.ndarray) -> np.ndarray:
    """Bool mask, shape ``(n,)``: which of ``n`` conversation keys (``datasets.splits.group_key``, any
    array of str) are requests of the shipped suites (``suite_conversation_keys``). Every training path
    leaves these rows out (``train --from-outcomes``, ``train --table``): ``promote`` and ``evaluate
    --pairs`` score on them."""
    return np.isin(np.asarray(groups).astype(str), list(suite_conversation_keys()))


@dataclass(frozen=True)
class SanityPair:
    """One pair of the suite; ``line``: its 1-based line in ``file``."""

    id: str
    category: str
    lang: str
    easy: Request
    hard: Request
    file: str
    line: int


def messages_of(request: Request) -> list[dict[str, Any]]:
    """The chat messages of a request: a string is one user message."""
    return [{"role": "user", "content": request}] if isinstance(request, str) else request


def _check_request(value: object, where: str, name: str) -> Request:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: field '{name}': empty request")
        messages: object = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        messages = value
    else:
        raise DataError(f"{where}: field '{name}': expected a string or a non-empty list of chat messages, "
                        f"got {type(value).__name__}")
    try:
        parse_route_request({"messages": messages})
    except RequestError as exc:
        field = f"{name}.{exc.field}" if exc.field else name
        raise DataError(f"{where}: field '{field}': {exc.message}") from None
    return value  # checked above: a string or a list of dicts


def read_pairs(spec: str | Path = SHIPPED) -> list[SanityPair]:
    """The pairs of a JSON Lines file, or of the shipped suite for ``"sanity"``.

    Blank lines are skipped. Raises ``DataError`` naming ``file:line`` and the field for the first
    bad line: not a JSON object, a missing or non-string ``id``/``category``/``lang``, a duplicate
    ``id``, a request that is neither a string nor a list of chat messages or that the service would
    refuse (``parse_route_request``); and for an unreadable or empty file."""
    path = shipped_pairs_path() if str(spec) == SHIPPED else Path(spec)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the pairs file ({exc})") from None
    pairs: list[SanityPair] = []
    seen: dict[str, int] = {}
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with fields {', '.join(FIELDS)}")
        for name in FIELDS:
            if name not in row:
                raise DataError(f"{where}: field '{name}': missing")
        for name in ("id", "category", "lang"):
            if not isinstance(row[name], str) or not row[name].strip():
                raise DataError(f"{where}: field '{name}': expected a non-empty string, got {row[name]!r}")
        if row["id"] in seen:
            raise DataError(f"{where}: field 'id': duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = n
        pairs.append(SanityPair(row["id"], row["category"], row["lang"], _check_request(row["easy"], where, "easy"),
                                _check_request(row["hard"], where, "hard"), str(path), n))
    if not pairs:
        raise DataError(f"{path}: no pairs")
    return pairs


def approved_request(request: Request) -> list[dict[str, Any]] | None:
    """The request a short approval approves: for messages ending in an assistant turn and then a
    user turn of at most ``APPROVAL_MAX_WORDS`` words and ``APPROVAL_MAX_CHARS`` characters ("yes, go
    on"), the last earlier user message alone; else None."""
    if isinstance(request, str) or len(request) < 3:
        return None
    last, reply = request[-1], request[-2]
    text = last.get("content")
    if last.get("role") != "user" or reply.get("role") != "assistant" or not isinstance(text, str):
        return None
    if len(text.split()) > APPROVAL_MAX_WORDS or len(text) > APPROVAL_MAX_CHARS:
        return None
    earlier = [m for m in request[:-2] if m.get("role") == "user"]
    return [earlier[-1]] if earlier else None


def score_request(estimator: Estimator, request: Request) -> float:
    """``p_hard`` of one request as the service computes it (see the module docstring).

    Raises ``RequestError`` for a request the service would refuse and ``EstimatorError`` when
    the estimate is unavailable (the service would then route on its fallback)."""
    return _estimate(estimator, request)[0]


def _estimate(estimator: Estimator, request: Request) -> tuple[float, int]:
    """``(p_hard, prompt tokens)`` of one request (``score_request``)."""
    route_request = parse_route_request({"messages": messages_of(request)})
    ids_estimator = estimator if isinstance(estimator, TokenIdsEstimator) and estimator.takes_query_token_ids else None
    features, ids = tokenized_features(route_request, estimator.tokenizer, ids_estimator is not None)
    if ids is None or ids_estimator is None:
        estimate = estimator.estimate(features)
    else:
        estimate = ids_estimator.estimate(features, ids)
    if not estimate.available or estimate.p_hard is None:
        raise EstimatorError(f"estimate unavailable: {estimate.error}")
    return float(estimate.p_hard), features.prompt_tokens


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (``successes`` may be fractional:
    ties count half). Raises ``ValueError`` for n < 1 or successes outside [0, n]."""
    if n < 1 or not 0.0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _credit(easy: float, hard: float) -> float:
    return 1.0 if hard > easy else 0.5 if hard == easy else 0.0


@dataclass(frozen=True)
class PairScore:
    """One pair's scores; ``credit``: 1 when p_hard(hard) > p_hard(easy), 0.5 on a tie, else 0."""

    id: str
    category: str
    lang: str
    p_easy: float
    p_hard: float
    tokens_easy: int
    tokens_hard: int

    @property
    def credit(self) -> float:
        return _credit(self.p_easy, self.p_hard)

    @property
    def inversion(self) -> float:
        """p_hard(easy) - p_hard(hard): positive when the pair is ranked the wrong way."""
        return self.p_easy - self.p_hard


@dataclass(frozen=True)
class ApprovalScore:
    """A hard conversation ending in a short approval: its ``p_hard`` and its approved request's alone."""

    id: str
    p_conversation: float
    p_request: float

    @property
    def difference(self) -> float:
        return self.p_conversation - self.p_request

    @property
    def ok(self) -> bool:
        return abs(self.difference) <= APPROVAL_TOLERANCE


@dataclass(frozen=True)
class CategoryScore:
    """Concordance of one category's ``n`` pairs."""

    n: int
    concordance: float


@dataclass
class SanityReport:
    """What ``concordance`` measured. ``concordance`` in [0, 1] (ties count half), ``ci95`` its
    Wilson interval, ``per_category`` by category name, ``approvals`` the approval checks."""

    pairs_file: str
    model_version: str
    model_source: str
    pairs: list[PairScore]
    approvals: list[ApprovalScore]

    @property
    def n(self) -> int:
        return len(self.pairs)

    @property
    def ties(self) -> int:
        return sum(p.credit == 0.5 for p in self.pairs)

    @property
    def concordance(self) -> float:
        return sum(p.credit for p in self.pairs) / self.n

    @property
    def length_concordance(self) -> float:
        """The prompt-length baseline on the same pairs: the longer request (in prompt tokens) is the harder."""
        return sum(_credit(p.tokens_easy, p.tokens_hard) for p in self.pairs) / self.n

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(sum(p.credit for p in self.pairs), self.n)

    @property
    def per_category(self) -> dict[str, CategoryScore]:
        out: dict[str, CategoryScore] = {}
        for cat in sorted({p.category for p in self.pairs}):
            credits = [p.credit for p in self.pairs if p.category == cat]
            out[cat] = CategoryScore(len(credits), sum(credits) / len(credits))
        return out

    @property
    def approvals_ok(self) -> int:
        return sum(a.ok for a in self.approvals)

    def worst(self, k: int = 10) -> list[PairScore]:
        """The ``k`` pairs with the largest p_hard(easy) - p_hard(hard), worst first."""
        return sorted(self.pairs, key=lambda p: p.inversion, reverse=True)[:k]

    def worst_approvals(self, k: int = 5) -> list[ApprovalScore]:
        """The ``k`` approval checks furthest from their request, furthest first."""
        return sorted(self.approvals, key=lambda a: abs(a.difference), reverse=True)[:k]

    def summary(self) -> dict[str, Any]:
        """Plain JSON: the model, the pairs file, the concordance with its interval, the length
        baseline, per category and the approval counts."""
        lo, hi = self.ci95
        return {"pairs_file": self.pairs_file, "model_version": self.model_version, "model_source": self.model_source,
                "n": self.n, "ties": self.ties, "concordance": self.concordance, "ci95_low": lo, "ci95_high": hi,
                "length_concordance": self.length_concordance,
                "per_category": {k: asdict(v) for k, v in self.per_category.items()},
                "approval": {"n": len(self.approvals), "ok": self.approvals_ok, "tolerance": APPROVAL_TOLERANCE}}

    def to_dict(self) -> dict[str, Any]:
        """``summary()`` with every approval check, the 10 worst pairs and every pair's scores."""
        out = self.summary()
        out["approval"]["checks"] = [{**asdict(a), "difference": a.difference, "ok": a.ok} for a in self.approvals]
        return {**out, "worst": [{**asdict(p), "inversion": p.inversion} for p in self.worst()],
                "pairs": [asdict(p) for p in self.pairs]}


def concordance(model: Estimator | str | Path, pairs: Sequence[SanityPair] | str | Path = SHIPPED) -> SanityReport:
    """Score every pair (and every approval check) of ``pairs`` with ``model``.

    ``model``: an estimator (``DifficultyEstimator``) or a spec for ``load_estimator`` (``bundled``,
    ``champion``, a model directory, ``models:/NAME@ALIAS``). ``pairs``: ``read_pairs``' answer or
    its spec (default: the shipped suite). Raises ``DataError`` naming the pair and side whose
    request cannot be scored, ``ModelNotFoundError`` for a bad spec."""
    if isinstance(model, str | Path):
        from pointsman.estimator.model_source import load_estimator

        model = load_estimator(model, intra_op_threads=2)
    rows = read_pairs(pairs) if isinstance(pairs, str | Path) else list(pairs)
    if not rows:
        raise DataError("no pairs to score")

    def score(pair: SanityPair, side: str, request: Request) -> tuple[float, int]:
        try:
            return _estimate(model, request)
        except (RequestError, EstimatorError) as exc:
            raise DataError(f"{pair.file}:{pair.line}: field '{side}': {exc}") from None

    scores = []
    approvals = []
    for p in rows:
        (p_easy, n_easy), (p_hard, n_hard) = score(p, "easy", p.easy), score(p, "hard", p.hard)
        scores.append(PairScore(p.id, p.category, p.lang, p_easy, p_hard, n_easy, n_hard))
        alone = approved_request(p.hard)
        if alone is not None:
            approvals.append(ApprovalScore(p.id, p_hard, score(p, "hard", alone)[0]))
    source = rows[0].file if len({p.file for p in rows}) == 1 else "(several files)"
    return SanityReport(source, str(getattr(model, "version", "?")), str(getattr(model, "source", "?")),
                        scores, approvals)


__all__ = ["APPROVAL_TOLERANCE", "SHIPPED", "ApprovalScore", "CategoryScore", "PairScore", "SanityPair",
           "SanityReport", "approved_request", "concordance", "read_pairs", "score_request", "shipped_pairs_path",
           "shipped_suite_paths", "suite_conversation_keys", "suite_requests", "wilson_interval"]
