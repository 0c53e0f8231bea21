"""An agent harness as a process of its own (agents/process.py): its result, and every way it can misbehave
failing its run with a reason while leaving no process behind. Real subprocesses; psutil checks for leaks."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from thermik.agents.process import Client, run_harness
from thermik.config.agent import AgentConfig

CLIENT = Client(
    "http://127.0.0.1:9/episodes/e1/v1", "key-e1", "thermik-policy", "http://127.0.0.1:9/episodes/e1/reward"
)
TASK = {"prompt": [{"role": "user", "content": "2+2?"}], "reward_spec": {"ground_truth": "4"}}


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _run(cfg: AgentConfig) -> tuple:
    before = _children()
    outcome = asyncio.run(run_harness(cfg, TASK, CLIENT))
    return outcome, _children() - before


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "harness.py"
    path.write_text(textwrap.dedent(body))
    return f"{sys.executable} {path}"


def test_command_gets_the_client_and_task_and_its_last_json_line_is_the_result(tmp_path: Path) -> None:
    command = _script(
        tmp_path,
        """
        import json, os
        print("log line")
        print(json.dumps({"reward": 0.5}))
        task = json.loads(os.environ["THERMIK_TASK"])
        print(json.dumps({"seen": [os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"],
                                   os.environ["OPENAI_MODEL"], os.environ["EPISODE_REWARD_URL"],
                                   task["reward_spec"]["ground_truth"]]}))
        print("done")
    """,
    )
    outcome, leaked = _run(AgentConfig(command=command))
    assert outcome.failure == "" and leaked == set()
    assert outcome.result == {"seen": [CLIENT.base_url, CLIENT.api_key, CLIENT.model, CLIENT.reward_url, "4"]}


def test_the_result_file_wins_over_stdout(tmp_path: Path) -> None:
    command = _script(
        tmp_path,
        """
        import json, os
        open(os.environ["THERMIK_RESULT_FILE"], "w").write(json.dumps({"answer": "4"}))
        print(json.dumps({"reward": 0.0}))
    """,
    )
    outcome, _ = _run(AgentConfig(command=command))
    assert outcome.result == {"answer": "4"}


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_entrypoint_sync_or_async_is_called_with_task_and_client(tmp_path: Path, kind: str) -> None:
    (tmp_path / "my_agent.py").write_text(
        textwrap.dedent(f"""
        {kind} run(task, client):
            return {{"reward": 1.0, "metrics": {{"model": client["model"], "gt": task["reward_spec"]["ground_truth"]}}}}
    """)
    )
    outcome, leaked = _run(AgentConfig(entrypoint="my_agent:run", cwd=str(tmp_path)))
    assert outcome.failure == "" and leaked == set()
    assert outcome.result == {"reward": 1.0, "metrics": {"model": "thermik-policy", "gt": "4"}}


def test_entrypoint_that_raises_is_a_crash_naming_the_error(tmp_path: Path) -> None:
    (tmp_path / "bad_agent.py").write_text("def run(task, client):\n    raise RuntimeError('tool server gone')\n")
    outcome, leaked = _run(AgentConfig(entrypoint="bad_agent:run", cwd=str(tmp_path)))
    assert outcome.failure == "crash" and "tool server gone" in outcome.detail and leaked == set()


def test_non_zero_exit_is_a_crash_with_its_stderr(tmp_path: Path) -> None:
    outcome, leaked = _run(AgentConfig(command="echo 'openai.NotFoundError: 404' >&2; exit 3"))
    assert outcome.failure == "crash" and "code 3" in outcome.detail and "404" in outcome.detail
    assert leaked == set()


def test_a_hang_is_killed_at_the_timeout_with_its_children(tmp_path: Path) -> None:
    command = _script(
        tmp_path,
        """
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(60)
    """,
    )
    start = time.monotonic()
    outcome, leaked = _run(AgentConfig(command=command, timeout_s=1.0))
    assert outcome.failure == "timeout" and "agent.timeout_s = 1 s" in outcome.detail
    assert time.monotonic() - start < 10 and leaked == set()


def test_processes_left_behind_are_killed_and_fail_the_run(tmp_path: Path) -> None:
    """A plain background child and one that left the process group (setsid): both found and killed."""
    command = _script(
        tmp_path,
        """
        import json, subprocess, sys, time
        plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        time.sleep(0.5)
        print(json.dumps({"reward": 1.0, "pids": [plain.pid, daemon.pid]}))
    """,
    )
    outcome, leaked = _run(AgentConfig(command=command))
    assert outcome.failure == "left_processes" and outcome.result["reward"] == 1.0
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in outcome.result["pids"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in outcome.result["pids"]) and leaked == set()


def test_a_cancelled_episode_kills_its_harness(tmp_path: Path) -> None:
    async def cancel_after_start() -> None:
        task = asyncio.ensure_future(run_harness(AgentConfig(command="sleep 60"), TASK, CLIENT))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    before = _children()
    asyncio.run(cancel_after_start())
    assert _children() - before == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent.entrypoint", "my_agent.run"], "expected 'pkg.module:function'"),
        (["--agent.entrypoint", "a:run", "--agent.command", "python a.py"], "exclude each other"),
        (["--agent.timeout_s", "0"], "agent.timeout_s"),
    ],
)
def test_a_bad_agent_setting_is_refused_naming_it(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    from thermik.cli import main

    assert main(["rl", *args, "--output_dir", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# agent.preload: the entrypoint's module imported once by a fork server, one forked process per episode.


def _runs(cfg: AgentConfig, n: int) -> tuple[list, set[int]]:
    async def episodes() -> list:
        return list(await asyncio.gather(*(run_harness(cfg, TASK, CLIENT) for _ in range(n))))

    before = _children()
    outcomes = asyncio.run(episodes())
    return outcomes, _children() - before


def test_preload_imports_once_and_forks_a_process_per_episode(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(
        textwrap.dedent(f"""
        import asyncio, os
        with open({str(tmp_path / "imports")!r}, "a") as f:
            f.write("imported\\n")
        print("import-time output goes to the server's stderr")
        async def run(task, client):
            await asyncio.sleep(0.2)
            print("episode log")
            return {{"pid": os.getpid(), "sid": os.getsid(0), "model": client["model"],
                     "gt": task["reward_spec"]["ground_truth"]}}
    """)
    )
    outcomes, leaked = _runs(AgentConfig(entrypoint="my_agent:run", cwd=str(tmp_path), preload=True), 4)
    assert [o.failure for o in outcomes] == [""] * 4 and leaked == set()
    assert (tmp_path / "imports").read_text() == "imported\n"
    pids = {o.result["pid"] for o in outcomes}
    assert len(pids) == 4 and all(o.result["sid"] == o.result["pid"] for o in outcomes)
    assert all(o.result["model"] == "thermik-policy" and o.result["gt"] == "4" for o in outcomes)


@pytest.mark.parametrize(
    ("body", "reason", "said"),
    [
        ("raise RuntimeError('tool server gone')", "crash", "tool server gone"),
        ("import sys; print('bye', file=sys.stderr); sys.exit(3)", "crash", "code 3"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "crash", "signal 9"),
    ],
)
def test_preload_an_episode_that_fails_fails_alone(tmp_path: Path, body: str, reason: str, said: str) -> None:
    (tmp_path / "my_agent.py").write_text(
        f"def run(task, client):\n    if task.get('bad'):\n        {body}\n    return 1.0\n"
    )
    cfg = AgentConfig(entrypoint="my_agent:run", cwd=str(tmp_path), preload=True)

    async def episodes() -> list:
        bad = run_harness(cfg, {**TASK, "bad": True}, CLIENT)
        return list(await asyncio.gather(bad, run_harness(cfg, TASK, CLIENT)))

    before = _children()
    bad, good = asyncio.run(episodes())
    assert bad.failure == reason and said in bad.detail and _children() - before == set()
    assert good.failure == "" and good.result == 1.0


def test_preload_a_hang_is_killed_at_the_timeout_with_its_children(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(
        textwrap.dedent("""
        import subprocess, sys, time
        def run(task, client):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            time.sleep(60)
    """)
    )
    start = time.monotonic()
    (outcome,), leaked = _runs(AgentConfig(entrypoint="my_agent:run", cwd=str(tmp_path), preload=True, timeout_s=1), 1)
    assert outcome.failure == "timeout" and time.monotonic() - start < 10 and leaked == set()


def test_preload_a_module_that_fails_to_import_fails_each_episode_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text("raise ImportError('no module named agents')\n")
    outcomes, leaked = _runs(AgentConfig(entrypoint="my_agent:run", cwd=str(tmp_path), preload=True), 2)
    assert [o.failure for o in outcomes] == ["crash", "crash"] and leaked == set()
    assert all("fork server" in o.detail and "no module named agents" in o.detail for o in outcomes)
