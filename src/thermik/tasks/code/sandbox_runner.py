"""Run untrusted Python in a child process with limits. Used by the `python_sandbox` MCP server.

What is enforced, and how (docs/environments.md says the same):
- wall clock: the child's whole process group is killed after `wall_s`, and the child is SIGKILLed when the
  process running it dies (thermik.lifetime), so nothing outlives the clock's keeper;
- CPU: RLIMIT_CPU (the kernel sends SIGXCPU, then SIGKILL);
- memory: RLIMIT_AS (allocations beyond it fail with MemoryError);
- output: stdout/stderr go to files capped by RLIMIT_FSIZE and are cut to `max_output_chars`;
- network: the child runs in a fresh network namespace (`unshare -rn`, loopback only and down) when the
  kernel allows unprivileged user namespaces; in every case an audit hook (PEP 578) refuses socket creation;
- processes: the audit hook refuses fork/exec/spawn/subprocess, loading native code through ctypes and
  changing resource limits, which stops fork bombs written in Python;
- files: cwd, HOME and TMPDIR are a fresh temp dir removed afterwards; the audit hook refuses opening for
  writing, creating, renaming or removing any path outside it.
Audit hooks are not a security boundary against hostile native code (a C extension already installed could
bypass them); they stop what model-written Python does by accident or on purpose through the standard library.
The network namespace is a kernel boundary; the file-system rule is not (no mount namespace or chroot).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from thermik.lifetime import die_with_parent_source

MAX_CODE_CHARS = 100_000
_MB = 1024 * 1024

# Runs first in the child: set the resource limits (here rather than in a preexec_fn, which is unsafe in a
# threaded server), install the audit hook, then execute main.py. Paths are checked after realpath,
# relative to the sandbox dir (the cwd); file descriptors (ints) are allowed, they were opened already.
_BOOTSTRAP = r"""
import os, resource, sys
cpu_s, memory_bytes, file_bytes = (int(a) for a in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
           "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "socket.__new__", "socket.connect",
           "socket.bind", "socket.getaddrinfo", "os.kill", "os.killpg", "sys.remote_exec", "resource.setrlimit",
           "resource.prlimit"}
PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
               "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
               "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (1,), "os.chdir": (0,),
               "sqlite3.connect": (0,)}
def inside(path):
    if isinstance(path, int):
        return True
    path = os.fsdecode(path)
    real = os.path.realpath(os.path.join(ROOT, path))
    return real == ROOT or real.startswith(ROOT + os.sep) or real == "/dev/null"
def hook(event, args):
    if event in BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and args and (args[2] & WRITE_FLAGS or (args[1] or "r").strip("rbt")) and not inside(args[0]):
        raise PermissionError(f"sandbox: writing outside the sandbox directory is not allowed: {args[0]}")
    if event in PATH_EVENTS and not all(inside(args[i]) for i in PATH_EVENTS[event] if i < len(args)):
        raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed")
with open("main.py", encoding="utf-8") as f:
    source = f.read()
code = compile(source, "main.py", "exec")
sys.addaudithook(hook)
sys.argv = ["main.py"]
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_chars: int = 10_000
    max_file_mb: int = 16


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int
    """The child's exit status; negative: killed by that signal."""
    timed_out: bool

    def format(self) -> str:
        """The text the model sees."""
        status = f"exit code {self.exit_code}" + (" (wall-clock limit reached)" if self.timed_out else "")
        if self.exit_code < 0:
            status += f" (killed by {_signal_name(-self.exit_code)})"
        return f"{status}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@functools.cache
def network_namespace_available() -> bool:
    """Whether `unshare -rn` works here (unprivileged user + network namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        return subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_python(code: str, limits: SandboxLimits) -> RunResult:
    """Run `code` as main.py in a fresh temp dir under `limits`; never raises for anything the code does."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a string, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise ValueError(f"code is too long ({len(code)} > {MAX_CODE_CHARS} chars)")
    with tempfile.TemporaryDirectory(prefix="thermik-sandbox-") as root:
        work, logs = Path(root, "work"), Path(root, "logs")
        work.mkdir()
        logs.mkdir()
        (work / "main.py").write_text(code, encoding="utf-8")
        rlimits = (limits.cpu_s, limits.memory_mb * _MB, limits.max_file_mb * _MB)
        # Dies with this process (the wall clock is enforced here), set after `unshare -r`, which would clear it.
        bootstrap = die_with_parent_source(os.getpid()) + _BOOTSTRAP
        argv = [sys.executable, "-I", "-B", "-c", bootstrap, *map(str, rlimits)]
        if network_namespace_available():
            argv = [shutil.which("unshare") or "unshare", "-rn", *argv]
        env = {"HOME": str(work), "TMPDIR": str(work), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True,
            )  # fmt: skip
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        return RunResult(
            stdout=_read_capped(logs / "stdout", limits.max_output_chars),
            stderr=_read_capped(logs / "stderr", limits.max_output_chars),
            exit_code=proc.returncode,
            timed_out=timed_out,
        )


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _read_capped(path: Path, max_chars: int) -> str:
    with path.open("rb") as f:
        data = f.read(max_chars * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    size = path.stat().st_size
    if len(text) > max_chars or size > len(data):
        return text[:max_chars] + f"\n... [output cut; {size} bytes in all]"
    return text


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
