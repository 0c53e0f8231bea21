"""repo_repair: bug validation, held-out families, mutations, tools, grading, and the expert replayed through the
env in both tool modes (tasks/repo_repair/)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from thermik.config.schema import EnvConfig, RepoRepairConfig, SamplingConfig
from thermik.tasks.registry import generate_rows, make_env, solve
from thermik.tasks.repo_repair import generate, mutations
from thermik.tasks.repo_repair.expert import expert_plan
from thermik.tasks.repo_repair.grade import grade, parse_outcomes
from thermik.tasks.repo_repair.sandbox import Sandbox, SandboxLimits, bwrap_path
from thermik.tasks.repo_repair.templates import FAMILIES, HELD_OUT_FAMILIES, Unit, families_for
from thermik.tasks.repo_repair.tools import PYTEST, TOOL_NAMES, RepoTools, ToolFailure
from thermik.tools.mcp_pool import MCPPool

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap (apt-get install bubblewrap)")
LIMITS = SandboxLimits(wall_s=60)


def _package() -> generate.Package:
    f = Unit("f", "def f(x):\n    if x > 100:\n        return 0\n    return x + 1\n", "f", ("f(1)", "f(2)"))
    g = Unit("g", "def g(x):\n    return x * 2\n", "g", ("g(3)",))
    package = generate.Package("demo", {"core": [f, g]}, ["core"])
    source = package.source("core")
    package.files = {"demo/__init__.py": "", "demo/core.py": source}
    package.files["tests/test_core.py"] = generate._test_file("demo", "core", source, [f, g])
    return package


def _site(package: generate.Package, kind: str) -> mutations.Site:
    return next(s for s in mutations.sites(package.files["demo/core.py"], "f") if s.kind == kind)


@needs_bwrap
def test_a_bug_that_breaks_no_test_is_rejected_and_one_that_does_is_kept() -> None:
    package = _package()
    dropped = [generate.Bug("core", "f", _site(package, "drop_branch"))]  # x > 100 is never tested
    swapped = [generate.Bug("core", "f", _site(package, "operator"))]  # x + 1 -> x - 1
    dropped_files, swapped_files = generate.buggy_files(package, dropped), generate.buggy_files(package, swapped)
    assert dropped_files is not None and "return 0" not in dropped_files["demo/core.py"]
    with generate.CandidateRunner(package, LIMITS) as runner:
        fixed, dropped_outcomes, swapped_outcomes = runner.outcomes([{}, dropped_files, swapped_files])
    assert fixed is not None and set(fixed.values()) == {"PASSED"}
    assert generate.judge(package, dropped, dropped_files, fixed, dropped_outcomes) is None
    kept = generate.judge(package, swapped, swapped_files, fixed, swapped_outcomes)
    assert kept is not None
    assert kept.fail_to_pass == ["tests/test_core.py::test_f_0", "tests/test_core.py::test_f_1"]
    assert kept.pass_to_pass == ["tests/test_core.py::test_g_0"]


@needs_bwrap
def test_the_lean_runner_agrees_with_pytest_and_survives_a_hang_and_a_crash() -> None:
    """Validation runs the tests with runner.py, grading with pytest: the outcomes must be the same."""
    package = generate.build_package("stats", 7, generate.Knobs(modules=3, distractors=2), "train")
    sets = generate.candidate_sets(package, generate.Knobs(), 7)[:4]
    candidates = [{}] + [f for f in (generate.buggy_files(package, s) for s in sets) if f is not None]
    module = package.module_path(package.family_modules[0])
    candidates.append({module: package.files[module] + "\nimport os\nos._exit(3)\n"})  # every test file dies
    candidates.append({module: package.files[module] + "\nwhile True:\n    pass\n"})  # hangs
    candidates.append({module: package.files[module] + "\n)\n"})  # does not compile: every test errors
    with generate.CandidateRunner(package, LIMITS) as runner:
        lean = runner.outcomes(candidates)
        expected = []
        for files in candidates[:-3] + candidates[-1:]:
            clean = {p: (runner.box.workspace / p).read_text() for p in files}
            generate._write(runner.box.workspace, files)
            expected.append(parse_outcomes(runner.box.run(PYTEST).output))
            generate._write(runner.box.workspace, clean)
    assert lean[-3] is None and lean[-2] is None
    assert lean[:-3] + lean[-1:] == expected
    assert lean[-1] == {f"tests/test_{package.family_modules[0]}.py": "ERROR"}
    assert {o for outcomes in lean[1:-3] for o in outcomes.values()} == {"PASSED", "FAILED"}


def test_held_out_rows_share_no_family_with_training(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: dict[str, set[str]] = {"train": set(), "eval": set()}

    def fake(key: str, out: Path) -> tuple[dict[str, Any], Path]:
        values = generate.read_key(key)[1]
        drawn[values["split"]].add(values["family"])
        record = {"instance_id": key, "repo": "r", "problem_statement": "p"}
        return record, out

    monkeypatch.setattr(generate, "load_or_write", fake)
    options = EnvConfig(name="repo_repair", repo_repair=RepoRepairConfig(tasks_dir=tempfile.gettempdir()))
    for split in ("train", "eval"):
        generate.rows("repo_repair", 40, 0, split, options)
    assert drawn["eval"] == set(HELD_OUT_FAMILIES) and drawn["train"] == set(FAMILIES) - HELD_OUT_FAMILIES
    assert not set(families_for("train")) & set(families_for("eval"))


def test_every_mutation_kind_changes_the_code_and_keeps_it_valid() -> None:
    import random

    seen = set()
    rng = random.Random(0)
    for family in FAMILIES.values():
        for draws in family.values():
            source = mutations.canonical("\n\n".join(d(rng).source for d in draws))
            for draw in draws:
                name = draw(rng).name
                for site in mutations.sites(source, name):
                    mutated = mutations.mutate(source, name, site)
                    compile(mutated, "m.py", "exec")
                    if mutated != source:
                        seen.add(site.kind)
    assert seen == set(mutations.KINDS)


@pytest.fixture
def tools(tmp_path: Path) -> RepoTools:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text("a = 1\nb = 1\nc = 2\n")
    box = Sandbox(repo, SandboxLimits(max_output_chars=300))
    yield RepoTools(box, 300)
    box.close()


def test_edit_file_needs_one_exact_match(tools: RepoTools) -> None:
    with pytest.raises(ToolFailure, match="not found"):
        tools.call("edit_file", {"path": "pkg/m.py", "old_str": "a = 3", "new_str": "x"})
    with pytest.raises(ToolFailure, match="occurs 2 times"):
        tools.call("edit_file", {"path": "pkg/m.py", "old_str": "= 1", "new_str": "= 5"})
    assert "line 3" in tools.call("edit_file", {"path": "pkg/m.py", "old_str": "c = 2", "new_str": "c = 3"})
    assert tools.call("read_file", {"path": "pkg/m.py", "start_line": 3, "end_line": 3}) == "    3  c = 3"
    assert "pkg/m.py:1: a = 1" in tools.call("search", {"pattern": r"^a ="})


def test_file_tools_refuse_paths_and_symlinks_out_of_the_repository(tools: RepoTools, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret = 1\n")
    os.symlink(outside, tools.sandbox.workspace / "link.txt")
    for call in (
        ("read_file", {"path": "link.txt"}),
        ("read_file", {"path": "../outside.txt"}),
        ("edit_file", {"path": "link.txt", "old_str": "secret = 1", "new_str": "secret = 2"}),
    ):
        with pytest.raises(ToolFailure, match="outside the repository"):
            tools.call(*call)
    assert outside.read_text() == "secret = 1\n"
    assert tools.call("search", {"pattern": "secret = "}).startswith("no match")


@needs_bwrap
def test_bash_output_is_cut_to_head_and_tail_with_a_note(tools: RepoTools) -> None:
    text = tools.call("bash", {"command": "echo START; seq 1 100000; echo END"})
    assert text.startswith("START") and "END\n[exit code 0]" in text and "bytes of output omitted" in text


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def task(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    repo = tmp_path / "task"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "m.py").write_text("def inc(x):\n    return x - 1\n\n\ndef dbl(x):\n    return 2 * x\n")
    (repo / "tests" / "test_m.py").write_text(
        "from pkg.m import dbl, inc\n\n\ndef test_inc():\n    assert inc(1) == 2\n\n\ndef test_dbl():\n"
        "    assert dbl(2) == 4\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    record = {"base_commit": _git(repo, "rev-parse", "HEAD").strip(), "test_patch": "",
              "FAIL_TO_PASS": ["tests/test_m.py::test_inc"], "PASS_TO_PASS": ["tests/test_m.py::test_dbl"]}  # fmt: skip
    return repo, record


@needs_bwrap
def test_grading_restores_the_tests_so_editing_them_earns_nothing(task: tuple[Path, dict[str, Any]]) -> None:
    repo, record = task
    with Sandbox(repo, LIMITS) as box:
        (box.workspace / "tests" / "test_m.py").write_text("def test_inc():\n    pass\n\n\ndef test_dbl():\n    pass\n")
        cheated = grade(box, repo, record, finished=True)
        fixed_code = (box.workspace / "pkg" / "m.py").read_text().replace("x - 1", "x + 1")
        (box.workspace / "pkg" / "m.py").write_text(fixed_code)
        resolved = grade(box, repo, record, finished=True)
        unfinished = grade(box, repo, record, finished=False)
    assert not cheated.resolved and cheated.test_files_changed == 1 and cheated.passed == 1
    assert resolved.resolved and resolved.passed == 2 and not unfinished.resolved


@needs_bwrap
def test_restoring_tests_does_not_follow_a_symlink_out(task: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    repo, record = task
    target = tmp_path / "elsewhere"
    target.mkdir()
    with Sandbox(repo, LIMITS) as box:
        tests = box.workspace / "tests"
        for child in tests.iterdir():
            child.unlink()
        tests.rmdir()
        os.symlink(target, tests)
        grade(box, repo, record, finished=True)
        assert not tests.is_symlink() and (tests / "test_m.py").exists()
    assert list(target.iterdir()) == []


def _expert_rows(
    out: Path, n: int, split: str, tools: str = "in-process", **knobs: Any
) -> tuple[EnvConfig, list[dict[str, Any]]]:
    cfg = RepoRepairConfig(tasks_dir=str(out), max_output_chars=500, tools=tools, **knobs)
    options = EnvConfig(name="repo_repair", max_turns=20, repo_repair=cfg)
    return options, generate_rows("repo_repair", n, 3, split, options)


def _apply_edits(repo: Path, plan: list[Any]) -> dict[str, str]:
    files: dict[str, str] = {}
    for step in (s for s in plan if s.tool == "edit_file"):
        path, old = step.arguments["path"], step.arguments["old_str"]
        text = files.get(path, (repo / path).read_text())
        assert text.count(old) == 1, f"{path}: the expert's old_str is not unique"
        files[path] = text.replace(old, step.arguments["new_str"])
    return files


@needs_bwrap
def test_expert_episodes_average_8_turns_vary_and_apply_the_known_fix(tmp_path: Path) -> None:
    _, rows = _expert_rows(tmp_path / "one", 20, "train")
    _, two_bugs = _expert_rows(tmp_path / "two", 4, "eval", bugs=2, modules=3, name_function=False)
    plans = [expert_plan(row) for row in rows + two_bugs]
    turns = [len(plan) for plan in plans]
    assert sum(turns) / len(turns) >= 8 and min(turns) >= 7, turns
    shapes = {tuple((s.thought, s.tool) for s in plan) for plan in plans}
    assert len(shapes) >= len(plans) // 2, "expert episodes barely vary"
    assert {s.tool for plan in plans for s in plan} == set(TOOL_NAMES)
    for row, plan in zip(rows + two_bugs, plans, strict=True):
        tools = [s.tool for s in plan]
        first_edit, last_edit = tools.index("edit_file"), len(tools) - 1 - tools[::-1].index("edit_file")
        assert tools[-1] == "finish" and "run_tests" in tools[:first_edit] and "run_tests" in tools[last_edit:]
        assert any(s.thought == "test" for s in plan[:first_edit]), "the failing test is read before the edit"
        record, repo = row["reward_spec"]["ground_truth"], Path(row["extra_info"]["repo_path"])
        fixed = tmp_path / "fixed" / record["instance_id"]
        shutil.copytree(repo, fixed)
        subprocess.run(["git", "apply", "-"], cwd=fixed, input=record["patch"], text=True, check=True)
        assert _apply_edits(repo, plan) == {p: (fixed / p).read_text() for p in _apply_edits(repo, plan)}
    assert sum(turns[len(rows) :]) / len(two_bugs) > sum(turns[: len(rows)]) / len(rows), "2 bugs take more steps"


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize(("tools_mode", "n"), [("in-process", 5), ("mcp", 1)])
def test_expert_trajectories_replay_to_reward_1(tools_mode: str, n: int, tmp_path: Path) -> None:
    """Through the env, the real tools and the sandbox: the same observations, and the task resolved."""
    options, rows = _expert_rows(tmp_path, n, "train", tools_mode)
    for row in rows:
        conversation = solve(row, options)
        assert [m["role"] for m in conversation][-1] == "assistant" and len(conversation) >= 2 + 2 * 7 - 1

        async def replay(row: dict[str, Any] = row, conversation: list[dict[str, Any]] = conversation) -> Any:
            pool = MCPPool()
            env = make_env("repo_repair", reward_spec=row["reward_spec"], extra_info=row["extra_info"],
                           options=options, pool=pool)  # fmt: skip
            await env.ainit(row["prompt"])
            observations: list[str] = []
            try:
                for message in (m for m in conversation if m["role"] == "assistant"):
                    out = await env.astep(message["content"])
                    observations += [o["content"] for o in out.observations]
                    if out.done:
                        return out.reward, observations, out.metadata
            finally:
                await env.aclose()
                await pool.aclose()
            raise AssertionError("the expert never finished")

        reward, observations, metadata = asyncio.run(replay())
        assert reward == 1.0 and metadata["env_metrics"]["repo_repair/resolved"] == 1.0
        assert observations == [m["content"] for m in conversation if m["role"] == "tool"]
        assert not any(o.startswith(("bash: bad", "unknown tool")) or "[exit code 128]" in o for o in observations)


class _MetricsEnv:
    """Two turns; the last step reports env metrics and, when asked, that the episode trains on nothing."""

    tools = None
    plays_episode = False

    def __init__(self, mask: bool) -> None:
        self.mask, self.turn = mask, 0

    async def ainit(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return prompt, {}

    async def astep(self, action: str) -> Any:
        from thermik.envs.base import StepOutput

        self.turn += 1
        metrics = {"env_metrics": {"demo/seconds": 1.5}, "mask_episode": self.mask and self.turn == 2}
        return StepOutput([{"role": "user", "content": "more"}] if self.turn < 2 else [], 0.0, self.turn == 2, metrics)


@pytest.mark.parametrize("mask", [False, True])
def test_env_metrics_are_summed_and_mask_episode_zeroes_the_loss(mask: bool) -> None:
    from test_rollout import ScriptedEngine

    from thermik.models.chat import ChatTokenizer
    from thermik.models.tokenizer import build_tokenizer
    from thermik.rollout.agent_loop import LoopLimits, run_episode
    from thermik.rollout.metrics import rollout_metrics

    chat = ChatTokenizer(build_tokenizer())
    engine = ScriptedEngine(chat, ["a", "b"])
    limits = LoopLimits(max_turns=4, max_input_length=512, max_generate_length=16, max_sequence_length=1024)
    prompt = [{"role": "user", "content": "go"}]
    traj = asyncio.run(run_episode(engine, _MetricsEnv(mask), chat, prompt, limits, SamplingConfig()))
    assert traj.env_metrics["demo/seconds"] == 3.0
    assert (sum(traj.loss_mask) == 0) == mask
    metrics = rollout_metrics([traj])
    assert metrics["demo/seconds"] == 3.0 and metrics.get("episodes/masked_frac", 0.0) == float(mask)
    assert "overlong" not in traj.env_metrics  # masked by the env's choice, not for length (episodes/overlong)
