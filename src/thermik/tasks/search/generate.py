"""Search QA rows from the corpus facts whose document BM25 ranks in the top SOLVER_K for the question.

The solver searches with the question itself, then answers with the fact's exact span; keeping only the
facts the retriever finds makes every solved conversation correct by construction.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from thermik.envs.base import Message
from thermik.tasks.search.corpus import Fact, build, default_index, format_results
from thermik.tools.parsers import format_hermes_tool_call

SEARCH_SYSTEM = "Answer the question. Use the search tool to find documents, then give a short answer in answer tags."
SOLVER_K = 3


@functools.cache
def answerable_facts() -> dict[str, Fact]:
    """question -> fact, for the facts whose document is among the top SOLVER_K results for the question."""
    index = default_index()
    facts = {}
    for fact in build()[1]:
        if fact.doc_id in {d.doc_id for d in index.search(fact.question, SOLVER_K)}:
            facts[fact.question] = fact
    return facts


def search_problem(rng: random.Random) -> str:
    questions = sorted(answerable_facts())
    return questions[rng.randrange(len(questions))]


def search_row(question: str) -> dict[str, Any]:
    fact = answerable_facts()[question]
    return {
        "data_source": "synthetic/search",
        "env_class": "search",
        "prompt": [{"role": "system", "content": SEARCH_SYSTEM}, {"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": [fact.answer]},
        "extra_info": {"problem": question, "doc_id": fact.doc_id},
    }


def search_solve(row: dict[str, Any]) -> list[Message]:
    question = row["prompt"][-1]["content"]
    results = format_results(default_index().search(question, SOLVER_K))
    return [
        *row["prompt"],
        {"role": "assistant", "content": format_hermes_tool_call("search", {"query": question, "k": SOLVER_K})},
        {"role": "tool", "name": "search", "content": results},
        {"role": "assistant", "content": f"<answer>{row['reward_spec']['ground_truth'][0]}</answer>"},
    ]
