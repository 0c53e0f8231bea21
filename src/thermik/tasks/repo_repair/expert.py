"""Expert trajectories from a task's known fix, for SFT warm-up: the steps an engineer takes, 7-12 turns each.

`expert_plan` decides the calls from the task alone (its record and the repository on disk), seeded by the
instance id: maybe look at the tree, run the tests to see the failure, find the broken function, read its failing
test, read the code around it, maybe look at who calls it, edit with the known fix, maybe look at the diff, run the
failing test or the whole suite (sometimes both), finish. Each step has variants (search or grep, a line range or the
whole file, read_file or sed, a minimal edit or one with context lines). `expert_conversation` then runs the calls
with the real tools (in-process, on a sandbox copy of the repository), so every observation is what the live tools
return.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.config.schema import RepoRepairConfig
from thermik.tasks.repo_repair import mutations
from thermik.tasks.repo_repair.sandbox import Sandbox
from thermik.tasks.repo_repair.server import limits_of
from thermik.tasks.repo_repair.tools import RepoTools
from thermik.tools.parsers import format_hermes_tool_call

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", re.MULTILINE)
_TEST_DEF = re.compile(r"^def (test_\w+)\(", re.MULTILINE)


def hunks(patch: str) -> list[tuple[str, int, list[str]]]:
    """(path, first old line, hunk lines with their ' '/'-'/'+' prefix) of a unified diff."""
    out: list[tuple[str, int, list[str]]] = []
    path = ""
    lines = patch.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("+++ b/"):
            path = line[6:]
        match = _HUNK.match(line)
        if match:
            body = []
            for rest in lines[i + 1 :]:
                if rest.startswith(("@@", "diff --git")):
                    break
                if rest[:1] in (" ", "-", "+"):
                    body.append(rest)
            out.append((path, int(match.group(1)), body))
    return out


def _edit(body: list[str], minimal: bool) -> tuple[str, str]:
    changed = [i for i, line in enumerate(body) if line[:1] in "-+"]
    lo, hi = (changed[0], changed[-1] + 1) if minimal else (0, len(body))
    part = body[lo:hi]
    old = "\n".join(line[1:] for line in part if line[:1] in " -")
    new = "\n".join(line[1:] for line in part if line[:1] in " +")
    return old, new


_THOUGHTS = {
    "tree": ["Let me look at the repository first.", "What is in the repository?", "First, the layout."],
    "tests": ["Let me run the tests to see what fails.", "First, the failing tests.", "I'll start with the tests."],
    "search": ["Where is {f} defined?", "Let me find {f}.", "I'll look for {f} in the code."],
    "test": ["What does {t} expect?", "Let me read the failing test.", "Now the test {t}."],
    "read": ["Let me read {f}.", "Now the code of {f}.", "Reading the function."],
    "callers": ["Who else uses {f}?", "Let me check the callers of {f}.", "Is {f} used elsewhere?"],
    "edit": ["Found it: this line is wrong. Fixing it.", "That is the bug; I'll correct it.", "Here is the fix."],
    "diff": ["Let me review the change.", "Checking the diff.", "The change so far:"],
    "one": ["Does {t} pass now?", "First the test that failed.", "Re-running {t}."],
    "check": ["Let me check the fix.", "Running the tests again.", "Now the whole suite."],
    "finish": ["The tests pass. Done.", "All green; submitting.", "Fixed."],
}


@dataclass(frozen=True)
class Step:
    """One assistant turn: a thought (a key of _THOUGHTS, filled with `fill`) and a tool call."""

    thought: str
    tool: str
    arguments: dict[str, Any]
    fill: dict[str, str]


def _enclosing_function(source: str, line: int) -> tuple[str, int, int]:
    """(name, first line, last line) of the innermost function holding `line` ('' and the line itself if none)."""
    best = ("", line, line)
    for node in ast.walk(mutations.parse(source)):
        holds = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= line <= (
            node.end_lineno or 0
        )
        if holds and (not best[0] or node.lineno >= best[1]):
            best = (node.name, node.lineno, node.end_lineno or node.lineno)
    return best


def _test_span(text: str, test: str) -> tuple[int, int]:
    """First and last line of `def test(...)` in a test file's text (1, 1 if absent)."""
    starts = [(m.group(1), text[: m.start()].count("\n") + 1) for m in _TEST_DEF.finditer(text)]
    for i, (name, start) in enumerate(starts):
        if name == test:
            end = starts[i + 1][1] - 1 if i + 1 < len(starts) else text.count("\n") + 1
            body = text.splitlines()[start - 1 : end]
            while len(body) > 1 and not body[-1].strip():
                body.pop()
            return start, start + len(body) - 1
    return 1, 1


class _Planner:
    """Builds the steps of one task: the record, the repository on disk, a seeded choice of variants."""

    def __init__(self, record: dict[str, Any], repo: Path, rng: random.Random) -> None:
        self.record, self.repo, self.rng = record, repo, rng
        self.steps: list[Step] = []

    def add(self, thought: str, tool: str, arguments: dict[str, Any], **fill: str) -> None:
        self.steps.append(Step(thought, tool, arguments, fill))

    def failing_test(self, function: str) -> str:
        tests = self.record["FAIL_TO_PASS"]
        return next((t for t in tests if re.search(rf"::test_{re.escape(function)}_\d+$", t)), tests[0])

    def orient(self) -> None:
        command = self.rng.choice(["ls -R", "find . -name '*.py' -not -path './.git/*' | sort", "git ls-files"])
        self.add("tree", "bash", {"command": command})

    def run_all(self, thought: str) -> None:
        self.add(thought, "run_tests", self.rng.choice([{}, {}, {"tests": "tests"}]))

    def locate(self, function: str, path: str) -> None:
        if not function:
            self.add("search", "search", {"pattern": path.rsplit("/", 1)[-1]}, f=path)
        elif self.rng.random() < 0.6:
            self.add("search", "search", {"pattern": f"def {function}\\("}, f=function)
        else:
            self.add("search", "bash", {"command": f"grep -rn 'def {function}(' --include=*.py ."}, f=function)

    def read_test(self, test_id: str) -> None:
        path, _, test = test_id.partition("::")
        start, end = _test_span((self.repo / path).read_text(), test)
        kind = self.rng.random()
        if kind < 0.5:
            self.add("test", "read_file", {"path": path, "start_line": start, "end_line": end}, t=test)
        elif kind < 0.8:
            self.add("test", "bash", {"command": f"sed -n '{start},{end}p' {path}"}, t=test)
        else:
            self.add("test", "bash", {"command": f"grep -n -A2 'def {test}(' {path}"}, t=test)

    def read_source(self, path: str, span: tuple[str, int, int]) -> None:
        name, start, end = span
        kind = self.rng.random()
        if kind < 0.55:
            lo, hi = max(start - self.rng.choice([0, 1, 2]), 1), end + self.rng.choice([0, 1, 2])
            self.add("read", "read_file", {"path": path, "start_line": lo, "end_line": hi}, f=name or path)
        elif kind < 0.75:
            self.add("read", "bash", {"command": f"sed -n '{start},{end}p' {path}"}, f=name or path)
        else:
            self.add("read", "read_file", {"path": path}, f=name or path)

    def callers(self, function: str) -> None:
        if self.rng.random() < 0.5:
            self.add("callers", "search", {"pattern": f"{function}\\("}, f=function)
        else:
            self.add("callers", "bash", {"command": f"grep -rn '{function}(' --include=*.py . | head"}, f=function)

    def fix(self, path: str, body: list[str]) -> None:
        old, new = _edit(body, minimal=self.rng.random() < 0.5)
        if (self.repo / path).read_text().count(old) != 1:
            old, new = _edit(body, minimal=False)
        self.add("edit", "edit_file", {"path": path, "old_str": old, "new_str": new})

    def verify(self) -> None:
        if self.rng.random() < 0.35:
            self.add(
                "diff", "bash", {"command": self.rng.choice(["git diff", "git diff --stat", "git status --short"])}
            )
        failing = " ".join(self.record["FAIL_TO_PASS"])
        first = self.record["FAIL_TO_PASS"][0].partition("::")[2]
        choice = self.rng.random()
        if choice < 0.45:
            self.add("one", "run_tests", {"tests": failing}, t=first)
            self.run_all("check")
        elif choice < 0.75:
            self.run_all("check")
        else:
            self.add("one", "run_tests", {"tests": failing}, t=first)


def expert_plan(row: dict[str, Any]) -> list[Step]:
    """The steps of the expert episode of `row`, seeded by its instance id; the last one is `finish`."""
    record = row["reward_spec"]["ground_truth"]
    repo = Path(row["extra_info"]["repo_path"])
    plan = _Planner(record, repo, random.Random(record["instance_id"]))
    if plan.rng.random() < 0.5:
        plan.orient()
    plan.run_all("tests")
    for path, start, body in hunks(record["patch"]):
        first_changed = start + next(i for i, line in enumerate(body) if line[:1] in "-+")
        span = _enclosing_function((repo / path).read_text(), first_changed)
        function = span[0]
        plan.locate(function, path)
        if function:
            plan.read_test(plan.failing_test(function))
        plan.read_source(path, span)
        if function and plan.rng.random() < 0.35:
            plan.callers(function)
        plan.fix(path, body)
    plan.verify()
    plan.add("finish", "finish", {})
    return plan.steps


def expert_conversation(row: dict[str, Any], cfg: RepoRepairConfig) -> list[dict[str, Any]]:
    """The prompt, then a solving episode's assistant turns and tool observations, ending with `finish`."""
    record = row["reward_spec"]["ground_truth"]
    rng = random.Random(f"{record['instance_id']}/thoughts")
    messages = list(row["prompt"])
    with Sandbox(Path(row["extra_info"]["repo_path"]), limits_of(cfg)) as sandbox:
        tools = RepoTools(sandbox, cfg.max_output_chars)
        for step in expert_plan(row):
            thought = rng.choice(_THOUGHTS[step.thought]).format(**step.fill)
            call = format_hermes_tool_call(step.tool, step.arguments)
            messages.append({"role": "assistant", "content": f"{thought}\n{call}"})
            if step.tool != "finish":
                messages.append({"role": "tool", "name": step.tool, "content": tools.call(step.tool, step.arguments)})
    return messages
