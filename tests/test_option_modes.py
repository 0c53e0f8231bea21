"""Every option is run or refused: the mode x option table (thermik/config/modes.py), walked cell by cell through the
CLI as a user types it. A refused cell exits 2 with one line naming the option and the mode before anything runs; an
accepted cell's config is accepted and the option has an effect in that mode (checked here, or by the named test)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from thermik.cli import main
from thermik.config import load_config
from thermik.config.modes import MODES, OPTION_RULES, OptionRule, run_mode
from thermik.config.schema import RunConfig
from thermik.runs.loop import rl_plan
from thermik.runs.split.orchestrator import orchestrator_plan

TESTS = Path(__file__).parent
DOCS = TESTS.parent / "docs"
MODE_ARGS = {"local": [], "ray": ["--distributed.enabled", "true"], "split": ["--split"]}


def _eval_every_in_plan(cfg: RunConfig, mode: str) -> None:
    plan = orchestrator_plan(cfg, fresh=True) if mode == "split" else rl_plan(cfg, "")
    assert plan.eval_every == 2


def _selects_ray(cfg: RunConfig, mode: str) -> None:
    assert run_mode(cfg, split=False) == "ray"


# Accepted cells: a check of the option's effect on the loaded config, or the test that shows it at work.
PARITY = "test_guards.py::test_without_the_checksum_the_parity_probe_catches_the_corruption"
EFFECTS: dict[tuple[str, str], Callable[[RunConfig, str], None] | str] = {
    ("record", "local"): "test_replay.py::test_replay_reproduces_the_recorded_updates_bit_for_bit",
    ("eval.every", "local"): _eval_every_in_plan,
    ("eval.every", "ray"): _eval_every_in_plan,
    ("eval.every", "split"): _eval_every_in_plan,  # and test_process_split.py's three-process run evaluates at step 2
    ("trainer.stale_groups", "local"): "test_async.py::test_overtaken_slow_group_is_dropped_or_cancelled_never_trained",
    ("trainer.stale_groups", "ray"): "test_async.py::test_overtaken_slow_group_is_dropped_or_cancelled_never_trained",
    ("guards.parity_every", "local"): PARITY,
    ("guards.parity_every", "ray"): PARITY,
    ("distributed.enabled", "local"): _selects_ray,
    ("distributed.enabled", "ray"): _selects_ray,
    ("inference.backend", "local"): "test_remote_engine.py::test_rl_steps_through_a_thermik_inference_server",
    ("inference.backend", "ray"): "test_remote_engine.py::test_update_weights_pushes_a_state_dict_through_safetensors",
    ("agent.command", "local"): "test_agent_harnesses.py::test_a_real_harness_runs_eval_and_three_rl_steps",
    ("agent.command", "ray"): "test_distributed.py::test_an_agent_harness_trains_on_ray",
    ("agent.command", "split"): "test_agent_modes.py::test_a_harness_trains_in_the_split_mode",
}
CELLS = [(rule, mode) for rule in OPTION_RULES for mode in MODES]


def test_every_cell_of_the_table_is_run_or_refused() -> None:
    for rule in OPTION_RULES:
        assert set(rule.runs) | set(rule.refused) == set(MODES), rule.option
        assert not set(rule.runs) & set(rule.refused), rule.option


@pytest.mark.parametrize(("rule", "mode"), CELLS, ids=[f"{r.option}-{m}" for r, m in CELLS])
def test_a_cell_is_refused_in_one_line_or_accepted_with_an_effect(
    rule: OptionRule, mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [f"--{rule.option}", rule.example, "--output_dir", str(tmp_path)]
    code = main(["rl", *MODE_ARGS[mode], *overrides, "--dry-run"])
    out, err = capsys.readouterr()
    if mode in rule.refused:
        assert code == 2, out
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert rule.option in err and f"{mode} mode" in err, err
        assert not any(tmp_path.iterdir())  # refused before anything was written
        return
    assert code == 0 and not err, err
    cfg = load_config(RunConfig, [a for a in MODE_ARGS[mode] if a != "--split"] + overrides)
    assert rule.asks(cfg)
    effect = EFFECTS[(rule.option, mode)]
    if callable(effect):
        effect(cfg, mode)
    else:
        path, name = effect.split("::")
        assert re.search(rf"^def {name}\(", (TESTS / path).read_text(), re.M), effect


def test_the_table_is_documented() -> None:
    page = (DOCS / "architecture.md").read_text()
    section = page[page.index("## Options by run mode") :]
    for rule in OPTION_RULES:
        assert f"`{rule.option}`" in section, rule.option


def test_the_split_runs_inference_server_takes_inference_num_threads(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found walking the sections: `thermik inference` (the split run's server) dropped inference.num_threads."""
    from thermik.config.schema import ServeConfig
    from thermik.inference.server import run

    seen = {}
    real = run.load_engine

    def load_and_stop(*args: object, **kwargs: object) -> None:
        engine, _ = real(*args, **kwargs)
        seen["threads"] = engine.num_threads
        asyncio.run(engine.close())
        raise SystemExit  # before serving

    monkeypatch.setattr(run, "load_engine", load_and_stop)
    cfg = ServeConfig(model={"path": str(tiny_model_dir)}, inference={"num_threads": 1}, server={"port": 0})
    with pytest.raises(SystemExit):
        run.serve(cfg)
    assert seen == {"threads": 1}
