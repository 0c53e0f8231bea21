"""The split run: `thermik inference` + `thermik trainer` + `thermik orchestrator` from one config.

Fast tests cover the file protocol (atomic publish, the admission rule, waits and their timeouts) against a real
loopback server; the slow one runs the three real processes for three steps.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from conftest import cli_env, short_rl_config, thermik_argv
from safetensors.torch import load_file
from serving import embedded_engine, running, start_thermik_inference

from thermik.assembly.guards import ConsistencyError
from thermik.atomic import write_json_atomic
from thermik.config import ConfigError, dump_toml, load_config
from thermik.config.schema import RunConfig, ServeConfig
from thermik.inference.server.app import build_app
from thermik.inference.shared_weights import is_shared, shared_segment, unlink_segment
from thermik.inference.weights import WEIGHTS_FILE, load_state, write_safetensors
from thermik.rollout.staleness import within_staleness
from thermik.rollout.trajectory import Trajectory
from thermik.runs.split.orchestrator import load_new_weights, setup_orchestrator
from thermik.runs.split.protocol import (
    DONE,
    META_FILE,
    SplitLayout,
    SplitTimeout,
    publish_dir,
    published_steps,
    save_batch,
)
from thermik.runs.split.trainer import setup_trainer, train_split, wait_for_rollouts
from thermik.training.batch import collate
from thermik.training.run_checkpoint import save_checkpoint


def test_admission_rule() -> None:
    # synchronous: step s needs the weights of step s; one step off-policy: of step s - 1
    # within_staleness(weights step, sampled step, k): the orchestrator may sample step s with weights of s - k
    assert within_staleness(0, 0, 0) and within_staleness(3, 3, 0) and not within_staleness(2, 3, 0)
    assert within_staleness(2, 3, 1) and not within_staleness(1, 3, 1) and within_staleness(0, 1, 1)


def _batch(n: int = 2):
    trajs = [
        Trajectory(prompt_ids=[1, 2, 3], response_ids=[4 + i, 5], loss_mask=[1, 1], rollout_logprobs=[-0.5, -1.0],
                   weight_versions=[0, 0], rewards=[0.0, float(i)], group_id=0)
        for i in range(n)
    ]  # fmt: skip
    return collate(trajs, None, 0)


def test_trainer_waits_for_a_complete_rollout_directory(tmp_path: Path) -> None:
    cfg = RunConfig(output_dir=str(tmp_path), split={"wait_timeout_s": 10, "poll_interval_s": 0.02})
    layout = SplitLayout(cfg.run_dir)
    batch = _batch()

    async def scenario() -> tuple[bool, object, dict]:
        waiting = asyncio.create_task(wait_for_rollouts(layout, 0, cfg))
        layout.rollout_dir(0).mkdir(parents=True)  # a half-written directory (no DONE marker) does not count
        save_batch(batch, layout.rollout_dir(0))
        await asyncio.sleep(0.2)
        early = waiting.done()

        def write(directory: Path) -> None:
            save_batch(batch, directory)
            write_json_atomic(directory / META_FILE, {"step": 0, "weight_step": 0})

        publish_dir(layout.rollout_dir(0), write)
        got, meta = await waiting
        return early, got, meta

    early, got, meta = asyncio.run(scenario())
    assert not early
    assert meta == {"step": 0, "weight_step": 0}
    for name in ("input_ids", "attention_mask", "mask", "rollout_logp", "adv", "token_rewards", "group_ids"):
        assert torch.equal(getattr(got, name), getattr(batch, name)), name
    assert (layout.rollout_dir(0) / DONE).is_file()
    assert sorted(p.name for p in layout.rollouts.iterdir()) == ["step_0"]  # no temp debris left


def test_trainer_timeout_names_the_orchestrator(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = short_rl_config(tmp_path, tiny_model_dir, "lonely", "reverse_text", split={"wait_timeout_s": 0.3})
    with pytest.raises(SplitTimeout) as info:
        asyncio.run(train_split(cfg))
    message = str(info.value)
    assert "rollouts of step 0" in message and "thermik orchestrator" in message and "wait_timeout_s" in message


def test_orchestrator_admits_steps_by_published_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    engine, tokenizer = embedded_engine(tiny_model_dir)
    app = build_app(engine, tokenizer, model_name="tiny", api_key=None, max_model_len=256)
    with running(app, on_exit=engine.close) as url:
        cfg = short_rl_config(
            tmp_path, tiny_model_dir, "admit", "reverse_text",
            inference={"base_url": url}, trainer={"max_async_steps": 1},
            split={"wait_timeout_s": 10, "poll_interval_s": 0.02},
        )  # fmt: skip
        state = load_file(str(tiny_model_dir / "model.safetensors"))

        async def scenario() -> tuple[bool, dict[int, int], str]:
            orch = await setup_orchestrator(cfg)
            try:
                await load_new_weights(orch, 1, 1)  # step 1 may use the weights of step 0: no wait
                waiting = asyncio.create_task(load_new_weights(orch, 2, 1))  # needs weights/step_1
                await asyncio.sleep(0.3)
                early = waiting.done()
                publish_dir(orch.layout.weights_dir(1), lambda d: write_safetensors(state, d / WEIGHTS_FILE))
                await waiting
                orch.cfg = cfg.model_copy(update={"split": cfg.split.model_copy(update={"wait_timeout_s": 0.2})})
                with pytest.raises(SplitTimeout) as info:
                    await load_new_weights(orch, 3, 0)
                return early, dict(orch.step_of_version), str(info.value)
            finally:
                await orch.run.close()

        early, versions, message = asyncio.run(scenario())
        assert not early
        assert versions == {0: 0, 1: 1}  # the server loaded weights/step_1 as its version 1
        assert httpx.get(url + "/weight_version").json() == {"weight_version": 1}
        assert "weights of step 3" in message and "thermik trainer" in message

        # A restarted orchestrator goes on from its state file and tells the server the newest weights again.
        write_json_atomic(SplitLayout(cfg.run_dir).orchestrator_state, {"next_step": 2, "sampler": {"position": 8}})

        async def restart() -> tuple[int, int, dict[int, int]]:
            orch = await setup_orchestrator(cfg)
            await orch.run.close()
            return orch.run.start_step, orch.rollout_ctx.sampler.position, orch.step_of_version

        assert asyncio.run(restart()) == (2, 8, {1: 1})  # the server's weight version is the trainer step


def test_a_restarted_trainer_resumes_and_republishes_its_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = short_rl_config(tmp_path, tiny_model_dir, "restart", "reverse_text")
    mode = setup_trainer(cfg)
    save_checkpoint(mode.learner, 2)
    asyncio.run(mode.run.close())
    assert published_steps(mode.layout.weights) == []  # a fresh trainer publishes nothing: step 0 is model.path
    mode = setup_trainer(cfg)
    asyncio.run(mode.run.close())
    learner, layout = mode.learner, mode.layout
    assert mode.run.start_step == 2 and published_steps(layout.weights) == [2]
    published = load_state(layout.weights_dir(2))  # shared memory (the server URL is on this machine)
    assert is_shared(layout.weights_dir(2))
    assert all(torch.equal(published[k], v) for k, v in learner.policy.state_dict().items() if k in published)
    del published
    segment = shared_segment(layout.weights_dir(2))
    assert segment is not None and len(list(segment.parent.glob(segment.name.rsplit("-slot", 1)[0] + "*"))) == 1
    unlink_segment(layout.weights_dir(2))  # publishing step 2 again reused its slot; this frees the run's only one
    assert not segment.exists()


def test_one_file_configures_the_server_too(tmp_path: Path) -> None:
    path = tmp_path / "split.toml"
    path.write_text(dump_toml(RunConfig(server={"port": 8123}, trainer={"steps": 5})))
    cfg = load_config(ServeConfig, ["@", str(path), "--trainer.steps", "7"], {}, shared_with=RunConfig)
    assert cfg.server.port == 8123
    with pytest.raises(ConfigError, match=r"trainer\.stepz"):
        load_config(ServeConfig, ["@", str(path), "--trainer.stepz", "7"], {}, shared_with=RunConfig)
    path.write_text(path.read_text().replace("[trainer]", "[trainer]\nstepz = 3"))
    with pytest.raises(ConfigError, match=r"trainer\.stepz"):
        load_config(ServeConfig, ["@", str(path)], {}, shared_with=RunConfig)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_inference_trainer_orchestrator_run_from_one_config(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "split", "reverse_text", train_rows=32, eval_rows=4,
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 4, "max_async_steps": 1},
        algorithm={"entropy_coef": 0.01},  # a gradient even when every reward of a group is equal
        eval={"before": False, "every": 2}, split={"wait_timeout_s": 120, "poll_interval_s": 0.05},
        monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    config = tmp_path / "split.toml"
    config.write_text(dump_toml(cfg))
    server, url = start_thermik_inference(tmp_path / "server.log", "@", str(config), "--server.port", "0")
    try:
        procs = {
            name: subprocess.Popen(
                thermik_argv(name, "@", str(config), "--inference.base_url", url),
                env=cli_env(), stdout=(tmp_path / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
            )
            for name in ("trainer", "orchestrator")
        }  # fmt: skip
        for name, proc in procs.items():
            assert proc.wait(timeout=300) == 0, (tmp_path / f"{name}.log").read_text()
        # One weight load per step: the server holds the trainer's final weights as version 3.
        assert httpx.get(url + "/weight_version").json() == {"weight_version": 3}
    finally:
        server.terminate()
        server.wait(timeout=30)
    layout = SplitLayout(cfg.run_dir)
    assert published_steps(layout.weights) == [1, 2, 3]
    segments = [shared_segment(layout.weights_dir(s)) for s in (1, 2, 3)]  # the weights went through shared memory
    assert all(seg is not None and not seg.exists() for seg in segments)  # freed once the server held them
    final = load_file(str(cfg.run_dir / "export" / WEIGHTS_FILE))
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(final[k], initial[k]) for k in final), "the trainer's weights did not change"
    orch = [r for r in _records(layout.orchestrator_dir / "metrics.jsonl") if "off_policy/staleness_max" in r]
    assert [r["step"] for r in orch] == [1, 2, 3]
    assert max(r["off_policy/staleness_max"] for r in orch) <= 1
    trained = _records(layout.trainer_dir / "metrics.jsonl")
    assert [r["step"] for r in trained] == [1, 2, 3] and all(r["off_policy/staleness_max"] <= 1 for r in trained)
    assert json.loads((cfg.run_dir / "eval_after.json").read_text())["n"] == 4
    evaluated = [r["step"] for r in _records(layout.orchestrator_dir / "metrics.jsonl") if "eval/n" in r]
    assert evaluated == [2, 3]  # eval.every 2: after step 2 (on the trainer's weights of step 2), and after the last
    assert (cfg.run_dir / "checkpoints" / "step_3").is_dir() and (cfg.run_dir / "export").is_dir()


def test_the_orchestrator_checks_the_weights_the_server_loaded(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The weight checksum guard in a split run: after each admission the server's checksums (GET /weight_checksums)
    are held against the weight file the trainer published; a server that corrupts what it loads stops the run."""
    engine, tokenizer = embedded_engine(tiny_model_dir)
    tensor = "model.layers.0.mlp.down_proj.weight"
    load = engine.update_weights

    async def corrupting_load(source, version=None):
        version = await load(source, version)
        if version == 2:  # the second load lands corrupted
            with torch.no_grad():
                engine.model.state_dict()[tensor].mul_(8.0)
        return version

    engine.update_weights = corrupting_load
    app = build_app(engine, tokenizer, model_name="tiny", api_key=None, max_model_len=256)
    with running(app, on_exit=engine.close) as url:
        sums = httpx.get(url + "/weight_checksums").json()
        assert sums["weight_version"] == 0 and tensor in sums["checksums"]
        cfg = short_rl_config(
            tmp_path, tiny_model_dir, "guarded", "reverse_text", inference={"base_url": url},
            split={"wait_timeout_s": 10, "poll_interval_s": 0.02},
        )  # fmt: skip
        state = load_file(str(tiny_model_dir / "model.safetensors"))

        async def scenario() -> None:
            orch = await setup_orchestrator(cfg)
            try:
                for step in (1, 2):
                    publish_dir(orch.layout.weights_dir(step), lambda d: write_safetensors(state, d / WEIGHTS_FILE))
                    await load_new_weights(orch, step, 0)
                    assert "guards/weight_checksum_s" in orch.guard_metrics  # step 1's healthy load was checked
            finally:
                await orch.run.close()

        with pytest.raises(ConsistencyError, match=rf"weight checksum guard .*first {tensor}"):
            asyncio.run(scenario())
