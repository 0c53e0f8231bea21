"""Expert trajectories from a task's known fix, for SFT warm-up: see the failure, search, read, edit, test, finish.

The tools really run (in-process, on a sandbox copy of the repository), so every observation is what the live
tools return. Trajectories vary per task: the order of the first steps, search vs grep through bash, reading a
range or the whole file, the edit with or without context lines, the final test run on the failing tests or the
whole suite, and the short thoughts before each call.
"""

from __future__ import annotations

import random
import re
from typing import Any

from thermik.config.schema import RepoRepairConfig
from thermik.tasks.repo_repair.sandbox import Sandbox
from thermik.tasks.repo_repair.server import limits_of
from thermik.tasks.repo_repair.tools import RepoTools
from thermik.tools.parsers import format_hermes_tool_call

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", re.MULTILINE)
_FUNCTION_IN_TEST = re.compile(r"::test_(\w+?)_\d+$")


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
    "tests": [
        "Let me run the tests to see what fails.",
        "First, the failing tests.",
        "I'll start with the test suite.",
    ],
    "search": ["Let me find where {f} is defined.", "Where is {f}?", "I'll look for {f} in the code."],
    "read": ["Let me read {f}.", "Now the code of {f}.", "Reading the function."],
    "edit": ["Found it: this line is wrong. Fixing it.", "That is the bug; I'll correct it.", "Here is the fix."],
    "check": ["Let me check the fix.", "Running the tests again.", "Now the tests should pass."],
    "finish": ["The tests pass. Done.", "All green; submitting.", "Fixed."],
}


class _Transcript:
    def __init__(self, tools: RepoTools, rng: random.Random, prompt: list[dict[str, Any]]) -> None:
        self.tools, self.rng = tools, rng
        self.messages = list(prompt)

    def act(self, thought: str, name: str, arguments: dict[str, Any], **fill: str) -> str:
        text = self.rng.choice(_THOUGHTS[thought]).format(**fill)
        self.messages.append({"role": "assistant", "content": f"{text}\n{format_hermes_tool_call(name, arguments)}"})
        if name == "finish":
            return ""
        result = self.tools.call(name, arguments)
        self.messages.append({"role": "tool", "name": name, "content": result})
        return result


def expert_conversation(row: dict[str, Any], cfg: RepoRepairConfig) -> list[dict[str, Any]]:
    """The prompt, then a solving episode's assistant turns and tool observations, ending with `finish`."""
    record = row["reward_spec"]["ground_truth"]
    rng = random.Random(record["instance_id"])
    functions = list(dict.fromkeys(m.group(1) for t in record["FAIL_TO_PASS"] if (m := _FUNCTION_IN_TEST.search(t))))
    with Sandbox(_repo(row), limits_of(cfg)) as sandbox:
        tools = RepoTools(sandbox, cfg.max_output_chars)
        talk = _Transcript(tools, rng, row["prompt"])
        tests_first = rng.random() < 0.6
        if tests_first:
            talk.act("tests", "run_tests", {})
        for (path, start, body), function in zip(hunks(record["patch"]), functions or [""] * 99, strict=False):
            name = function or path
            if rng.random() < 0.7:
                talk.act("search", "search", {"pattern": f"def {function}" if function else path}, f=name)
            else:
                talk.act("search", "bash", {"command": f"grep -rn 'def {function}' --include=*.py ."}, f=name)
            if rng.random() < 0.5:
                talk.act(
                    "read", "read_file", {"path": path, "start_line": max(start - 3, 1), "end_line": start + 12}, f=name
                )
            else:
                talk.act("read", "read_file", {"path": path}, f=name)
            if not tests_first and rng.random() < 0.5:
                talk.act("tests", "run_tests", {})
                tests_first = True
            old, new = _edit(body, minimal=rng.random() < 0.5)
            if sandbox.workspace.joinpath(path).read_text().count(old) != 1:
                old, new = _edit(body, minimal=False)
            talk.act("edit", "edit_file", {"path": path, "old_str": old, "new_str": new})
        check = {} if rng.random() < 0.5 else {"tests": " ".join(record["FAIL_TO_PASS"])}
        talk.act("check", "run_tests", check)
        talk.act("finish", "finish", {})
        return talk.messages


def _repo(row: dict[str, Any]) -> Any:
    from pathlib import Path

    return Path(row["extra_info"]["repo_path"])
