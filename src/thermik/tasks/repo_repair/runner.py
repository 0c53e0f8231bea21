"""The lean test runner that validates bug candidates inside a task's sandbox (run as `python runner.py REQUEST`).

Validating a candidate with `python -m pytest` pays Python's start, pytest's import and its collection each time
(about half a second idle, several seconds on a loaded machine). This runner imports pytest once (the generated
tests use `pytest.approx`), then for each candidate forks: the child writes the candidate's files over the clean
package, imports each test file and calls its `test_*` functions, and sends back each test's outcome (PASSED or
FAILED; ERROR for a test file that does not import, as pytest reports it); the parent restores the clean files. A
child past its time is killed by SIGALRM and the candidate's outcome is null (rejected). The request is a JSON
file: {"tests": [test file paths], "candidates": [{path: text}, ...], "timeout_s": s, "out": results path}; the
results file holds one outcome map (test id -> outcome) or null per candidate. Test ids are pytest's
(`tests/test_core.py::test_f_0`), and the outcomes agree with pytest's on the generated packages
(tests/test_repo_repair.py checks it). Standard library and pytest only: it runs under the sandbox's Python.
"""

import ast
import importlib.util
import json
import os
import sys


def test_names(path: str) -> list[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]


def run_tests(tests: list[str]) -> dict[str, str]:
    """Each test's outcome, in this (forked) process. Like pytest (without --continue-on-collection-errors), a test
    file that does not import stops the run: the outcome is then ERROR for each such file and nothing else."""
    modules, errors = [], {}
    for number, path in enumerate(tests):
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        try:
            spec = importlib.util.spec_from_file_location(f"_thermik_test_{number}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            modules.append((path, module))
        except BaseException:
            errors[path] = "ERROR"
    if errors:
        return errors
    outcomes = {}
    for path, module in modules:
        for name in test_names(path):
            try:
                getattr(module, name)()
                outcomes[f"{path}::{name}"] = "PASSED"
            except BaseException:
                outcomes[f"{path}::{name}"] = "FAILED"
    return outcomes


def write_files(files: dict) -> None:
    for path, text in files.items():
        with open(path, "w") as f:
            f.write(text)


def run_candidate(tests: list[str], files: dict, timeout_s: int) -> dict | None:
    """The outcomes with `files` written over the clean package, in a forked child; None if it died or ran late."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 1
        try:
            import signal

            signal.alarm(timeout_s)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            write_files(files)
            os.write(write_end, json.dumps(run_tests(tests)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return json.loads(data) if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else None


def main() -> None:
    import pytest  # noqa: F401  (imported once, before the forks: the test files use pytest.approx)

    with open(sys.argv[1]) as f:
        request = json.load(f)
    sys.path.insert(0, os.getcwd())
    results = []
    for files in request["candidates"]:
        clean = {}
        for path in files:
            with open(path) as f:
                clean[path] = f.read()
        results.append(run_candidate(request["tests"], files, request["timeout_s"]))
        write_files(clean)
    with open(request["out"], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
