"""Repo-repair tasks: small Python packages with tests, a bug injected by AST mutation, validated in the sandbox.

A task key (`make_key("repo", family=..., seed=..., modules=..., distractors=..., bugs=..., name_function=...)`)
builds one package deterministically: the family's modules (plus, for `modules` > 2, modules of other families of
the same split), `distractors` extra functions, and tests computed from the correct code. `bugs` mutations go into
functions of the family; a candidate is kept only if, run in the sandbox, its tests fail with the bug (>= 1
FAIL_TO_PASS) and pass without it (>= 1 PASS_TO_PASS, every test passing on the fixed code). Otherwise the next
candidate (another function or site) is tried.

The output is a SWE-bench record (instance_id, repo, base_commit, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS,
problem_statement) and the repository as a git directory whose one commit (base_commit) holds the buggy code and
its tests; `patch` is the fix. Tasks are cached under the thermik cache directory, keyed by the generator version.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thermik.data.problem_key import make_key, read_key
from thermik.tasks.repo_repair import mutations
from thermik.tasks.repo_repair.sandbox import Sandbox, SandboxLimits
from thermik.tasks.repo_repair.templates import FAMILIES, Unit, families_for
from thermik.tools.mcp_launch import cache_dir

logger = logging.getLogger(__name__)
GENERATOR_VERSION = "1"
_MAX_CANDIDATES = 24


@dataclass(frozen=True)
class Knobs:
    """Difficulty: modules in the package (1-5), extra functions from other families, bugs, whether the problem
    statement names the function."""

    modules: int = 2
    distractors: int = 0
    bugs: int = 1
    name_function: bool = True


@dataclass
class Package:
    name: str
    modules: dict[str, list[Unit]]
    family_modules: list[str]
    files: dict[str, str] = field(default_factory=dict)
    """path -> text of the correct package, its tests included."""

    def source(self, module: str) -> str:
        return mutations.canonical("\n\n".join(u.source for u in self.modules[module]))

    def module_path(self, module: str) -> str:
        return f"{self.name}/{module}.py"


@dataclass(frozen=True)
class Bug:
    module: str
    function: str
    site: mutations.Site


# ------------------------------------------------------------------ the package


def _draw_modules(family: str, rng: random.Random, knobs: Knobs, split: str) -> tuple[dict[str, list[Unit]], list[str]]:
    own = {name: [draw(rng) for draw in draws] for name, draws in FAMILIES[family].items()}
    own = dict(list(own.items())[: max(knobs.modules, 1)])
    others = [f for f in families_for(split) if f != family]
    extra: dict[str, list[Unit]] = {}
    while len(own) + len(extra) < knobs.modules and others:
        other = others.pop(rng.randrange(len(others)))
        name, draws = rng.choice(sorted(FAMILIES[other].items()))
        extra[name] = [draw(rng) for draw in draws]
    modules = {**own, **extra}
    pool = [d for f in others or families_for(split) for ds in FAMILIES[f].values() for d in ds]
    target = sorted(modules)
    taken = {u.name for units in modules.values() for u in units}
    for _ in range(knobs.distractors):
        unit = rng.choice(pool)(rng)
        if unit.name not in taken:
            taken.add(unit.name)
            modules[rng.choice(target)].append(unit)
    return modules, list(own)


def _expected(source: str, call: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # trusted: the template's correct code
    return eval(call, namespace)


def _test_file(package: str, module: str, source: str, units: list[Unit]) -> str:
    names = ", ".join(u.name for u in units)
    lines = ["import pytest", f"from {package}.{module} import {names}", ""]
    for unit in units:
        for i, call in enumerate(unit.calls):
            value = _expected(source, call)
            expected = f"pytest.approx({value!r})" if isinstance(value, float) else repr(value)
            lines += ["", f"def test_{unit.name}_{i}():", f"    assert {call} == {expected}", ""]
    return "\n".join(lines).rstrip() + "\n"


def build_package(family: str, seed: int, knobs: Knobs, split: str) -> Package:
    rng = random.Random(f"{family}/{seed}")
    modules, family_modules = _draw_modules(family, rng, knobs, split)
    package = Package(f"{family}_{rng.choice(['lib', 'kit', 'tools', 'utils'])}", modules, family_modules)
    package.files[f"{package.name}/__init__.py"] = f'"""The {family} package."""\n'
    for module, units in modules.items():
        source = package.source(module)
        package.files[package.module_path(module)] = source
        package.files[f"tests/test_{module}.py"] = _test_file(package.name, module, source, units)
    package.files["README.md"] = f"# {package.name}\n\nRun the tests with `python -m pytest`.\n"
    return package


# ------------------------------------------------------------------ bugs and validation


def _candidate_bugs(package: Package, rng: random.Random) -> list[Bug]:
    candidates = []
    for module in package.family_modules:
        source = package.files[package.module_path(module)]
        for unit in package.modules[module]:
            candidates += [Bug(module, unit.name, site) for site in mutations.sites(source, unit.name)]
    rng.shuffle(candidates)
    by_kind: dict[str, list[Bug]] = {}
    for bug in candidates:  # alternate the kinds, so every kind gets its turn
        by_kind.setdefault(bug.site.kind, []).append(bug)
    order = sorted(by_kind, key=lambda k: rng.random())
    return [b for i in range(max(map(len, by_kind.values()), default=0)) for k in order for b in by_kind[k][i : i + 1]]


def apply_bugs(package: Package, bugs: list[Bug]) -> dict[str, str]:
    """The package's files with `bugs` applied (one module mutated per bug, in order)."""
    files = dict(package.files)
    for bug in bugs:
        path = package.module_path(bug.module)
        files[path] = mutations.mutate(files[path], bug.function, bug.site)
    return files


def _write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


_RUNNER = (Path(__file__).parent / "runner.py").read_text()
_RUNNER_FILE = ".thermik-runner.py"
_CHUNK = 8
"""Candidates per runner call: most tasks validate within the first few, and a call that hangs costs one chunk."""
_CANDIDATE_TIMEOUT_S = 5


class CandidateRunner:
    """One sandbox holding the clean package, in which the lean runner (runner.py) tests sets of changed files: one
    Python start and pytest import per call, a fork per candidate (see runner.py for why not pytest itself)."""

    def __init__(self, package: Package, limits: SandboxLimits) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="thermik-rr-gen-")
        root = Path(self._tmp.name)
        _write(root, {**package.files, _RUNNER_FILE: _RUNNER})
        self.tests = sorted(p for p in package.files if p.startswith("tests/"))
        self.box = Sandbox(root, limits)

    def outcomes(self, candidates: list[dict[str, str]]) -> list[dict[str, str] | None]:
        """Each candidate's test outcomes (test id -> PASSED / FAILED / ERROR), with its files written over the clean
        package ({}: the clean package); None when it ran past its time or the call failed."""
        request = self.box.workspace / ".thermik-request.json"
        results = self.box.workspace / ".thermik-results.json"
        request.write_text(json.dumps({"tests": self.tests, "candidates": candidates, "out": results.name,
                                       "timeout_s": _CANDIDATE_TIMEOUT_S}))  # fmt: skip
        results.unlink(missing_ok=True)
        run = self.box.run(f"python {_RUNNER_FILE} {request.name}")
        if run.exit_code != 0 or not results.exists():
            logger.warning("repo_repair: the validation runner failed: %s", run.format()[-2000:])
            return [None] * len(candidates)
        return json.loads(results.read_text())

    def close(self) -> None:
        self.box.close()
        self._tmp.cleanup()

    def __enter__(self) -> CandidateRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Validated:
    bugs: list[Bug]
    buggy: dict[str, str]
    fail_to_pass: list[str]
    pass_to_pass: list[str]


def candidate_sets(package: Package, knobs: Knobs, seed: int) -> list[list[Bug]]:
    """The candidate sets of `knobs.bugs` bugs (in distinct functions) tried in turn, at most _MAX_CANDIDATES."""
    candidates = _candidate_bugs(package, random.Random(f"bugs/{package.name}/{seed}"))
    sets = []
    while len(sets) < _MAX_CANDIDATES:
        chosen: list[Bug] = []
        for bug in candidates:
            if len(chosen) < knobs.bugs and bug.function not in {b.function for b in chosen}:
                chosen.append(bug)
        if len(chosen) < knobs.bugs:
            break
        for bug in chosen:
            candidates.remove(bug)
        sets.append(chosen)
    return sets


def find_bugs(package: Package, knobs: Knobs, seed: int, limits: SandboxLimits) -> Validated | None:
    """The first candidate set that validates (`judge`), or None. One sandbox per package; the clean package's
    outcomes come with the first chunk of candidates."""
    changed = [(bugs, buggy_files(package, bugs)) for bugs in candidate_sets(package, knobs, seed)]
    changed = [(bugs, files) for bugs, files in changed if files is not None]
    fixed: dict[str, str] | None = None
    with CandidateRunner(package, limits) as runner:
        for start in range(0, len(changed), _CHUNK):
            chunk = changed[start : start + _CHUNK]
            outcomes = runner.outcomes(([{}] if fixed is None else []) + [files for _, files in chunk])
            if fixed is None:
                fixed = outcomes.pop(0)
                if not fixed or any(o != "PASSED" for o in fixed.values()):
                    raise RuntimeError(f"the correct package {package.name} does not pass its own tests: {fixed}")
            for (bugs, files), result in zip(chunk, outcomes, strict=True):
                validated = judge(package, bugs, files, fixed, result)
                if validated is not None:
                    return validated
    return None


def buggy_files(package: Package, bugs: list[Bug]) -> dict[str, str] | None:
    """The files `bugs` change, with the bugs in; None when a mutation fails or changes nothing."""
    try:
        files = apply_bugs(package, bugs)
    except (ValueError, TypeError, AssertionError):
        return None
    paths = {package.module_path(b.module) for b in bugs}
    if any(files[p] == package.files[p] for p in paths):
        return None
    return {p: files[p] for p in sorted(paths)}


def judge(
    package: Package, bugs: list[Bug], files: dict[str, str], fixed: dict[str, str], outcomes: dict[str, str] | None
) -> Validated | None:
    """Kept only if the tests fail with the bugs (>= 1 FAIL_TO_PASS, one per bug) and pass without them (>= 1
    PASS_TO_PASS)."""
    if outcomes is None:
        return None
    fail_to_pass = sorted(t for t, o in fixed.items() if o == "PASSED" and outcomes.get(t) != "PASSED")
    pass_to_pass = sorted(t for t, o in fixed.items() if o == "PASSED" and outcomes.get(t) == "PASSED")
    every_bug_seen = all(any(f"::test_{b.function}_" in t for t in fail_to_pass) for b in bugs)
    if not fail_to_pass or not pass_to_pass or not every_bug_seen:
        return None
    return Validated(bugs, {**package.files, **files}, fail_to_pass, pass_to_pass)


# ------------------------------------------------------------------ records


def unified_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style patch turning the files `before` into `after` (changed files only)."""
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ""), after.get(path, "")
        if old == new:
            continue
        out.append(f"diff --git a/{path} b/{path}\n")
        out += difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    return "".join(out)


def _statement(package: Package, validated: Validated, knobs: Knobs) -> str:
    lines = [f"The `{package.name}` package has a bug." if len(validated.bugs) == 1 else "The package has bugs."]
    for bug in validated.bugs:
        unit = next(u for u in package.modules[bug.module] if u.name == bug.function)
        failing = [t for t in validated.fail_to_pass if f"::test_{bug.function}_" in t]
        call = unit.calls[int(failing[0].rsplit("_", 1)[1])]
        expected = _expected(package.source(bug.module), call)
        if knobs.name_function:
            lines.append(
                f"`{call}` (in `{package.module_path(bug.module)}`) should return `{expected!r}`, but it does not."
            )
        else:
            lines.append(f"Something is wrong with {unit.description}: a case that should give `{expected!r}` gives "
                         "something else.")  # fmt: skip
    lines.append("Fix the code (not the tests) so that the test suite passes.")
    return "\n".join(lines)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "thermik", "GIT_AUTHOR_EMAIL": "thermik@localhost", "GIT_COMMITTER_NAME": "thermik",
           "GIT_COMMITTER_EMAIL": "thermik@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "HOME": str(repo), "PATH": "/usr/bin:/bin"}  # fmt: skip
    cmd = ["git", "-c", "init.defaultBranch=main", "-c", "safe.directory=*", "-C", str(repo), *args]
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def write_task(key: str, out: Path, limits: SandboxLimits | None = None) -> dict[str, Any] | None:
    """Build, validate and write the task of `key` under `out/<instance_id>/` (repo/ as a git directory,
    record.json); returns the SWE-bench record, or None when no candidate bug validates."""
    _, values = read_key(key)
    family, seed, split = values["family"], values["seed"], values["split"]
    knobs = Knobs(values["modules"], values["distractors"], values["bugs"], values["name_function"])
    package = build_package(family, seed, knobs, split)
    validated = find_bugs(package, knobs, seed, limits or SandboxLimits(wall_s=60))
    if validated is None:
        return None
    instance_id = f"thermik__{family}-{seed}-m{knobs.modules}d{knobs.distractors}b{knobs.bugs}" + (
        "n" if knobs.name_function else "u"
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{instance_id}-", dir=out))
    repo = tmp / "repo"
    _write(repo, validated.buggy)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{package.name}: initial version")
    record = {
        "instance_id": instance_id,
        "repo": f"thermik-synthetic/{package.name}",
        "base_commit": _git(repo, "rev-parse", "HEAD"),
        "patch": unified_diff(validated.buggy, package.files),
        "test_patch": "",
        "FAIL_TO_PASS": validated.fail_to_pass,
        "PASS_TO_PASS": validated.pass_to_pass,
        "problem_statement": _statement(package, validated, knobs),
        "family": family,
        "bug_kinds": [b.site.kind for b in validated.bugs],
    }
    (tmp / "record.json").write_text(json.dumps(record, indent=1))
    final = out / instance_id
    if final.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(final)
    return record


def task_key(family: str, seed: int, split: str, knobs: Knobs) -> str:
    return make_key(
        "repo", family=family, seed=seed, split=split, modules=knobs.modules, distractors=knobs.distractors,
        bugs=knobs.bugs, name_function=knobs.name_function,
    )  # fmt: skip


def tasks_dir() -> Path:
    return Path(cache_dir()) / "repo_repair" / f"v{GENERATOR_VERSION}"


_INDEX_LOCK = threading.Lock()
"""rows() validates tasks in threads; their lines in keys.jsonl must not interleave."""


def load_or_write(key: str, out: Path | None = None) -> tuple[dict[str, Any], Path] | None:
    """The record and repo path of `key`, written on first use (cached)."""
    out = out or tasks_dir()
    out.mkdir(parents=True, exist_ok=True)
    index = out / "keys.jsonl"
    known = _index(index)
    if key in known:
        instance = known[key]
        if instance is None:
            return None
        path = out / instance
        return json.loads((path / "record.json").read_text()), path / "repo"
    record = write_task(key, out)
    with _INDEX_LOCK, index.open("a") as f:
        f.write(json.dumps({"key": key, "instance_id": record and record["instance_id"]}) + "\n")
    if record is None:
        return None
    return record, out / record["instance_id"] / "repo"


def _index(path: Path) -> dict[str, str | None]:
    if not path.exists():
        return {}
    return {e["key"]: e["instance_id"] for e in map(json.loads, path.read_text().splitlines()) if e}


# ------------------------------------------------------------------ rows (tasks.registry's rows-module interface)

SYSTEM_PROMPT = (
    "You fix bugs in a Python repository (your working directory). Use the tools: bash, read_file, edit_file, "
    "search, run_tests. Change the code, not the tests. When the tests pass, call finish."
)


def check(env: str) -> None:
    return None


def record_row(record: dict[str, Any], repo: Path) -> dict[str, Any]:
    """The dataset row of a SWE-bench record whose repository is `repo`."""
    user = f"{record['problem_statement']}\n\nThe repository ({record['repo']}) is your working directory."
    return {
        "data_source": f"repo_repair/{record['repo']}",
        "env_class": "repo_repair",
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
        "reward_spec": {"method": "rule", "ground_truth": record},
        "extra_info": {"repo_path": str(repo), "instance_id": record["instance_id"]},
    }


def records_rows(path: str, n: int) -> list[dict[str, Any]]:
    """Rows of a user's SWE-bench jsonl: each record names its repository on disk (`repo_path`), at base_commit."""
    from thermik.errors import ThermikError

    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        repo = Path(record.get("repo_path") or "")
        if not (repo / ".git").exists():
            raise ThermikError(f"{path}:{number}: repo_path {str(repo)!r} is not a git repository on disk")
        head = _git(repo, "rev-parse", "HEAD")
        if head != record["base_commit"]:
            raise ThermikError(
                f"{path}:{number}: {repo} is at {head[:12]}, the record's base_commit is {record['base_commit'][:12]}",
                hint=f"git -C {repo} checkout {record['base_commit']}",
            )
        rows.append(record_row(record, repo))
    return rows[:n] if n else rows


def rows(env: str, n: int, seed: int, split: str, options: Any) -> list[dict[str, Any]]:
    """`n` rows of `split`: the user's records when configured, else generated tasks (held-out families for eval)."""
    cfg = options.repo_repair
    records = cfg.eval_records if split == "eval" else cfg.records
    if records:
        return records_rows(records, n)
    knobs = Knobs(cfg.modules, cfg.distractors, cfg.bugs, cfg.name_function)
    out = Path(cfg.tasks_dir) if cfg.tasks_dir else tasks_dir()
    rng = random.Random(f"repo_repair/{split}/{seed}")
    families = families_for(split)
    drawn = [task_key(rng.choice(families), rng.randrange(1_000_000), split, knobs) for _ in range(4 * n + 10)]
    keys = list(dict.fromkeys(drawn))
    found: list[dict[str, Any]] = []
    workers = len(os.sched_getaffinity(0))
    with ThreadPoolExecutor(workers, thread_name_prefix="repo-repair-gen") as pool:
        while len(found) < n and keys:
            # never more at once than are still missing, so the rows are those of validating the keys in turn
            batch, keys = keys[: min(workers, n - len(found))], keys[min(workers, n - len(found)) :]
            logger.info("repo_repair: %s tasks %d-%d of %d (validated in the sandbox when new)", split,
                        len(found) + 1, len(found) + len(batch), n)  # fmt: skip
            found += [record_row(*task) for task in pool.map(lambda key: load_or_write(key, out), batch) if task]
    if len(found) < n:
        raise ValueError(f"repo_repair: only {len(found)} of {n} {split} tasks validated")
    return found


def solve(row: dict[str, Any], options: Any) -> list[dict[str, Any]]:
    from thermik.tasks.repo_repair.expert import expert_conversation

    return expert_conversation(row, options.repo_repair)
