"""Check that each repo-repair sandbox test fails when its guard is removed (a mutation check of the sandbox tests).

For each guard it copies src/ to a temporary directory, removes the guard there (one exact text edit of sandbox.py or
executor.py), and runs the test that covers it against that copy; every line must read "fails". Needs bubblewrap.

    python scripts/repo_repair_guards.py [GUARD ...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = "thermik/tasks/repo_repair/sandbox.py"
EXECUTOR = "thermik/tasks/repo_repair/executor.py"
GUARDS = {  # name: (file, the guard's text, the text without it, the tests (-k) that must fail)
    "network": (SANDBOX, '"--unshare-net", "--unshare-pid", "--unshare-ipc"', '"--unshare-pid", "--unshare-ipc"',
                "test_no_network"),
    "read-only system": (SANDBOX, '[self._bwrap, "--ro-bind", "/", "/"', '[self._bwrap, "--bind", "/", "/"',
                         "test_no_write_outside"),
    "hidden home": (SANDBOX, 'argv += ["--tmpfs", home, *_python_binds(home)]', "pass", "home"),
    "process limit": (SANDBOX, "-u {self._nproc()} ", "", "test_a_fork_bomb"),
    "memory limit": (SANDBOX, "-v {lim.memory_mb * 1024} ", "", "test_a_memory_bomb"),
    "wall time": (EXECUTOR, 'deadline = start + request["wall_s"]', "deadline = start + 1e6", "test_an_infinite_loop"),
    "kill the rest": (EXECUTOR, "    me = os.getpid()\n", "    return\n    me = os.getpid()\n", "test_a_daemonised"),
    "output cut": (SANDBOX, "    if total <= len(data) and len(text) <= max_chars:\n        return text",
                   "    return text", "test_a_gigabyte"),
    "kill on close": (SANDBOX, "            executor.kill()\n            if self._lock", "            if self._lock",
                      "random_kills and not 200"),
    "workspace removal": (SANDBOX, "            shutil.rmtree(self._root, ignore_errors=True)\n\n    def __enter__",
                          "            pass\n\n    def __enter__", "random_kills and not 200"),
}  # fmt: skip


def check(name: str, tmp: Path) -> bool:
    path, guard, without, tests = GUARDS[name]
    src = tmp / name.replace(" ", "-") / "src"
    shutil.copytree(ROOT / "src", src)
    text = (src / path).read_text()
    if text.count(guard) != 1:
        raise SystemExit(f"{name}: the guard's text occurs {text.count(guard)} times in {path}; update this script")
    (src / path).write_text(text.replace(guard, without))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_repo_repair_sandbox.py"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    result = subprocess.run(["timeout", "300", *cmd, "-k", tests], env=env, cwd=ROOT, capture_output=True, text=True)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{name:18s} {'fails' if result.returncode else 'PASSES: the guard is untested'}  ({summary})", flush=True)
    return result.returncode != 0


def main() -> None:
    names = sys.argv[1:] or list(GUARDS)
    with tempfile.TemporaryDirectory(prefix="thermik-guards-") as tmp:
        results = [check(name, Path(tmp)) for name in names]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
