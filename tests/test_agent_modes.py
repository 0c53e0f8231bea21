"""An agent harness (`agent.entrypoint`: the openai SDK tool loop of tests/harnesses/openai_loop.py, thermik's own
interpreter) trains in the split mode: the orchestrator serves each episode's capture endpoint over the `thermik
inference` server and runs the harness beside it. The Ray mode's run is in tests/test_distributed.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_thermik, short_rl_config
from serving import free_port

from thermik.config import dump_toml

HARNESSES = Path(__file__).resolve().parent / "harnesses"
AGENT = {"entrypoint": "openai_loop:run", "cwd": str(HARNESSES), "timeout_s": 120, "max_turns": 6}


def agent_steps(metrics: Path) -> list[dict]:
    """The RL steps' metrics lines, each checked to have trained on harness episodes that all succeeded."""
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [x for x in lines if "reward/mean" in x]
    for s in steps:
        assert s["batch/trained_tokens"] > 0 and not s.get("episodes/agent_failed"), s
        assert s["episodes/played"] == 4 and s["num_turns/mean"] >= 2, s  # env.max_turns is 1: the harness played
    return steps


@pytest.mark.slow
def test_a_harness_trains_in_the_split_mode(tmp_path: Path, tiny_model_dir: Path) -> None:
    port = free_port()
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "split", "reverse_text", train_rows=8, eval_rows=2,
        trainer={"steps": 2, "prompts_per_step": 2, "group_size": 2}, eval={"before": False},
        rollout={"max_generate_length": 8, "max_input_length": 384, "max_sequence_length": 420},
        split={"wait_timeout_s": 240, "poll_interval_s": 0.05}, agent=AGENT,
        inference={"base_url": f"http://127.0.0.1:{port}"}, server={"port": port},
        monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    config = tmp_path / "split.toml"
    config.write_text(dump_toml(cfg))
    done = run_thermik("rl", "@", str(config), "--split", timeout=420)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = agent_steps(cfg.run_dir / "orchestrator" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
