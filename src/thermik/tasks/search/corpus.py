"""The search corpus: short documents about fictional towns and people, generated from a fixed seed.

Fictional entities make exact-match QA possible (no model knows the answer in advance, and each
answer is written in exactly one document). `facts()` yields the question/answer pairs the
`search` environment's dataset is built from. BM25 retrieval (Robertson & Zaragoza 2009) comes
from the `bm25s` library.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

CORPUS_VERSION = "corpus-v1"
N_TOWNS = 150
N_PEOPLE = 150
_ONSETS = ("b", "br", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "st", "c")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "n", "r", "l", "s", "m", "th", "x")
PROVINCES = ("Ostrand", "Velaria", "Kethmoor", "Durnhelm", "Saradel", "Vintmark")
EXPORTS = ("amber", "wool", "salt", "copper", "timber", "honey", "glass", "silk", "barley", "cheese", "olives", "tin")
PROFESSIONS = ("painter", "engineer", "poet", "astronomer", "composer", "botanist", "architect", "chemist")


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Fact:
    """A question answered by one document; `answer` is the exact span written in it."""

    question: str
    answer: str
    doc_id: str


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _unique_names(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = _name(rng, syllables)
        if name not in taken and len(name) <= 12:
            taken.add(name)
            names.append(name)
    return names


@functools.cache
def build() -> tuple[tuple[Document, ...], tuple[Fact, ...]]:
    """All documents and facts, deterministic in CORPUS_VERSION."""
    rng = random.Random(CORPUS_VERSION)
    taken: set[str] = set()
    towns = _unique_names(rng, N_TOWNS, 2, taken)
    rivers = _unique_names(rng, 20, 2, taken)
    docs: list[Document] = []
    facts: list[Fact] = []
    for town in towns:
        doc_id = str(len(docs))
        province, year, river = rng.choice(PROVINCES), rng.randint(900, 1900), rng.choice(rivers)
        export = rng.choice(EXPORTS)
        text = (
            f"{town} is a town in the province of {province}. It was founded in {year} and lies on the river "
            f"{river}. Its main export is {export}."
        )
        docs.append(Document(doc_id, town, text))
        facts += [
            Fact(f"In which province is {town}?", province, doc_id),
            Fact(f"In which year was {town} founded?", str(year), doc_id),
            Fact(f"On which river does {town} lie?", river, doc_id),
            Fact(f"What is the main export of {town}?", export, doc_id),
        ]
    for first, last in zip(_unique_names(rng, N_PEOPLE, 2, taken), _unique_names(rng, N_PEOPLE, 2, taken), strict=True):
        doc_id, person = str(len(docs)), f"{first} {last}"
        profession, town, year = rng.choice(PROFESSIONS), rng.choice(towns), rng.randint(1500, 1990)
        article = "an" if profession[0] in "aeiou" else "a"
        text = f"{person} was {article} {profession} born in {town} in {year}."
        docs.append(Document(doc_id, person, text))
        facts += [
            Fact(f"What was the profession of {person}?", profession, doc_id),
            Fact(f"In which town was {person} born?", town, doc_id),
            Fact(f"In which year was {person} born?", str(year), doc_id),
        ]
    return tuple(docs), tuple(facts)


class SearchIndex:
    """BM25 over the corpus documents (lower-cased word tokens, English stop words removed)."""

    def __init__(self, documents: tuple[Document, ...]) -> None:
        try:
            import bm25s
        except ImportError as exc:
            raise ImportError(
                f"the search corpus needs bm25s ({exc}); install it with `pip install 'thermik[envs]'`"
            ) from exc
        self._tokenize = bm25s.tokenize
        self.documents = documents
        self.by_id = {d.doc_id: d for d in documents}
        self._bm25 = bm25s.BM25()
        texts = [d.text for d in documents]
        self._bm25.index(self._tokenize(texts, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int) -> list[Document]:
        """The top-k documents with a positive score, best first."""
        tokens = self._tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        k = max(1, min(k, len(self.documents)))
        ids, scores = self._bm25.retrieve(tokens, k=k, show_progress=False)
        return [self.documents[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


@functools.cache
def default_index() -> SearchIndex:
    return SearchIndex(build()[0])


def format_results(documents: list[Document]) -> str:
    """The text the model sees: one '[doc_id] text' line per document."""
    return "\n".join(f"[{d.doc_id}] {d.text}" for d in documents) or "no documents found"
