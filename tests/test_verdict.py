"""Every command ends with a verdict (runs/verdict.py, docs/reliability.md): work not done exits non-zero with one
line naming the cause and the setting; partial failures warn once per kind or stop; length limits default from
the model's context window, and an explicit one too small for every prompt is refused before any work."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from conftest import run_thermik

from thermik.config.schema import FailuresConfig, RolloutConfig
from thermik.data.dataset import write_rows
from thermik.errors import NothingDoneError, ThermikError
from thermik.models.context_window import context_window
from thermik.rollout.agent_loop import LoopLimits
from thermik.runs.split.protocol import SplitLayout, published_steps
from thermik.runs.verdict import PromptLimit, eval_verdict, rl_verdict
from thermik.tasks.registry import generate_rows


def _one_line(stderr: str, command: str) -> str:
    """The command's one error line (`thermik CMD: ...`); no traceback."""
    lines = [x for x in stderr.splitlines() if x.startswith(f"thermik {command}: ")]
    assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
    return lines[0]


def _limit(max_input_length: int = 0) -> PromptLimit:
    rollout = RolloutConfig(max_input_length=max_input_length)
    return PromptLimit.of(LoopLimits.from_config(rollout, 1, 2048), rollout)


def test_lengths_default_from_the_models_context_window(tiny_model_dir: Path) -> None:
    from thermik.models.loading import load_tokenizer

    window = context_window(tiny_model_dir, load_tokenizer(tiny_model_dir))
    assert window == 2048  # the preset's max_position_embeddings
    limits = LoopLimits.from_config(RolloutConfig(), 1, window)
    assert (limits.max_sequence_length, limits.max_input_length) == (2048, 2048 - 64)
    explicit = LoopLimits.from_config(RolloutConfig(max_input_length=384, max_sequence_length=640), 1, window)
    assert (explicit.max_sequence_length, explicit.max_input_length) == (640, 384), "explicit settings are kept"
    with pytest.raises(ThermikError, match=r"exceed the model's context window \(2048\)"):
        LoopLimits.from_config(RolloutConfig(max_input_length=4000), 1, window)


def test_shares_warn_once_per_kind_with_count_and_cause_and_stop_when_configured(capsys) -> None:
    verdict = rl_verdict(FailuresConfig(), _limit(512))
    step = {"problems/played": 2.0, "problems/skipped": 6.0, "problems/longest_skipped": 559.0}
    verdict.observe(step, "step 1")
    verdict.observe(step, "step 2")
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert warnings == [
        "thermik: warning: step 1: 6 of 8 problems skipped (75% > failures.max_skipped_share = 10%): prompts of up "
        "to 559 tokens exceed rollout.max_input_length = 512; raise it (the model allows 1984)"
    ]
    verdict.observe({"episodes/played": 8.0, "episodes/overlong": 8.0}, "step 3")
    assert "8 of 8 episodes failed" in capsys.readouterr().err, "another kind warns too"
    stopping = eval_verdict(FailuresConfig(stop=True), _limit())
    with pytest.raises(ThermikError, match=r"stopped: eval: 6 of 8 problems skipped .*context window \(2048\)"):
        stopping.observe(step, "eval")


def test_conclude_names_the_cause_of_nothing_done() -> None:
    verdict = eval_verdict(FailuresConfig(max_skipped_share=1.0), _limit(512))
    verdict.observe({"problems/played": 0.0, "problems/skipped": 16.0, "problems/longest_skipped": 559.0})
    with pytest.raises(NothingDoneError) as e:
        verdict.conclude()
    assert str(e.value) == (
        "all 16 problems skipped: prompts of up to 559 tokens exceed rollout.max_input_length = 512; raise it (the "
        "model allows 1984)"
    )
    trained = rl_verdict(FailuresConfig(), _limit())
    trained.observe({"problems/played": 4.0, "episodes/played": 8.0, "batch/trained_tokens": 0.0})
    trained.observe({"problems/played": 4.0, "episodes/played": 8.0, "batch/trained_tokens": 12.0})
    trained.conclude()  # one batch trained is enough


def _reverse_rows(path: Path, n: int, split: str, repeat: int = 1) -> Path:
    rows = generate_rows("reverse_text", n, 0, split=split)
    for row in rows:
        row["prompt"][-1]["content"] *= repeat
    return write_rows(path, rows)


def test_eval_limit_too_small_for_every_prompt_is_refused_before_any_episode(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = _reverse_rows(tmp_path / "eval.jsonl", 4, "eval")
    res = run_thermik(
        "eval", "--model.path", str(tiny_model_dir), "--env.name", "reverse_text", "--data.eval_path", str(rows),
        "--rollout.max_input_length", "8", "--rollout.max_sequence_length", "200", "--output_dir", str(tmp_path),
        "--name", "small",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_line(res.stderr, "eval")
    assert "every prompt is too long" in line and "exceed rollout.max_input_length = 8; raise it" in line, line
    assert not (tmp_path / "small" / "trajectories").exists(), "no episode was played"


def test_eval_that_scored_nothing_exits_3_with_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A chat endpoint whose context holds none of the prompts: every problem skipped, exit 3, one line."""
    from serving import embedded_engine, running

    from thermik.inference.server.app import build_app

    rows = _reverse_rows(tmp_path / "eval.jsonl", 3, "eval")
    engine, tokenizer = embedded_engine(tiny_model_dir)
    with running(build_app(engine, tokenizer, "tiny", max_model_len=16), engine.close) as url:
        res = run_thermik(
            "eval", "--policy.base_url", f"{url}/v1", "--env.name", "reverse_text", "--data.eval_path", str(rows),
            "--output_dir", str(tmp_path), "--name", "api",
        )  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    assert _one_line(res.stderr, "eval") == (
        "thermik eval: all 3 problems skipped: the policy's endpoint refused the prompts as longer than its context; "
        "use a longer-context model"
    )


def _rl_args(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    """One step on one prompt that is too long (the first 8 rows, measured at the start, fit)."""
    train = tmp_path / "train.jsonl"
    rows = generate_rows("reverse_text", 8, 0, split="train") + generate_rows("reverse_text", 400, 1, split="train")
    for row in rows[8:]:
        row["prompt"][-1]["content"] *= 12
    write_rows(train, rows)
    return [
        "rl", "--model.path", str(model), "--env.name", "reverse_text", "--data.train_path", str(train),
        "--data.eval_path", str(_reverse_rows(tmp_path / "eval.jsonl", 2, "eval")), "--rollout.max_input_length",
        "128", "--rollout.max_generate_length", "8", "--rollout.max_sequence_length", "160", "--trainer.steps", "1",
        "--trainer.prompts_per_step", "1", "--trainer.group_size", "2", "--eval.before", "false", "--eval.size", "2",
        "--monitor.progress", "false", "--output_dir", str(tmp_path), *extra,
    ]  # fmt: skip


def test_rl_that_trained_nothing_exits_3_after_warning_at_the_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = run_thermik(*_rl_args(tiny_model_dir, tmp_path, "--name", "none"), timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "thermik: warning: step 1: 1 of 1 problems skipped (100% > failures.max_skipped_share = 10%)" in res.stderr
    line = _one_line(res.stderr, "rl")
    assert line.startswith("thermik rl: all 1 problems skipped: prompts of up to "), line
    assert line.endswith("exceed rollout.max_input_length = 128; raise it (the model allows 2040)"), line
    steps = [json.loads(x) for x in (tmp_path / "none" / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["batch/trained_tokens"] == 0.0 and steps[0]["problems/skipped"] == 1.0


@pytest.mark.slow
def test_split_run_whose_step_played_nothing_publishes_an_empty_batch_and_exits_3(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The split orchestrator's step with every prompt skipped: the trainer gets an empty batch (its update skipped,
    instead of waiting for a batch that never comes) and the run ends with the orchestrator's verdict."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ["--server.port", str(port), "--inference.base_url", f"http://127.0.0.1:{port}"]
    args = _rl_args(tiny_model_dir, tmp_path, "--name", "split", *server)
    res = run_thermik(*args[:1], "--split", *args[1:], timeout=300)
    assert res.returncode != 0, res.stderr[-3000:]
    assert "thermik orchestrator: all 1 problems skipped: prompts of up to " in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    layout = SplitLayout(tmp_path / "split")
    assert published_steps(layout.weights) == [1]  # the trainer took the empty batch and went on


def test_rl_stops_at_the_step_when_failures_stop(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = run_thermik(*_rl_args(tiny_model_dir, tmp_path, "--name", "stop", "--failures.stop", "true"), timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_line(res.stderr, "rl")
    assert line.startswith("thermik rl: stopped: step 1: 1 of 1 problems skipped (100% > "), line
    assert "failures.stop = false warns and continues" in line
    assert not (tmp_path / "stop" / "eval_after.json").exists(), "the run stopped at the step"


def test_sft_whose_conversations_are_all_cut_before_a_trained_token_exits_3(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "sft.jsonl"
    conversation = [{"role": "user", "content": "reverse: abcdefgh " * 4}, {"role": "assistant", "content": "x"}]
    data.write_text("".join(json.dumps({"messages": conversation}) + "\n" for _ in range(3)))
    res = run_thermik(
        "sft", "--model.path", str(tiny_model_dir), "--train_path", str(data), "--max_length", "8",
        "--max_steps", "2", "--eval_every", "0", "--progress", "false", "--output_dir", str(tmp_path),
    )  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    line = _one_line(res.stderr, "sft")
    assert line.startswith("thermik sft: no conversation left to train on: all 3 cut: max_length = 8 cuts them"), line
    assert line.endswith("; raise max_length"), line
    assert not (tmp_path / "sft" / "model").exists()


@pytest.mark.slow
def test_letter_counting_evaluates_and_trains_with_default_lengths(tiny_model_dir: Path, tmp_path: Path) -> None:
    """reasoning_gym's letter_counting prompts (~560 tokens) exceeded the old fixed max_input_length of 512."""
    common = ["--model.path", str(tiny_model_dir), "--env.name", "reasoning_gym:letter_counting"]
    common += ["--output_dir", str(tmp_path), "--eval.size", "4"]
    ev = run_thermik("eval", *common, "--name", "eval", timeout=600)
    assert ev.returncode == 0, ev.stderr[-3000:]
    scored = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert scored["problems"] == 4 and scored["skipped"] == 0
    rl = run_thermik(
        "rl", *common, "--name", "rl", "--trainer.steps", "3", "--trainer.prompts_per_step", "2",
        "--trainer.group_size", "2", "--eval.before", "false", "--monitor.progress", "false", timeout=900,
    )  # fmt: skip
    assert rl.returncode == 0, rl.stderr[-3000:]
    steps = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "batch/trained_tokens" in s]
    assert len(trained) == 3 and all(s["batch/trained_tokens"] > 0 and s["problems/skipped"] == 0 for s in trained)


def test_mcp_server_with_big_tool_schemas_fails_loudly_or_runs_without_them(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Tool schemas longer than the model's context: one line naming the window and env.render_tools; without the
    schemas rendered the same evaluation scores its problems."""
    import sys

    rows = [{**r, "env_class": "mcp", "extra_info": {}} for r in generate_rows("calculator", 2, seed=2, split="eval")]
    write_rows(tmp_path / "rows.jsonl", rows)
    server = f"archive={sys.executable} {Path(__file__).parent / 'fixtures' / 'big_schema_server.py'} --tools 12"
    args = [
        "eval", "--model.path", str(tiny_model_dir), "--env.name", "mcp", "--env.mcp_servers", json.dumps([server]),
        "--data.eval_path", str(tmp_path / "rows.jsonl"), "--rollout.max_generate_length", "8",
        "--output_dir", str(tmp_path),
    ]  # fmt: skip
    refused = run_thermik(*args, "--name", "tools", timeout=300)
    assert refused.returncode == 1, refused.stderr[-3000:]
    line = _one_line(refused.stderr, "eval")
    assert "exceed the model's context window (2048) less rollout.max_generate_length (8)" in line, line
    assert line.endswith("or set env.render_tools = false"), line
    plain = run_thermik(*args, "--name", "plain", "--env.render_tools", "false", timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert json.loads((tmp_path / "plain" / "eval.json").read_text())["problems"] == 2
