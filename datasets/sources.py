"""The public outcome sources in ``../shared/datasets``: where each table lives,
its license, how its scores read, and which models count as weak and strong.

A *source* is one wide outcome table plus the choice of model columns that
turn it into "was the cheaper model's answer worse than the frontier model's"
labels (``pointsman.training.labels``). Licenses come from
``../shared/datasets/README.md``. Only sources whose license is in
``TRAINABLE_LICENSES`` may train the shipped default model;
``default_training_sources()`` enforces that.

Weak models are open or budget chat models of the 2–70B class (the "cheaper
model" tier); strong models are the frontier models of the table's era. Base
models that do not follow instructions (``llama-13b`` in Arena-Bench) and
reasoning models (o1) are left out of both sides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pointsman.errors import DataError

#: Licenses that allow training the shipped (commercially usable) default model.
TRAINABLE_LICENSES = frozenset({"Apache-2.0", "MIT"})

#: Score kinds: 0/1 correctness, a 1–10 judge rating, a 0–1 win score against a reference answer.
SCORE_KINDS = ("correct01", "judge_1_10", "win_vs_reference")


@dataclass(frozen=True)
class OutcomeSource:
    """One outcome table and how to read it.

    ``relpath``: path under the shared datasets folder. ``license``: the data's
    license (SPDX-like id). ``score_kind``: one of ``SCORE_KINDS``.
    ``weak``/``strong``: model columns on each side of the pairwise label.
    ``domain``: a short word for reports (math, code, knowledge, chat).
    ``anchor``: a weak model present in every training source (Mixtral-8x7B-Instruct),
    whose rate of falling short of the source's strong models lines the sources up on
    one scale (``TrainConfig.label_offsets="anchor"``); ``None`` if absent.
    ``panel``: more model columns (any strength) whose outcomes on the same prompt denoise the
    weak/strong label (``TrainConfig.panel_weight``, ``training.examples``); ``()`` for none.
    """

    name: str
    relpath: str
    license: str
    score_kind: str
    weak: tuple[str, ...]
    strong: tuple[str, ...]
    domain: str
    origin: str
    anchor: str | None = None
    panel: tuple[str, ...] = ()

    @property
    def trainable(self) -> bool:
        """True when the license allows training the shipped default model."""
        return self.license in TRAINABLE_LICENSES

    def path(self, root: str | Path | None = None) -> Path:
        """Absolute path of the table under ``root`` (default ``shared_datasets_dir()``); an absolute
        ``relpath`` (an operator's table, ``training.table_source``) is that path."""
        if Path(self.relpath).is_absolute():
            return Path(self.relpath)
        return Path(root or shared_datasets_dir()) / self.relpath


_ZE_WEAK_GSM = (
    "gemma-2-2b-it",
    "command-r",
    "Mixtral-8x7B-Instruct-v0.1",
    "Yi-1.5-9B-Chat",
    "Meta-Llama-3-8B-Instruct",
    "Qwen2-7B-Instruct",
    "Phi-3.5-mini-instruct",
    "Mistral-Nemo-Instruct-2407",
    "Meta-Llama-3.1-8B-Instruct",
    "gemma-2-9b-it",
)
_ZE_WEAK_CRUX = (
    "gemma-2-2b-it",
    "Qwen2.5-3B-Instruct",
    "Meta-Llama-3-8B-Instruct",
    "Qwen2-7B-Instruct",
    "Meta-Llama-3.1-8B-Instruct",
    "Phi-3.5-mini-instruct",
    "Phi-3-mini-4k-instruct",
    "Yi-1.5-9B-Chat",
    "Mixtral-8x7B-Instruct-v0.1",
    "gemma-2-9b-it",
    "Qwen2.5-7B-Instruct",
)
_ZE_STRONG_GSM = (
    "gpt-4o-2024-05-13",
    "gpt-4o-2024-08-06",
    "claude-3-5-sonnet-20240620",
    "claude-3-5-sonnet-20241022",
    "Meta-Llama-3.1-405B-Instruct@hyperbolic",
)
_ZE_STRONG_CRUX = (
    "gpt-4o-2024-05-13",
    "gpt-4o-2024-08-06",
    "claude-3-5-sonnet-20240620",
    "claude-3-5-sonnet-20241022",
    "Meta-Llama-3.1-405B-Instruct@hyperbolic",
)
_ROUTELLM = ("mistralai/Mixtral-8x7B-Instruct-v0.1",), ("gpt-4-1106-preview",)
_MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"

SOURCES: dict[str, OutcomeSource] = {
    s.name: s
    for s in (
        OutcomeSource(
            "routellm_mmlu", "routellm/mmlu_mixtral_vs_gpt4.csv.gz", "Apache-2.0", "correct01",
            *_ROUTELLM, domain="knowledge", origin="lm-sys/RouteLLM (MMLU, MIT)", anchor=_MIXTRAL,
        ),
        OutcomeSource(
            "routellm_gsm8k", "routellm/gsm8k_mixtral_vs_gpt4.csv.gz", "Apache-2.0", "correct01",
            *_ROUTELLM, domain="math", origin="lm-sys/RouteLLM (GSM8K, MIT)", anchor=_MIXTRAL,
        ),
        OutcomeSource(
            "routellm_mtbench", "routellm/mtbench_mixtral_vs_gpt4.csv", "Apache-2.0", "judge_1_10",
            *_ROUTELLM, domain="chat", origin="lm-sys/RouteLLM (MT-bench questions, Apache-2.0)", anchor=_MIXTRAL,
        ),
        OutcomeSource(
            "zeroeval_gsm8k", "zeroeval/gsm8k_correctness.csv.gz", "Apache-2.0", "correct01",
            _ZE_WEAK_GSM, _ZE_STRONG_GSM, domain="math", origin="WildEval/ZeroEval (GSM8K, MIT)",
            anchor="Mixtral-8x7B-Instruct-v0.1",
        ),
        OutcomeSource(
            "zeroeval_crux", "zeroeval/cruxeval_correctness.csv.gz", "Apache-2.0", "correct01",
            _ZE_WEAK_CRUX, _ZE_STRONG_CRUX, domain="code", origin="WildEval/ZeroEval (CRUXEval, MIT)",
            anchor="Mixtral-8x7B-Instruct-v0.1",
        ),
        OutcomeSource(
            "arena_bench_v1", "arena_bench_v1/arena_bench_v1_gpt4_single_scores.csv", "Apache-2.0", "judge_1_10",
            (
                "mistralai/Mistral-7B-Instruct-v0.1",
                "Llama-2-70b-chat",
                "vicuna-33b-v1.3",
                "openchat_3.5",
                "Starling-LM-7B-alpha",
                "mistralai/Mixtral-8x7B-Instruct-v0.1",
            ),
            ("gpt-4-1106-preview", "gpt-4-0314"),
            domain="chat", origin="lmarena/arena-hard-auto (Arena-Bench-V1, Chatbot Arena prompts)",
            anchor=_MIXTRAL,
            # every instruction-following model below the frontier (llama-13b, a base model, left out)
            panel=("Llama-2-70b-chat", "Starling-LM-7B-alpha", "claude-1", "claude-2.1", "claude-instant-1",
                   "gpt-3.5-turbo", "gpt-3.5-turbo-1106", "mistralai/Mistral-7B-Instruct-v0.1",
                   "mistralai/Mixtral-8x7B-Instruct-v0.1", "openchat_3.5", "palm-2-chat-bison-001", "vicuna-33b-v1.3"),
        ),
        OutcomeSource(
            "alpacaeval_ae1", "alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz", "CC-BY-NC-4.0",
            "win_vs_reference",
            ("llama-2-7b-chat-hf",),
            ("gpt4_1106_preview",),
            domain="chat", origin="tatsu-lab/alpaca_eval (AlpacaEval 1.0, non-commercial data)",
        ),
    )
}

#: The sources the shipped default model trains on (all Apache-2.0/MIT): the licensed chat sets,
#: chosen by leave-one-chat-source-out (``scripts/select_recipe_v2.py``); the benchmark tables
#: (MMLU, GSM8K, CRUXEval) transfer worse to chat prompts.
DEFAULT_TRAINING_SOURCES = (
    "arena_bench_v1",
    "routellm_mtbench",
)
#: Every Apache-2.0/MIT outcome source (the v1 default's mix).
ALL_LICENSED_SOURCES = (
    "routellm_mmlu",
    "routellm_gsm8k",
    "routellm_mtbench",
    "zeroeval_gsm8k",
    "zeroeval_crux",
    "arena_bench_v1",
)


def shared_datasets_dir() -> Path:
    """The shared datasets folder: ``$POINTSMAN_SHARED_DATASETS``, else the first of
    ``../shared/datasets`` relative to the working directory or to the repository root
    that exists. Raises ``DataError`` when none exists."""
    env = os.environ.get("POINTSMAN_SHARED_DATASETS")
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parent.parent
    for cand in (Path.cwd() / ".." / "shared" / "datasets", repo_root / ".." / "shared" / "datasets"):
        if cand.is_dir():
            return cand.resolve()
    raise DataError(
        "shared datasets folder not found: set POINTSMAN_SHARED_DATASETS or run from a checkout "
        "next to ../shared/datasets"
    )


def get_source(name: str) -> OutcomeSource:
    """The source called ``name``; raises ``DataError`` listing the known names."""
    try:
        return SOURCES[name]
    except KeyError:
        raise DataError(f"unknown outcome source {name!r}; known: {', '.join(SOURCES)}") from None


def default_training_sources(names: tuple[str, ...] | list[str] | None = None) -> list[OutcomeSource]:
    """Sources for training the shipped default model (``DEFAULT_TRAINING_SOURCES`` unless
    ``names`` is given). Raises ``DataError`` if any is not Apache-2.0/MIT licensed —
    the guard that keeps non-commercial data (AlpacaEval) out of the shipped model."""
    sources = [get_source(n) for n in (names or DEFAULT_TRAINING_SOURCES)]
    bad = [f"{s.name} ({s.license})" for s in sources if not s.trainable]
    if bad:
        raise DataError(
            "refusing to train the default model on non-Apache/MIT data: " + ", ".join(bad)
            + f"; allowed licenses: {', '.join(sorted(TRAINABLE_LICENSES))}"
        )
    return sources
