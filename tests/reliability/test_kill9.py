"""Kill -9 of `thermik rl` during generation, the update, a checkpoint write and an MCP call, each
followed by a resume; the end state must equal an uninterrupted seeded run (kill_suite.py holds the machinery).

Bounded in CI: one kill per phase in one chain (about 2 minutes on 2 shared cores). `RELIABILITY_FULL=1` runs
RELIABILITY_KILLS kills (default 20) and the Ray mode's 5 kills (each start brings up a local Ray: minutes, too long
for CI's budget; checkpoints on Ray are covered in CI by tests/test_distributed.py);
`python tests/reliability/kill_suite.py --kills 20` prints the figures.
"""

from __future__ import annotations

import os

import pytest
from conftest import run_thermik
from kill_suite import PHASES, STEPS, rl_args, run_suite, write_data

from thermik.monitor.metrics import read_metrics


def assert_resumes_equal_an_uninterrupted_run(figures: dict, kills: int, atol: float = 0.0) -> None:
    """Every kill done, no partial checkpoint, no leaked server, no sample lost or repeated, every step logged once,
    and the resumed runs' weights and metrics within `atol` of the uninterrupted run's (0: bit for bit)."""
    print(figures)
    assert figures["kills"] == kills
    assert all(figures["kills_by_phase"][p] >= 1 for p in PHASES), figures["kills_by_phase"]
    assert figures["corrupt_checkpoints"] == 0 and figures["leaked_mcp_servers"] == 0
    assert figures["samples_lost"] == 0 and figures["samples_repeated"] == 0
    assert figures["steps_logged_ok"], f"every step 1..{STEPS} logged exactly once"
    assert figures["weights_max_abs_diff"] <= atol
    assert atol > 0 or figures["weights_identical_chains"] == figures["chains"], figures["weights_max_abs_diff"]
    assert figures["metrics_max_abs_diff"] <= atol
    assert figures["resumed_runs_matching"] == figures["chains"]


@pytest.mark.slow
def test_kill9_at_random_moments_then_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    full = os.environ.get("RELIABILITY_FULL") == "1"
    kills = int(os.environ.get("RELIABILITY_KILLS", "20")) if full else len(PHASES)
    assert_resumes_equal_an_uninterrupted_run(run_suite(tiny_model_dir, tmp_path, kills, seed=18), kills)


@pytest.mark.slow
def test_a_start_from_scratch_drops_the_metrics_of_an_earlier_attempt(tiny_model_dir, tmp_path):
    """Found by the suite: a run killed before its first checkpoint restarted from scratch and logged its steps
    a second time after the killed attempt's."""
    write_data(tmp_path)
    args = [
        *rl_args(tiny_model_dir, tmp_path, "twice"),
        "--trainer.steps",
        "2",
        "--checkpoint.resume",
        "false",
        "--env.name",
        "reverse_text",
    ]
    for _ in range(2):
        proc = run_thermik(*args, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(tmp_path / "twice") if "time/step" in r]
    assert steps == [1, 2]


RAY_KILLS = 5
RAY_WEIGHTS_ATOL = 0.0  # float32, the same seeded sampling on the engine actor: a resumed run equals bit for bit


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(
    os.environ.get("RELIABILITY_FULL") != "1", reason="minutes of Ray starts: RELIABILITY_FULL=1 runs it"
)
def test_kill9_on_ray_then_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """The same suite in the Ray mode (one trainer worker, one engine actor): 5 kills of the driver at random moments
    of generation, the update on the worker, rank 0's checkpoint write and an MCP call, each followed by a resume."""
    pytest.importorskip("ray")
    figures = run_suite(tiny_model_dir, tmp_path, RAY_KILLS, seed=18, ray=True)
    assert_resumes_equal_an_uninterrupted_run(figures, RAY_KILLS, RAY_WEIGHTS_ATOL)
