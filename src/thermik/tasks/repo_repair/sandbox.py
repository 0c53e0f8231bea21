"""A per-episode sandbox: a fresh copy of a repository in a temporary workspace, commands run isolated.

Every command runs in bubblewrap (`bwrap`) where it is installed:
- the system is mounted read-only, the workspace (at `/tmp/repo` inside) is the only writable host path; `/tmp`
  is a private, size-capped tmpfs;
- the invoking user's home directory is hidden (an empty tmpfs); only the Python installation the sandbox runs
  with is mounted back, read-only, when it lives there (or in /tmp, as a venv made with mktemp may);
- no network (a new, empty network namespace), its own PID, IPC and UTS namespaces, `--die-with-parent`;
- run as root, the sandbox drops to an unprivileged user of its own (`setpriv`), so `RLIMIT_NPROC` counts only
  the sandbox's processes and files outside the workspace are not writable even through a symlink;
- rlimits (bash's `ulimit`, soft and hard): CPU seconds, address space, processes, file size; a wall-clock timeout.
One sandbox (bwrap and, inside it, the small executor of executor.py) starts with an episode's first command and
runs its commands one at a time: the executor starts each with bash, reads its output, and when the command's main
process exits or its wall time runs out kills every other process of the sandbox's PID namespace (a daemonised
child included), so nothing a command starts outlives it. `close()` kills the namespace's init (the kernel then
kills everything in it) and removes the workspace. Paying bwrap's start once per episode keeps a command's
overhead to a few milliseconds over the bare command (benchmarks/repo_repair_sandbox.py).

Without bwrap the command runs under `unshare` (network, PID and mount namespaces) with the same rlimits and a
one-time warning naming the package to install: the file system is then protected by the sandbox user's file
permissions only (as root, when the interpreter is reachable by other users; else the command runs as root and
the processes limit does not apply) or not at all (as a normal user), and the home directory stays readable.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import pwd
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

INNER_WORKSPACE = "/tmp/repo"
"""Where the workspace appears inside a bubblewrap sandbox (the command's working directory)."""
_MB = 1024 * 1024
_SANDBOX_UIDS = (200_000, 100_000)
"""(first, count): the unprivileged user ids a sandbox run by root picks from, one per workspace."""
_READ_CHUNK = 1 << 20
_GRACE_S = 10.0
"""How long past a command's wall time the executor may take to answer before it is killed and replaced."""
_EXECUTOR = (Path(__file__).parent / "executor.py").read_text()


@dataclass(frozen=True)
class SandboxLimits:
    """Per command: wall clock, CPU seconds, address space, processes, largest file written, output kept."""

    wall_s: float = 30.0
    cpu_s: int = 30
    memory_mb: int = 2048
    processes: int = 64
    file_mb: int = 64
    tmp_mb: int = 256
    max_output_chars: int = 10_000


@dataclass(frozen=True)
class CommandResult:
    output: str
    """stdout and stderr interleaved, head and tail kept when longer than max_output_chars."""
    exit_code: int
    """The command's exit status; 128 + N when a signal N ended it (as a shell reports it); -9 at the timeout."""
    timed_out: bool
    seconds: float
    output_bytes: int

    def format(self) -> str:
        """The text a model sees: the output, then a status line."""
        status = f"[exit code {self.exit_code}]"
        if self.timed_out:
            status = f"[killed: the command ran past its {self.seconds:.0f} s wall-clock limit]"
        output = self.output.rstrip("\n")
        return f"{output}\n{status}" if output else status


def head_tail(data: bytes, total: int, max_chars: int) -> str:
    """`data` (the first and last bytes of `total` bytes, joined) as text, with a note where the middle was cut."""
    text = data.decode("utf-8", errors="replace")
    if total <= len(data) and len(text) <= max_chars:
        return text
    half = max_chars // 2
    omitted = total - len(data) + max(len(text) - 2 * half, 0)
    return f"{text[:half]}\n[... {omitted} bytes of output omitted ...]\n{text[len(text) - half :]}"


def head_tail_text(text: str, max_chars: int) -> str:
    """A text cut to about `max_chars`: its head and tail with a note saying how much was dropped."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[len(text) - half :]}"


@functools.cache
def bwrap_path() -> str | None:
    """bwrap, when installed and able to start a sandbox here (checked once)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-net", "--unshare-pid", "--die-with-parent"]
    if os.geteuid() != 0:
        probe.append("--unshare-user")
    try:
        ok = subprocess.run([*probe, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return path if ok else None


@functools.cache
def _warn_no_bwrap() -> None:
    logger.warning(
        "repo_repair: bubblewrap is not installed (or cannot start here); sandbox commands run under unshare + "
        "rlimits, without a read-only file system or a hidden home directory. Install the 'bubblewrap' package "
        "(apt-get install bubblewrap) for the full sandbox."
    )


def _home_dirs() -> list[str]:
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(KeyError):
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    return sorted(h for h in homes if h not in ("/", "") and os.path.isdir(h))


def _python_dirs() -> list[str]:
    """The interpreter's installation directories (mounted back read-only when they live in a hidden home)."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return sorted(dirs)


def _python_binds(hidden: str) -> list[str]:
    """bwrap arguments that mount the interpreter's directories under `hidden` (an empty tmpfs: /tmp, a home) back
    read-only, so a venv made in /tmp or in a home still runs inside."""
    argv: list[str] = []
    for d in (d for d in _python_dirs() if _under(d, hidden) and d != hidden):
        parents = [str(p) for p in reversed(Path(d).parents) if _under(str(p), hidden) and str(p) != hidden]
        argv += [a for p in parents for a in ("--perms", "0755", "--dir", p)]
        argv += ["--ro-bind", d, d]
    return argv


def _others_can_run(executable: str) -> bool:
    """Whether a user of no group can reach `executable` (without bwrap, the sandbox user sees the real paths)."""
    path = Path(os.path.realpath(executable))
    return all(p.stat().st_mode & 0o001 for p in path.parents) and bool(path.stat().st_mode & 0o001)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Sandbox:
    """One episode's workspace and its commands. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        repo: Path | None,
        limits: SandboxLimits | None = None,
        *,
        use_bwrap: bool | None = None,
        adopt: Path | None = None,
    ) -> None:
        """A fresh workspace holding a copy of `repo` (empty when None), removed by `close`; or, with `adopt`, an
        existing workspace whose owner removes it (the MCP pool's per-episode data copy)."""
        self.limits = limits or SandboxLimits()
        self._root = None if adopt is not None else Path(tempfile.mkdtemp(prefix="thermik-repo-"))  # 0700, ours
        self.workspace = Path(adopt) if adopt is not None else self._root / "repo"  # type: ignore[operator]
        try:
            if adopt is None and repo is None:
                self.workspace.mkdir()
            elif adopt is None:
                shutil.copytree(repo, self.workspace, symlinks=True)  # type: ignore[arg-type]
        except OSError:
            shutil.rmtree(self._root, ignore_errors=True)  # type: ignore[arg-type]
            raise
        self._bwrap = bwrap_path() if use_bwrap is None or use_bwrap else None
        if use_bwrap and self._bwrap is None:
            raise RuntimeError("bubblewrap (bwrap) is not available")
        if self._bwrap is None:
            _warn_no_bwrap()
        drop = os.geteuid() == 0 and (self._bwrap is not None or _others_can_run(sys.executable))
        self.uid = _SANDBOX_UIDS[0] + random.randrange(_SANDBOX_UIDS[1]) if drop else None
        self._give_workspace()
        self._executor: _Executor | None = None
        self._lock = threading.Lock()
        self.closed = False
        self.seconds = 0.0
        """Wall seconds spent in commands so far."""

    @property
    def isolation(self) -> str:
        return "bwrap" if self._bwrap else "unshare"

    def _give_workspace(self) -> None:
        """As root: the sandbox user owns the workspace (and nothing else)."""
        os.chmod(self.workspace, 0o755)
        if self.uid is None:
            return
        for dirpath, dirnames, filenames in os.walk(self.workspace):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, self.uid, self.uid)

    def script(self, command: str) -> str:
        """The bash script one command runs as: its limits, then the command."""
        lim = self.limits
        # bash's ulimit sets the hard limits too, so the command cannot raise them.
        ulimit = f"ulimit -t {lim.cpu_s} -v {lim.memory_mb * 1024} -u {self._nproc()} -f {lim.file_mb * 1024} -c 0"
        return f"{ulimit} || exit 126\n{command}"

    def argv(self) -> list[str]:
        """The command line of the episode's executor: isolated, as the sandbox user, reading requests on stdin."""
        drop = []
        if self.uid is not None:
            drop = [shutil.which("setpriv") or "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}"]
            drop += ["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        executor = [sys.executable, "-I", "-S", "-c", _EXECUTOR]
        if self._bwrap is None:
            outer = [shutil.which("unshare") or "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
            if os.geteuid() != 0:
                outer.append("--map-root-user")
            return [*outer, *drop, *executor]
        return [*self._bwrap_argv(), "--", *drop, *executor]

    def _bwrap_argv(self) -> list[str]:
        assert self._bwrap is not None
        argv = [self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        argv += ["--perms", "1777", "--size", str(self.limits.tmp_mb * _MB), "--tmpfs", "/tmp", *_python_binds("/tmp")]
        for home in _home_dirs():
            argv += ["--tmpfs", home, *_python_binds(home)]
        argv += ["--bind", str(self.workspace), INNER_WORKSPACE, "--chdir", INNER_WORKSPACE]
        argv += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if os.geteuid() != 0:
            argv.append("--unshare-user")
        return [*argv, "--die-with-parent", "--new-session"]

    def _nproc(self) -> int:
        """RLIMIT_NPROC counts every process of the user: a non-root user's own processes come on top."""
        if self.uid is not None:
            return self.limits.processes
        uid = os.getuid()
        own = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)
        return own + self.limits.processes

    def _env(self) -> dict[str, str]:
        home = INNER_WORKSPACE if self._bwrap else str(self.workspace)
        path = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]))
        return {"PATH": path, "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0", "TERM": "dumb"}  # fmt: skip

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run a bash command in the workspace; every process it started is gone when this returns. Never raises for
        anything the command does."""
        wall = min(timeout_s or self.limits.wall_s, self.limits.wall_s)
        keep = 2 * self.limits.max_output_chars
        with self._lock:
            if self.closed:
                raise RuntimeError("the sandbox is closed")
            start = time.monotonic()
            if self._executor is None:
                try:
                    self._executor = _Executor.start(self.argv(), self.workspace, self._env(), self._bwrap is not None)
                except OSError:
                    if self.closed:  # the workspace went with close()
                        raise RuntimeError("the sandbox is closed") from None
                    raise
                if self.closed:  # close() ran while it started (close kills what it finds in self._executor)
                    self._executor.kill()
                    self._executor.close_pipes()
                    raise RuntimeError("the sandbox is closed")
            reply = self._executor.request({"script": self.script(command), "wall_s": wall, "keep": keep})
            if reply is None:  # the executor died or hung (killed by the command, or the sandbox closed): a new one
                self._executor.kill()
                self._executor.close_pipes()
                self._executor = None
                timed_out = time.monotonic() - start >= wall
                reply = {"head": "", "tail": "", "total": 0, "code": -9, "timed_out": timed_out}
            if self.closed and self._executor is not None:  # closed meanwhile: nothing may outlive close()
                self._executor.kill()
                self._executor.close_pipes()
                self._executor = None
            seconds = time.monotonic() - start
            self.seconds += seconds
        data = base64.b64decode(reply["head"]) + base64.b64decode(reply["tail"])
        output = head_tail(data, reply["total"], self.limits.max_output_chars)
        return CommandResult(output, reply["code"], reply["timed_out"], seconds, reply["total"])

    def close(self) -> None:
        """Kill the sandbox's processes (its PID namespace) and remove the workspace. Idempotent."""
        self.closed = True
        executor = self._executor
        if executor is not None:
            executor.kill()
            if self._lock.acquire(blocking=False):  # no command is reading from it
                executor.close_pipes()
                self._executor = None
                self._lock.release()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return None


class _Executor:
    """The episode's executor process: bwrap (or unshare) running executor.py in the sandbox."""

    def __init__(self, proc: subprocess.Popen[bytes], inner_pid: int | None) -> None:
        self.proc, self.inner_pid = proc, inner_pid
        """inner_pid: bwrap's child, the PID namespace's init: killing it kills everything in the namespace."""

    @classmethod
    def start(cls, argv: list[str], cwd: Path, env: dict[str, str], bwrap: bool) -> _Executor:
        info_r, info_w = os.pipe()  # bwrap writes its child's pid there: killed even if bwrap itself dies first
        if bwrap:
            argv = [argv[0], "--info-fd", str(info_w), *argv[1:]]
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(info_w,),
            )  # fmt: skip
        finally:
            os.close(info_w)
        try:
            info = _read_all(info_r, time.monotonic() + 30) if bwrap else b""
        finally:
            os.close(info_r)
        match = re.search(rb'"child-pid"\s*:\s*(\d+)', info)
        return cls(proc, int(match.group(1)) if match else None)

    def request(self, message: dict[str, object]) -> dict[str, object] | None:
        """Send one request; its reply, or None when the executor is gone or silent past the wall time."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return None
        line = _read_line(self.proc.stdout.fileno(), time.monotonic() + float(message["wall_s"]) + _GRACE_S)  # type: ignore[arg-type]
        try:
            return json.loads(line) if line else None
        except json.JSONDecodeError:
            return None

    def kill(self) -> None:
        """SIGKILL the namespace's init (the kernel then kills every process in it) and the executor's group."""
        for kill, pid in ((os.kill, self.inner_pid), (os.killpg, self.proc.pid)):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()

    def close_pipes(self) -> None:
        """After `kill`, by the thread that talks to the executor (closing them under a reader would hang it)."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]


def _read_all(fd: int, deadline: float) -> bytes:
    """Everything until EOF or the deadline."""
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=deadline - time.monotonic()):
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    break
                data += chunk
    return data


def _read_line(fd: int, deadline: float) -> bytes:
    """One line (the executor's reply); b'' at EOF or the deadline."""
    data = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n") and time.monotonic() < deadline:
            if sel.select(timeout=max(deadline - time.monotonic(), 0)):
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return b""
                data += chunk
    return bytes(data) if data.endswith(b"\n") else b""
