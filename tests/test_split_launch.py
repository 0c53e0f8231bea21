"""`thermik rl @ split.toml --split`: one command starts the inference server, the trainer and the orchestrator, streams
their logs with a prefix, and when one of them dies stops the other two, naming it. A killed launcher leaves none
of them (nor what they started) running, and a taken port is named before anything starts."""

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
from conftest import cli_env, run_thermik, short_rl_config, thermik_argv
from orphans import left_after_kill
from serving import free_port

from thermik.config import dump_toml
from thermik.runs.split.launch import torch_threads
from thermik.runs.split.protocol import SplitLayout, published_steps


@pytest.mark.slow
def test_killing_the_trainer_stops_all_three_naming_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    port = free_port()
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


def _split_config(tmp_path: Path, model_dir: Path, port: int, steps: int = 3) -> Path:
    cfg = short_rl_config(
        tmp_path, model_dir, "split", "reverse_text", train_rows=32, eval_rows=2,
        trainer={"steps": steps, "prompts_per_step": 2, "group_size": 4}, eval={"before": False},
        split={"wait_timeout_s": 120, "poll_interval_s": 0.05},
        inference={"base_url": f"http://127.0.0.1:{port}"}, server={"port": port},
        monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    config = tmp_path / "split.toml"
    config.write_text(dump_toml(cfg))
    return config


@pytest.mark.slow
def test_a_killed_launcher_leaves_nothing_running(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`kill -9` of the launcher mid-run: the server, the trainer and the orchestrator are gone within 10 s (what
    they start goes with them: tests/test_lifetime.py), and the server's port is free again."""
    port = free_port()
    config = _split_config(tmp_path, tiny_model_dir, port, steps=50)
    log = tmp_path / "launcher.log"
    launcher = subprocess.Popen(
        thermik_argv("rl", "@", str(config), "--split"), env=cli_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    rollouts = SplitLayout(tmp_path / "split").rollouts
    procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not published_steps(rollouts) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.1)  # until all three run: the orchestrator has made a step's rollouts on the server
        assert published_steps(rollouts), log.read_text()
        procs = psutil.Process(launcher.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in procs]
        for name in ("inference", "trainer", "orchestrator"):
            assert any(name in c for c in commands), "\n".join(commands)
    finally:
        left = left_after_kill(launcher, procs)
    assert left == []
    assert _port_freed(port, within_s=10.0), f"port {port} still in use 10 s after the launcher's death"


def _port_freed(port: int, within_s: float) -> bool:
    """Whether nothing listens on `port` within `within_s` (the kernel closes a killed server's socket as it
    tears the process down, which may finish just after the process is gone from the process table)."""
    deadline = time.monotonic() + within_s
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may wait in TIME_WAIT
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
        time.sleep(0.2)


def test_a_taken_port_is_named_before_anything_starts(tmp_path: Path, tiny_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _split_config(tmp_path, tiny_model_dir, port)
        for command in (["rl", "@", str(config), "--split"], ["inference", "@", str(config)]):
            result = run_thermik(*command, timeout=300)
            assert result.returncode == 1, result.stdout + result.stderr
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
            assert "address already in use" in result.stderr and "--server.port" in result.stderr, result.stderr
            assert "[split] started" not in result.stdout and "Application shutdown" not in result.stdout


def test_a_base_url_that_misses_the_server_is_named_before_anything_starts(tmp_path: Path, tiny_model_dir: Path):
    """inference.base_url on another port than server.port: the orchestrator would wait for a server that is not
    there; the launcher refuses it in one line instead."""
    port = free_port()
    config = _split_config(tmp_path, tiny_model_dir, port)
    result = run_thermik("rl", "@", str(config), "--split", "--server.port", str(free_port()), timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "does not reach the server this run starts on server.port" in result.stderr, result.stderr
    assert "[split] started" not in result.stdout


def test_asynchronous_split_processes_share_the_cores_instead_of_each_taking_all() -> None:
    """Decoding and training overlap: on 2 cores the server and the trainer get one torch thread each (4 spinning
    OpenMP threads on 2 cores stall each other); synchronous runs and a user's OMP_NUM_THREADS keep the default."""
    assert torch_threads(True, {}, 2) == {"inference": 1, "trainer": 1, "orchestrator": 1}
    assert torch_threads(True, {}, 16) == {"inference": 8, "trainer": 8, "orchestrator": 1}
    assert torch_threads(True, {}, 1) == {"inference": 1, "trainer": 1, "orchestrator": 1}
    assert torch_threads(False, {}, 2) == {}
    assert torch_threads(True, {"OMP_NUM_THREADS": "2"}, 2) == {}
