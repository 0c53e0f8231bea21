"""`thermik rl @ split.toml --split`: one command starts the inference server, the trainer and the orchestrator, streams
their logs with a prefix, and when one of them dies stops the other two, naming it."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import cli_env, short_rl_config, thermik_argv

from thermik.config import dump_toml
from thermik.runs.split_protocol import SplitLayout, published_steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_killing_the_trainer_stops_all_three_naming_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    port = _free_port()
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "split", "reverse_text", train_rows=32, eval_rows=2,
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 4}, algorithm={"entropy_coef": 0.01},
        eval={"before": False}, split={"wait_timeout_s": 120, "poll_interval_s": 0.05},
        inference={"base_url": f"http://127.0.0.1:{port}"}, server={"port": port},
        monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    config = tmp_path / "split.toml"
    config.write_text(dump_toml(cfg))
    launcher = subprocess.Popen(
        thermik_argv("rl", "@", str(config), "--split"),
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    layout = SplitLayout(cfg.run_dir)
    try:
        deadline = time.monotonic() + 300
        while not published_steps(layout.weights) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.02)  # until the trainer has published the weights of step 1
        pids = {m[1]: int(m[2]) for m in re.finditer(r"\[split\] started (\w+) \(pid (\d+)\)", "".join(lines))}
        assert set(pids) == {"inference", "trainer", "orchestrator"}, "".join(lines)
        assert published_steps(layout.weights) == [1], "".join(lines)
        psutil.Process(pids["trainer"]).send_signal(signal.SIGKILL)  # mid-run: step 2 of 3
        code = launcher.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = "".join(lines)
    assert code != 0
    assert re.search(r"the trainer process \(pid \d+\) killed by SIGKILL.*stopping (inference, orchestrator)", out), out
    prefixed = {line.split("]")[0] + "]" for line in lines if line.startswith("[")}
    assert {"[inference]", "[trainer]", "[split]"} <= prefixed, out  # logs are streamed with their prefix
    gone = [name for name, pid in pids.items() if not psutil.pid_exists(pid) or _zombie(pid)]
    assert sorted(gone) == ["inference", "orchestrator", "trainer"], out
    assert max(published_steps(layout.weights)) < 3  # the run did not finish


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
