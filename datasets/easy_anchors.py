"""Easy anchors: requests every instruction-following chat model answers acceptably, made from
templates (Pointsman's own, Apache-2.0): greetings and thanks in several languages, look-ups, unit
conversions, small arithmetic, one-line writing, beginner programming and SQL questions, and light
edits of a pasted paragraph (fix the typos, translate, summarize, reformat). The outcome tables hold
almost none of these (their prompts were chosen to be hard), so a head trained on them alone has
never seen an easy request; the anchors teach the difficulty head's gate (``estimator.head``) what
"obviously fine on the cheap model" looks like. The pasted paragraphs are cut from the answers in
``arena_bench_v1/model_outputs_long.csv.gz`` (Apache-2.0).

``easy_anchor_prompts(root=None, n=EASY_ANCHORS, seed=0) -> list[str]``: deterministic, sorted,
unique. Written before the sanity suite (``sanity_pairs.jsonl``) was read, and never from it; any
anchor that is also a request of the shipped sanity sets is dropped (decontamination: a few trivial
strings such as "Thanks!" occur in both). Latin script only: the outcome tables hold almost no other
script, so anchors in Chinese, Japanese, Korean or Cyrillic taught the gate that the script itself
means easy (a Japanese proof request scored 0.0001).
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pandas as pd

from pointsman.datasets.sources import shared_datasets_dir
from pointsman.errors import DataError

#: The sanity sets whose requests no anchor may repeat (``easy_anchor_prompts``).
SANITY_FILES = ("sanity_pairs.jsonl", "sanity_holdout_pairs.jsonl")
#: Template anchors and pasted-text anchors made per training run.
EASY_ANCHORS, PASTED_ANCHORS = 1100, 300
#: The Apache-2.0 answers whose paragraphs the pasted-text anchors cut (under the shared datasets).
PASTE_SOURCE = "arena_bench_v1/model_outputs_long.csv.gz"

COUNTRIES = [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"), ("Germany", "Berlin"),
             ("Canada", "Ottawa"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
             ("Chile", "Santiago"), ("India", "New Delhi"), ("Brazil", "Brasília"), ("Greece", "Athens"), ("Poland", "Warsaw")]
WORDS = ["apple", "house", "river", "happy", "quick", "bright", "teacher", "window", "garden", "cloud", "music", "bread",
         "mountain", "yellow", "friend", "coffee", "summer", "pencil", "ocean", "little"]
LANGS = ["Spanish", "French", "German", "Italian", "Portuguese", "Japanese", "Chinese", "Russian"]
TOPICS = ["the sea", "autumn", "a cat", "coffee", "the moon", "rain", "friendship", "a city at night", "spring", "a dog"]
GREET = ["hi", "hello", "hey", "good morning", "good evening", "hi there", "hey, how are you?", "thanks!", "thank you",
         "thanks a lot", "ok", "okay", "cool", "great, thanks", "nice", "bye", "see you", "lol", "yes", "no", "sure",
         "got it", "perfect", "awesome", "hello!", "what's up?", "how are you today?", "good night", "cheers", "ty",
         "Hallo", "Danke", "Bonjour", "Merci", "Hola", "Gracias", "Ciao", "Grazie", "Olá", "Obrigado",
         "Hej", "Tack"]
SIMPLE = [
    "What is the capital of {cn}?", "Which continent is {cn} in?", "What language is spoken in {cn}?",
    "What is {a} + {b}?", "What is {a} times {b}?", "What is {a} minus {b}?", "Is {a} an even number?",
    "Convert {a} km to miles.", "Convert {a} kilograms to pounds.", "How many minutes are in {a} hours?",
    "Translate '{w}' into {l}.", "What is the plural of '{w}'?", "Give me a synonym for '{w}'.",
    "What's the opposite of '{w}'?", "Spell '{w}' backwards.", "How many letters are in the word '{w}'?",
    "Define the word '{w}'.", "Use the word '{w}' in a sentence.", "Sort this list: {lst}",
    "What is the largest number in {lst}?",
    "Write a haiku about {t}.", "Write one sentence about {t}.", "Tell me a fun fact about {t}.", "Tell me a joke about {t}.",
    "Name three colors.", "Name five fruits.", "What day comes after {d}?", "How many days are in a week?",
    "What color is the sky on a clear day?", "Capitalize this: {w} {w2}", "Fix the typo: 'teh {w}'",
    "Is {a} greater than {b}?", "Round {f} to the nearest whole number.", "What is 10% of {a}0?",
    "Make this sentence more polite: 'give me the {w}'.", "Add a period to the end of: 'I like {w}s'",
    "Summarize in one line: The {w} was on the table, and then someone moved it to the shelf.",
    "Give me a name for a pet {w}.", "What rhymes with '{w}'?", "Say hello in {l}.", "Count from 1 to {a}.",
]
LANGS_PY = ["Python", "JavaScript", "Java", "C", "Go", "Rust", "Ruby", "PHP", "C#", "Bash"]
THINGS = ["list", "string", "dictionary", "array", "variable", "loop", "function", "file", "number", "date"]
TABLES = ["users", "orders", "products", "employees", "customers", "books"]
COLS = ["name", "email", "price", "age", "city", "created_at", "status"]
SCI = ["water", "the sun", "a plant", "the moon", "ice", "a magnet", "the heart", "air", "salt", "sound"]
DOMAIN = [
    "How do I print hello world in {p}?", "How do I reverse a {th} in {p}?", "How do I get the length of a {th} in {p}?",
    "What does a for loop do in {p}?", "How do I comment a line in {p}?", "How do I read a file in {p}?",
    "Write a {p} function that adds two numbers.", "Write a {p} function that returns the larger of two numbers.",
    "How do I convert a string to an integer in {p}?", "What is a {th} in {p}?", "How do I check if a {th} is empty in {p}?",
    "What does print() do in Python?", "How do I install a package with pip?", "What does 'git status' do?",
    "How do I create a new folder in the terminal?", "What is the difference between = and == in {p}?",
    "Write a SQL query to select all rows from the {tb} table.", "Write a SQL query that counts the rows in {tb}.",
    "Write a SQL query to get the {c} column from {tb}.", "How do I sort {tb} by {c} in SQL?", "What does SELECT * mean in SQL?",
    "In Excel, how do I sum a column?", "How do I remove duplicates from a column in Excel?",
    "What is the boiling point of water?", "Why is the sky blue? One sentence.", "What is {sc} made of?", "Is {sc} alive?",
    "What planet do we live on?", "How many legs does a spider have?", "What gas do plants take in?",
    "What is 15% of 200?", "What is the square root of 81?", "What is half of {a}?", "Is {a} divisible by 2?",
    "What is {a} squared?", "Add these numbers: {a}, {b}, 3.", "If I have {a} apples and eat 2, how many are left?",
    "Which is heavier, a kilogram of feathers or a kilogram of steel?", "If today is {d}, what day is tomorrow?",
    "Put these in alphabetical order: {w}, {w2}, zebra.", "Which word does not belong: cat, dog, {w}, horse?",
    "Write a short thank-you note to a colleague.", "Write a birthday message for my friend.",
    "Suggest a title for a blog post about {t}.",
    "Rewrite this sentence in the past tense: 'I walk to the {w}.'", "Give me three words that describe {t}.",
    "Write an out-of-office email reply.", "Correct the spelling: 'recieve', 'seperate', 'occured'.",
    "Translate 'thank you very much' into {l}.", "How do you say '{w}' in {l}?", "What does 'merci' mean?",
    "Wie spät ist es?", "Wie heißt die Hauptstadt von Deutschland?", "Übersetze 'Haus' ins Englische.",
    "Quelle est la capitale de la France ?", "Comment dit-on 'chat' en anglais ?", "¿Qué hora es?",
    "¿Cuál es la capital de España?",
    "Traduce 'hola' al inglés.", "Qual é a capital do Brasil?",

]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]

def _template_anchors(n: int, seed: int) -> list[str]:
    """The greetings, then template requests with random fillers until ``n`` made (duplicates count)."""
    rng = random.Random(seed)
    out = list(GREET)
    while len(out) < n:
        template = rng.choice(SIMPLE + DOMAIN)
        numbers = ", ".join(str(rng.randint(0, 20)) for _ in range(rng.randint(3, 6)))
        out.append(template.format(
            cn=rng.choice(COUNTRIES)[0], a=rng.randint(2, 99), b=rng.randint(2, 99), w=rng.choice(WORDS),
            w2=rng.choice(WORDS), l=rng.choice(LANGS), t=rng.choice(TOPICS), d=rng.choice(DAYS),
            f=round(rng.uniform(1, 99), 2), p=rng.choice(LANGS_PY), th=rng.choice(THINGS), tb=rng.choice(TABLES),
            c=rng.choice(COLS), sc=rng.choice(SCI), lst=numbers))
    return out


TRANSFORM = [
    "Fix the typos in this text:\n\n{x}", "Translate this into {l}:\n\n{x}", "Summarize this in one sentence:\n\n{x}",
    "Turn this into a bullet list:\n\n{x}", "Make this sound friendlier:\n\n{x}", "Put this in all lowercase:\n\n{x}",
    "How many words are in this text?\n\n{x}", "Add paragraph breaks to this text:\n\n{x}", "Give this text a title:\n\n{x}",
    "{x}\n\nCan you check the spelling above?", "{x}\n\nTranslate the above into {l}, please.", "{x}\n\ntl;dr?",
    "Correct the grammar:\n{x}", "Shorten this a bit:\n{x}", "Replace every 'the' with 'a' in this text:\n{x}",
    "What is the first word of this text?\n{x}", "Make this text bold in Markdown:\n{x}",
]

def _pasted_anchors(paragraphs: list[str], n: int, seed: int) -> list[str]:
    """``n`` light edits (``TRANSFORM``) of a paragraph's first 200-800 characters."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(n if paragraphs else 0):
        p = rng.choice(paragraphs)
        cut = rng.randint(200, 800)
        out.append(rng.choice(TRANSFORM).format(x=p[:cut], l=rng.choice(LANGS)))
    return out


def _paragraphs(root: str | Path | None) -> list[str]:
    """Paragraphs of over 150 characters from the first 3,000 answers of ``PASTE_SOURCE``; none when
    the shared datasets (or that file) are not there, as on an operator's machine training on its
    own table: the template anchors still hold."""
    try:
        path = Path(root or shared_datasets_dir()) / PASTE_SOURCE
    except DataError:
        return []
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        answers = pd.read_csv(fh)["output"].dropna().astype(str).tolist()[:3000]
    return [p.strip() for a in answers for p in a.split("\n\n") if len(p.strip()) > 150]


def easy_anchor_prompts(root: str | Path | None = None, n: int = EASY_ANCHORS, seed: int = 0) -> list[str]:
    """The easy anchors: up to ``n`` template requests (duplicates dropped) and ``PASTED_ANCHORS``
    light edits of pasted paragraphs (none without ``PASTE_SOURCE``), sorted."""
    made = set(_template_anchors(n, seed)) | set(_pasted_anchors(_paragraphs(root), PASTED_ANCHORS, seed))
    seen = _sanity_texts()
    return sorted(a for a in made if _norm(a) not in seen)


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _sanity_texts() -> frozenset[str]:
    """Every user message of the shipped sanity sets (``SANITY_FILES``), normalised (case, spaces)."""
    out: set[str] = set()
    for name in SANITY_FILES:
        path = Path(__file__).with_name(name)
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            pair = json.loads(line)
            for request in (pair.get("easy"), pair.get("hard")):
                messages = [{"role": "user", "content": request}] if isinstance(request, str) else request or []
                out.update(_norm(str(m.get("content") or "")) for m in messages if m.get("role") == "user")
    return frozenset(out)
