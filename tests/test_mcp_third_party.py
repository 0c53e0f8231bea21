"""Episodes through MCPToolEnv against real third-party MCP servers from the package index, each in its own
venv under the repo's `.venvs/` (created once by the fixture, reused after; skipped without index access)."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_rollout import ScriptedEngine

from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits, run_episode
from thermik.tasks.registry import make_env
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call

VENV_ROOT = Path(__file__).resolve().parents[1] / ".venvs"
_spec = importlib.util.spec_from_file_location("mcp_venvs", VENV_ROOT.parent / "scripts" / "mcp_venvs.py")
mcp_venvs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mcp_venvs)
KNOWN_SERVERS, VenvError, ensure_venv = mcp_venvs.KNOWN_SERVERS, mcp_venvs.VenvError, mcp_venvs.ensure_venv
install_command, server_command = mcp_venvs.install_command, mcp_venvs.server_command


@pytest.fixture(scope="session")
def server_venvs() -> dict[str, Path]:
    """name -> venv; both installed in parallel on the first run (~25 s measured), then reused."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(KNOWN_SERVERS)) as pool:
        futures = {name: pool.submit(ensure_venv, VENV_ROOT / name, reqs) for name, reqs in KNOWN_SERVERS.items()}
        try:
            venvs = {name: future.result() for name, future in futures.items()}
        except VenvError as exc:
            pytest.skip(f"cannot install third-party MCP servers ({exc}); run: {install_command(VENV_ROOT, '')}")
    print(f"third-party MCP server venvs ready in {time.perf_counter() - t0:.1f}s")
    return venvs


def _run(rows: list[dict], texts_per_row: list[list[str]], options: EnvConfig) -> list:
    """Play each row once with its scripted texts through the agent loop, all episodes concurrently."""
    chat = ChatTokenizer(build_tokenizer())
    limits = LoopLimits(max_turns=4, max_input_length=8192, max_generate_length=512, max_sequence_length=16384)

    pool = MCPPool()

    async def one(row: dict, texts: list[str]):
        spec, extra_info = row["reward_spec"], row["extra_info"]
        env = make_env("mcp", reward_spec=spec, extra_info=extra_info, options=options, pool=pool)
        try:
            return await run_episode(ScriptedEngine(chat, texts), env, chat, row["prompt"], limits, SamplingConfig())
        finally:
            await env.aclose()

    async def go():
        try:
            return await asyncio.gather(*(one(row, texts) for row, texts in zip(rows, texts_per_row, strict=True)))
        finally:
            await pool.aclose()

    return asyncio.run(go())


def test_time_server_episode(server_venvs):
    command = server_command(server_venvs["mcp-server-time"], "mcp-server-time")
    year = datetime.datetime.now(datetime.UTC).year
    row = {
        "prompt": [{"role": "user", "content": "Which year is it in UTC?"}],
        "reward_spec": {
            "ground_truth": {
                "must_call_tool": "get_current_time",
                "tool_sequence": [{"tool": "get_current_time", "parameters": {"timezone": "UTC"}}],
                "answer": str(year),
            }
        },
        "extra_info": {"mcp_servers": ["time"]},
    }
    texts = [format_hermes_tool_call("get_current_time", {"timezone": "UTC"}), f"<answer>{year}</answer>"]
    options = EnvConfig(name="mcp", mcp_servers=[f"time={command} --local-timezone UTC"])
    (traj,) = _run([row], [texts], options)
    observation = json.loads(next(m["content"] for m in traj.messages if m["role"] == "tool"))
    assert observation["timezone"] == "UTC" and observation["datetime"].startswith(str(year))
    assert sum(traj.rewards) == 1.0 and traj.stop_reason == "stop"


def _small_repo(path: Path) -> Path:
    path.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=path, check=True)
    (path / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=path, check=True)
    (path / "notes.txt").write_text("todo\n")
    return path


def test_git_server_episodes_each_get_a_private_copy_of_the_repo(server_venvs, tmp_path):
    repo = _small_repo(tmp_path / "repo")
    entry = {
        "name": "git",
        "command": server_command(server_venvs["mcp-server-git"], "mcp-server-git"),
        "args": ["--repository", "{data_path}"],
        "cwd": "{data_path}",  # the model passes repo_path "." and never needs the copy's path
        "data_path": str(repo),
        "tools": ["git_status", "git_add"],
    }
    truth = {"tool_sequence": [{"tool": "git_status", "parameters": {"repo_path": "."}}], "answer": "notes.txt"}
    row = {
        "prompt": [{"role": "user", "content": "Which file is untracked?"}],
        "reward_spec": {"ground_truth": truth},
        "extra_info": {"mcp_servers": [entry]},
    }
    stage_then_status = [  # this rollout stages the file in its copy ...
        format_hermes_tool_call("git_add", {"repo_path": ".", "files": ["notes.txt"]}),
        format_hermes_tool_call("git_status", {"repo_path": "."}),
        "<answer>notes.txt</answer>",
    ]
    status_only = [format_hermes_tool_call("git_status", {"repo_path": "."}), "<answer>notes.txt</answer>"]
    staged, fresh = _run([row, row], [stage_then_status, status_only], EnvConfig(name="mcp"))
    staged_status = [m["content"] for m in staged.messages if m["role"] == "tool"][-1]
    fresh_status = next(m["content"] for m in fresh.messages if m["role"] == "tool")
    assert "new file:   notes.txt" in staged_status
    assert "Untracked files" in fresh_status and "notes.txt" in fresh_status  # ... which the other never sees
    assert sum(staged.rewards) == 1.0 and sum(fresh.rewards) == 1.0
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == "?? notes.txt\n"  # the original repository is untouched
