"""`reasoning_gym:<task>` and `reasoning_gym:composite`: rows generated in-process from disjoint seeds, answers
extracted per config and scored by the task's own `score_answer`; `thermik synthesize`, eval and 3 RL steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_thermik
from env_sources import eval_then_rl

from thermik.config.schema import EnvConfig
from thermik.tasks.registry import generate_rows, make_env, solve

rg = pytest.importorskip("reasoning_gym")

COMPOSITE = EnvConfig(
    name="reasoning_gym:composite",
    reasoning_gym={"weights": {"leg_counting": 1, "basic_arithmetic": 3}, "task_configs": {"basic_arithmetic": {}}},
)


def _question(row: dict) -> str:
    return row["prompt"][-1]["content"]


def test_train_and_eval_questions_never_overlap_and_rows_are_deterministic() -> None:
    train = generate_rows("reasoning_gym:leg_counting", 300, 0, "train")
    held_out = generate_rows("reasoning_gym:leg_counting", 30, 0, "eval")
    assert len({_question(r) for r in train}) == 300 and len({_question(r) for r in held_out}) == 30
    assert not {_question(r) for r in train} & {_question(r) for r in held_out}
    assert generate_rows("reasoning_gym:leg_counting", 30, 0, "eval") == held_out
    assert generate_rows("reasoning_gym:leg_counting", 30, 1, "eval") != held_out


def test_rows_score_with_the_tasks_own_score_answer() -> None:
    row = generate_rows("reasoning_gym:basic_arithmetic", 1, 0, "eval")[0]
    source = row["reward_spec"]["reasoning_gym"]
    dataset = rg.create_dataset("basic_arithmetic", seed=source["seed"], size=source["size"])
    item = dataset[source["index"]]
    assert _question(row) == item["question"] and row["reward_spec"]["ground_truth"] == item["answer"]
    assert row["prompt"][0] == {"role": "system", "content": rg.utils.SYSTEM_PROMPTS["default"]}
    env = make_env(row["env_class"], reward_spec=row["reward_spec"], extra_info={})
    for text in (f"so <answer>{item['answer']}</answer>", "<answer>12345678</answer>", item["answer"], ""):
        expected = dataset.score_answer(rg.utils.extract_answer(text), item)
        assert env.step(text).reward == expected
    assert env.step(solve(row)[-1]["content"]).reward == 1.0


def test_extraction_is_configured_per_run() -> None:
    options = EnvConfig(reasoning_gym={"extraction": "full", "system_prompt": ""})
    row = generate_rows("reasoning_gym:basic_arithmetic", 1, 0, "eval", options=options)[0]
    assert [m["role"] for m in row["prompt"]] == ["user"]
    answer = row["reward_spec"]["ground_truth"]
    assert solve(row, options)[-1]["content"] == answer  # the SFT target is the task's answer, unwrapped
    full = make_env(row["env_class"], reward_spec=row["reward_spec"], extra_info={}, options=options)
    assert full.step(f"  {answer}\n").reward == 1.0
    tag = make_env(row["env_class"], reward_spec=row["reward_spec"], extra_info={}, options=EnvConfig())
    assert tag.step(answer).reward == 0.0 and tag.step(answer).metadata["answer_found"] is False
    other_tag = EnvConfig(reasoning_gym={"answer_tag": "final"})
    env = make_env(row["env_class"], reward_spec=row["reward_spec"], extra_info={}, options=other_tag)
    assert env.step(f"<final>{answer}</final>").reward == 1.0


def test_composite_mixes_tasks_by_weight_and_scores_each_with_its_own_task() -> None:
    rows = generate_rows("reasoning_gym:composite", 60, 0, "train", options=COMPOSITE)
    sources = [r["data_source"] for r in rows]
    assert set(sources) == {"reasoning_gym/leg_counting", "reasoning_gym/basic_arithmetic"}
    assert sources.count("reasoning_gym/basic_arithmetic") > sources.count("reasoning_gym/leg_counting")
    for row in rows[:6]:
        env = make_env(row["env_class"], reward_spec=row["reward_spec"], extra_info={}, options=COMPOSITE)
        assert env.step(solve(row, COMPOSITE)[-1]["content"]).reward == 1.0
        assert env.step("<answer>not it</answer>").reward == 0.0


def test_unknown_tasks_and_bad_configs_say_what_is_valid() -> None:
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chess'; valid: .*basic_arithmetic"):
        make_env("reasoning_gym:chess", reward_spec={})
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'nope'"):
        generate_rows("reasoning_gym:composite", 2, 0, options=EnvConfig(reasoning_gym={"weights": {"nope": 1}}))
    with pytest.raises(ValueError, match=r"needs env.reasoning_gym.weights"):
        generate_rows("reasoning_gym:composite", 2, 0)
    with pytest.raises(ValueError, match=r"bad task config"):
        generate_rows("reasoning_gym:basic_arithmetic", 2, 0, options=EnvConfig(reasoning_gym={"config": {"x": 1}}))
    with pytest.raises(ValueError, match=r"thermik synthesize --env reasoning_gym:<task>"):
        make_env("reasoning_gym:leg_counting", reward_spec={"ground_truth": "4"})


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ValueError, match=r"pip install 'thermik\[reasoning-gym\]'"):
        make_env("reasoning_gym:leg_counting", reward_spec={})


def test_synthesize_writes_rows_and_answers(tmp_path: Path) -> None:
    done = run_thermik("synthesize", "--env", "reasoning_gym:leg_counting", "--n", "4", "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(x) for x in (tmp_path / "d" / "rows.jsonl").read_text().splitlines()]
    convs = [json.loads(x) for x in (tmp_path / "d" / "sft.jsonl").read_text().splitlines()]
    assert rows == generate_rows("reasoning_gym:leg_counting", 4, 0)
    assert [c["messages"][-1]["content"] for c in convs] == [
        f"<answer>{r['reward_spec']['ground_truth']}</answer>" for r in rows
    ]
    done = run_thermik("synthesize", "--env", "reasoning_gym:chess", "--n", "4", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "leg_counting" in done.stderr and not (tmp_path / "x").exists()


def test_synthesize_takes_the_task_config_from_a_run_config(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[env.reasoning_gym]\nconfig = {min_terms = 2, max_terms = 2, max_digits = 1}\nextraction = "full"\n'
    )
    args = ["--env", "reasoning_gym:basic_arithmetic", "--n", "6", "--config", str(toml), "--out", str(tmp_path / "d")]
    done = run_thermik("synthesize", *args)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(x) for x in (tmp_path / "d" / "rows.jsonl").read_text().splitlines()]
    convs = [json.loads(x) for x in (tmp_path / "d" / "sft.jsonl").read_text().splitlines()]
    assert all(r["reward_spec"]["reasoning_gym"]["config"]["max_terms"] == 2 for r in rows)
    assert [c["messages"][-1]["content"] for c in convs] == [r["reward_spec"]["ground_truth"] for r in rows]
    (tmp_path / "bad.toml").write_text("[env.reasoning_gym]\nextraktion = 1\n")
    done = run_thermik("synthesize", *args[:-2], "--config", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "e"))
    assert done.returncode == 2 and "extraktion" in done.stderr


@pytest.mark.slow
def test_eval_and_rl_run_on_a_reasoning_gym_composite(tiny_model_dir: Path, tmp_path: Path) -> None:
    eval_then_rl(
        tmp_path, tiny_model_dir, "--env.name", "reasoning_gym:composite",
        "--env.reasoning_gym.weights", "{leg_counting = 1, basic_arithmetic = 1}",
        "--env.reasoning_gym.system_prompt", "", "--data.synthetic_train_size", "16",
    )  # fmt: skip


def test_the_smollm2_example_configs_validate() -> None:
    from thermik.config import load_config
    from thermik.config.schema import EvalRunConfig, RunConfig, SFTConfig

    example = Path(__file__).resolve().parents[1] / "examples" / "smollm2_reasoning_gym"
    rl = load_config(RunConfig, ["@", str(example / "common.toml"), "@", str(example / "rl.toml")])
    assert rl.env.name == "reasoning_gym:basic_arithmetic" and rl.env.reasoning_gym.config["max_digits"] == 2
    assert rl.trainer.steps == 12 and rl.eval.size == 100 and rl.eval.temperature == 1.0
    assert load_config(EvalRunConfig, ["@", str(example / "common.toml")]).eval.size == 200
    assert load_config(SFTConfig, ["@", str(example / "sft.toml")]).env.name == rl.env.name
