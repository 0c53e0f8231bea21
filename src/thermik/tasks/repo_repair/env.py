"""Repo repair: fix a Python repository with bash, read_file, edit_file, search and run_tests, then `finish`.

Row: `reward_spec.ground_truth` is a SWE-bench record (instance_id, repo, base_commit, patch, test_patch,
FAIL_TO_PASS, PASS_TO_PASS, problem_statement); `extra_info.repo_path` is the repository on disk, at base_commit.
Each episode works on a fresh copy in the sandbox; the tools are served by a per-episode MCP server
(`env.repo_repair.tools = "mcp"`) or called in-process. When the model calls `finish` (or stops calling tools, or
runs out of turns) the test files are restored from the task and FAIL_TO_PASS + PASS_TO_PASS run: reward 1 only if
it finished and all pass (`scoring = "fraction"`: the fraction passing, after finish), minus `step_penalty` per
turn. `mask_truncated` zeroes the loss of episodes that end without finish.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.tool_use import answer_calls
from thermik.tasks.repo_repair.grade import grade
from thermik.tasks.repo_repair.sandbox import Sandbox
from thermik.tasks.repo_repair.server import limits_of, server_spec
from thermik.tasks.repo_repair.tools import SCHEMAS, RepoTools, ToolFailure, is_test_path
from thermik.tools.mcp_pool import MCPPool, ToolResult, ToolSession
from thermik.tools.parsers import ToolCall, get_parser

RECORD_KEYS = ("instance_id", "base_commit", "FAIL_TO_PASS", "PASS_TO_PASS", "problem_statement")


class RepoRepairEnv(Env):
    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        record = reward_spec.get("ground_truth")
        if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
            raise ValueError(f"repo_repair: reward_spec['ground_truth'] must be a SWE-bench record with {RECORD_KEYS}")
        repo = extra_info.get("repo_path")
        if not repo or not Path(repo, ".git").exists():
            raise ValueError(f"repo_repair: extra_info['repo_path'] must be a git repository on disk, got {repo!r}")
        self.record, self.repo, self.options, self.pool = record, Path(repo), options, pool
        self.cfg = options.repo_repair
        self.parse = get_parser(options.tool_parser)
        self.tools = SCHEMAS
        self.session: ToolSession | None = None
        self.local: RepoTools | None = None
        self.turns = 0
        self.tool_seconds = 0.0
        self.counts = {"tool_calls": 0.0, "tool_failures": 0.0, "test_file_edits": 0.0}

    async def ainit(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if self.cfg.tools == "mcp":
            self.session = self.pool.open_session(server_spec(str(self.repo), self.cfg))
            await self.session.raw_tools()  # starts the episode's server on its copy of the repository
        else:
            sandbox = await asyncio.to_thread(Sandbox, self.repo, limits_of(self.cfg))
            self.local = RepoTools(sandbox, self.cfg.max_output_chars)
        return prompt, {}

    @property
    def workspace(self) -> Path:
        if self.local is not None:
            return self.local.sandbox.workspace
        assert self.session is not None and self.session.data_copy is not None
        return self.session.data_copy

    async def astep(self, action: str) -> StepOutput:
        self.turns += 1
        parsed = self.parse(action, self.tools)
        if not parsed.found:
            return await self._end(finished=False)
        calls = [c for c in parsed.items if isinstance(c, ToolCall)]
        finished = any(c.name == "finish" for c in calls)
        answered = await answer_calls(parsed, self._call, self.options)
        self.counts["tool_calls"] += len(parsed.items)
        self.counts["tool_failures"] += answered.failures
        self.counts["test_file_edits"] += sum(
            c.name == "edit_file" and is_test_path(str(c.arguments.get("path", ""))) for c in calls
        )
        if finished:
            return await self._end(finished=True)
        metrics = {"tool_calls": len(parsed.items), "tool_failures": answered.failures}
        if self.turns >= self.options.max_turns:  # the loop stops here: grade what there is
            end = await self._end(finished=False)
            return StepOutput(answered.observations, end.reward, True, {**end.metadata, **metrics})
        return StepOutput(answered.observations, 0.0, False, metrics)

    async def _call(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        try:
            return await self._dispatch(call)
        finally:
            self.tool_seconds += time.monotonic() - start

    async def _dispatch(self, call: ToolCall) -> ToolResult:
        if call.name == "finish":
            return ToolResult("submitted", False)
        if self.local is not None:
            try:
                return ToolResult(await asyncio.to_thread(self.local.call, call.name, call.arguments), False)
            except ToolFailure as exc:
                return ToolResult(str(exc), True)
        assert self.session is not None
        timeout = self.cfg.command_timeout_s + 30
        return await self.session.call_tool(call.name, call.arguments, timeout, self.cfg.max_output_chars + 500)

    async def _end(self, finished: bool) -> StepOutput:
        limits = dataclasses.replace(limits_of(self.cfg), max_output_chars=1_000_000)
        with Sandbox(None, limits, adopt=self.workspace) as grader:
            result = await asyncio.to_thread(grade, grader, self.repo, self.record, finished)
            seconds = grader.seconds
        fraction = result.passed / max(result.total, 1)
        reward = float(result.resolved) if self.cfg.scoring == "all" else (fraction if finished else 0.0)
        reward -= self.cfg.step_penalty * self.turns
        sandbox_seconds = seconds + self.tool_seconds
        metrics = {
            "tool_calls": 0, "tool_failures": 0,
            "env_metrics": {
                "repo_repair/resolved": float(result.resolved), "repo_repair/finished": float(finished),
                "repo_repair/tests_passed_frac": fraction, "repo_repair/sandbox_s": sandbox_seconds,
                "repo_repair/test_file_edits": self.counts["test_file_edits"],
                "repo_repair/test_files_changed": float(result.test_files_changed),
            },
            "mask_episode": self.cfg.mask_truncated and not finished,
        }  # fmt: skip
        return StepOutput([], reward, True, metrics)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.aclose()
        if self.local is not None:
            self.local.sandbox.close()
