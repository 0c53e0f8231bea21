"""Dataset row format (load/write/validate) and synthetic generators (determinism, disjoint splits)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from thermik.data.dataset import DatasetError, load_rows, read_jsonl, validate_row, write_jsonl, write_rows
from thermik.data.problem_key import read_key
from thermik.data.split import split_of
from thermik.tasks.calculator.arith import evaluate
from thermik.tasks.registry import GENERATORS, generate_rows, solve
from thermik.tasks.word_problems.generate import EXPRESSIONS
from thermik.tools.parsers import format_hermes_tool_call


def _row(**overrides) -> dict:
    row = {
        "data_source": "synthetic/calculator",
        "env_class": "calculator",
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 1 + 2?"}],
        "reward_spec": {"method": "rule", "ground_truth": 3},
        "extra_info": {"expression": "1 + 2"},
    }
    row.update(overrides)
    return row


# ---------------------------------------------------------------- dataset files


def test_jsonl_round_trip_and_atomic_write(tmp_path):
    rows = [_row(), _row(reward_spec={"method": "rule", "ground_truth": -7}, extra_info={})]
    path = write_rows(tmp_path / "sub" / "rows.jsonl", rows)
    assert load_rows(path) == rows
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]  # no temp file left behind


def test_parquet_round_trip(tmp_path):
    pytest.importorskip("pyarrow")
    rows = [_row(), _row(reward_spec={"method": "rule", "ground_truth": "dlrow"}, extra_info={})]
    assert load_rows(write_rows(tmp_path / "rows.parquet", rows)) == rows


def test_failed_write_keeps_the_old_file(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": 1}])

    def records():
        yield {"a": 2}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({k: v for k, v in _row().items() if k != "env_class"}, "missing field 'env_class'"),
        ({k: v for k, v in _row().items() if k != "reward_spec"}, "missing field 'reward_spec'"),
        (_row(prompt="hi"), "field 'prompt' must be list"),
        (_row(prompt=[]), "'prompt' is empty"),
        (_row(prompt=[{"role": "bot", "content": "x"}]), r"prompt\[0\].role"),
        (_row(prompt=[{"role": "user", "content": 3}]), r"prompt\[0\].content"),
        (_row(extra_info=None), "field 'extra_info' must be dict"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_validation_names_row_and_field(tmp_path, row, fragment):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=f"rows.jsonl row 2: .*{fragment}"):
        load_rows(path)
    with pytest.raises(DatasetError, match=fragment):
        validate_row(row)


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl line 2: invalid JSON"):
        load_rows(bad)
    with pytest.raises(DatasetError, match="not found"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"unsupported dataset format '\.csv'"):
        load_rows(tmp_path / "rows.csv")
    with pytest.raises(DatasetError, match="row 1: missing field 'prompt'"):
        write_rows(tmp_path / "out.jsonl", [{"data_source": "x", "env_class": "y"}])


# ---------------------------------------------------------------- synthetic generators


@pytest.mark.parametrize("env", sorted(GENERATORS))
def test_generate_rows_is_deterministic_valid_and_distinct(env):
    rows = generate_rows(env, 150, seed=1)  # text2sql has ~176 train problems in all
    assert rows == generate_rows(env, 150, seed=1)
    assert rows != generate_rows(env, 150, seed=2)
    for i, row in enumerate(rows):
        validate_row(row, f"row {i}")
        assert row["env_class"] == env
    problems = [json.dumps(row["prompt"]) for row in rows]
    assert len(set(problems)) == len(problems)


@pytest.mark.parametrize("env", sorted(GENERATORS))
def test_train_and_eval_splits_are_disjoint_across_seeds(env):
    key = {"calculator": "expression", "calculator_thinking": "expression", "reverse_text": "text"}.get(env, "problem")
    train = {row["extra_info"][key] for seed in (0, 1) for row in generate_rows(env, 150, seed, split="train")}
    held_out = {row["extra_info"][key] for seed in (0, 1) for row in generate_rows(env, 20, seed, split="eval")}
    assert train.isdisjoint(held_out)
    assert {split_of(p) for p in train} == {"train"} and {split_of(p) for p in held_out} == {"eval"}


def test_calculator_rows_shape():
    for row in generate_rows("calculator", 300, seed=0):
        expression = row["extra_info"]["expression"]
        assert " " not in expression  # every character the model copies is a digit or an operator
        tokens = re.findall(r"\d+|[+*-]", expression)
        assert "".join(tokens) == expression and len(tokens) in (3, 5)
        assert all(0 <= int(t) <= 99 for t in tokens[::2]) and set(tokens[1::2]) <= {"+", "-", "*"}
        assert row["prompt"][-1] == {"role": "user", "content": f"What is {expression}?"}
        assert row["reward_spec"]["ground_truth"] == evaluate(expression)
        assert len(row["prompt"][0]["content"]) < 60


def test_word_problem_rows_take_their_numbers_from_the_question():
    """Every number of the solver's expression is in the question, and the expression gives the ground truth."""
    rows = generate_rows("word_problems", 300, seed=0)
    assert sum(row["env_class"] == "word_problems" for row in rows) == 300
    assert {read_key(row["extra_info"]["problem"])[0] for row in rows} == set(EXPRESSIONS)
    for row in rows:
        expression, question = row["extra_info"]["expression"], row["prompt"][-1]["content"]
        assert evaluate(expression) == row["reward_spec"]["ground_truth"]
        numbers = set(re.findall(r"\d+", question))
        assert set(re.findall(r"\d+", expression)) - {"2", "3"} <= numbers, (expression, question)
        assert solve(row)[2]["content"] == format_hermes_tool_call("calculate", {"expression": expression})


def test_reverse_rows_shape():
    for row in generate_rows("reverse_text", 300, seed=0):
        text = row["extra_info"]["text"]
        assert 5 <= len(text) <= 20 and text == text.lower() and text.replace(" ", "").isalpha()
        assert row["reward_spec"]["ground_truth"] == text[::-1]


def test_solve_calculator_emits_raw_tool_call_text():
    row = generate_rows("calculator", 1, seed=0)[0]
    expression, truth = row["extra_info"]["expression"], row["reward_spec"]["ground_truth"]
    conversation = solve(row)
    assert conversation[:2] == row["prompt"]
    assert [m["role"] for m in conversation[2:]] == ["assistant", "tool", "assistant"]
    assert conversation[2]["content"] == (
        f'<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
    )
    assert conversation[3] == {"role": "tool", "name": "calculate", "content": str(truth)}
    assert conversation[4] == {"role": "assistant", "content": f"<answer>{truth}</answer>"}


def test_generator_errors():
    with pytest.raises(ValueError, match=r"unknown environment 'chess'; --env.name takes one of calculator"):
        generate_rows("chess", 1, 0)
    with pytest.raises(ValueError, match=r"unknown environment 'calculatr' \(did you mean 'calculator'\?\)"):
        generate_rows("calculatr", 1, 0)
    with pytest.raises(ValueError, match=r"environment 'mcp' has no problem generator .*--data.train_path"):
        generate_rows("mcp", 1, 0)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        generate_rows("calculator", 1, 0, split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        solve(_row(env_class="chess"))


def _doc_rows() -> list[tuple[str, str]]:
    """(doc, text) of every ```json block in docs/ that is a dataset row (names an env_class); sketches with `...`
    placeholders (the contract in architecture.md) are not meant to load."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    blocks = [
        (p.name, b) for p in sorted(docs.glob("*.md")) for b in re.findall(r"```json\n(.*?)```", p.read_text(), re.S)
    ]
    return [(doc, block) for doc, block in blocks if '"env_class"' in block and "..." not in block]


def test_the_docs_example_rows_include_the_mcp_row():
    assert "tools.md" in {doc for doc, _ in _doc_rows()}


@pytest.mark.parametrize(("doc", "block"), _doc_rows())
def test_example_rows_in_the_docs_validate(doc, block):
    """The mcp row of docs/tools.md was rejected (`missing field 'data_source'`)."""
    validate_row(json.loads(block), f"docs/{doc}")
