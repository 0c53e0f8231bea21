"""A per-episode sandbox: a fresh copy of a repository in a temporary workspace, commands run isolated.

Every command runs in bubblewrap (`bwrap`) where it is installed:
- the system is mounted read-only, the workspace (at `/tmp/repo` inside) is the only writable host path; `/tmp`
  is a private, size-capped tmpfs;
- the invoking user's home directory is hidden (an empty tmpfs); only the Python installation the sandbox runs
  with is mounted back, read-only, when it lives there;
- no network (a new, empty network namespace), its own PID, IPC and UTS namespaces, `--die-with-parent`;
- run as root, the command drops to an unprivileged user of its own (`setpriv`), so `RLIMIT_NPROC` counts only
  the sandbox's processes and files outside the workspace are not writable even through a symlink;
- rlimits (bash's `ulimit`, soft and hard): CPU seconds, address space, processes, file size; a wall-clock timeout.
When the command's main process exits, or at the timeout, the whole tree is killed: the PID namespace's init
dies and the kernel kills everything in it (a daemonised child included). `close()` removes the workspace.

Without bwrap the command runs under `unshare` (network, PID and mount namespaces) with the same rlimits and a
one-time warning naming the package to install: the file system is then protected by the sandbox user's file
permissions only (as root, when the interpreter is reachable by other users; else the command runs as root and
the processes limit does not apply) or not at all (as a normal user), and the home directory stays readable.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
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
_F_SETPIPE_SZ = 1031


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
        self._running: set[_Command] = set()
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

    def argv(self, command: str) -> list[str]:
        """The full command line that runs `command` (a bash script) in this sandbox."""
        lim = self.limits
        # bash's ulimit sets the hard limits too (so the command cannot raise them) without another exec.
        ulimit = f"ulimit -t {lim.cpu_s} -v {lim.memory_mb * 1024} -u {self._nproc()} -f {lim.file_mb * 1024} -c 0"
        drop = []
        if self.uid is not None:
            drop = [shutil.which("setpriv") or "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}"]
            drop += ["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        script = ["/bin/bash", "-c", f"{ulimit} || exit 126\n{command}"]
        if self._bwrap is None:
            outer = [shutil.which("unshare") or "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
            if os.geteuid() != 0:
                outer.append("--map-root-user")
            return [*outer, *drop, *script]
        return [*self._bwrap_argv(), "--", *drop, *script]

    def _bwrap_argv(self) -> list[str]:
        assert self._bwrap is not None
        argv = [self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        argv += ["--perms", "1777", "--size", str(self.limits.tmp_mb * _MB), "--tmpfs", "/tmp"]
        for home in _home_dirs():
            argv += ["--tmpfs", home]
            for d in (d for d in _python_dirs() if _under(d, home) and d != home):
                parents = [str(p) for p in reversed(Path(d).parents) if _under(str(p), home) and str(p) != home]
                argv += [a for p in parents for a in ("--perms", "0755", "--dir", p)]
                argv += ["--ro-bind", d, d]
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
        """Run a bash command in the workspace; its whole process tree is gone when this returns. Never raises for
        anything the command does."""
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        wall = min(timeout_s or self.limits.wall_s, self.limits.wall_s)
        start = time.monotonic()
        info_r, info_w = os.pipe()  # bwrap writes its child's pid there: killed even if bwrap itself is killed first
        argv = self.argv(command)
        if self._bwrap is not None:
            argv[1:1] = ["--info-fd", str(info_w)]
        try:
            proc = subprocess.Popen(
                argv, cwd=self.workspace, env=self._env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(info_w,),
            )  # fmt: skip
        except OSError:
            os.close(info_r)
            if self.closed:  # closed by another thread meanwhile
                raise RuntimeError("the sandbox is closed") from None
            raise
        finally:
            os.close(info_w)
        cmd = _Command(proc, info_r)
        self._running.add(cmd)
        try:
            timed_out = cmd.read_until_exit(start + wall, self.limits.max_output_chars)
        finally:
            cmd.kill()
            cmd.close()
            self._running.discard(cmd)
        seconds = time.monotonic() - start
        self.seconds += seconds
        code = -9 if timed_out else _shell_status(proc.returncode)
        output = head_tail(bytes(cmd.head + cmd.tail), cmd.total, self.limits.max_output_chars)
        return CommandResult(output, code, timed_out, seconds, cmd.total)

    def close(self) -> None:
        """Kill whatever still runs and remove the workspace. Idempotent."""
        self.closed = True
        for cmd in list(self._running):
            cmd.kill()
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


class _Command:
    """One running command: its bwrap/unshare process, bwrap's info pipe, the output kept so far."""

    def __init__(self, proc: subprocess.Popen[bytes], info_fd: int) -> None:
        self.proc, self.info_fd = proc, info_fd
        self.info = bytearray()
        self.inner_pid: int | None = None
        """bwrap's child, the PID namespace's init: killing it kills everything in the namespace."""
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def read_until_exit(self, deadline: float, max_chars: int) -> bool:
        """Read the output until the main process exits (then what is left) or the deadline; keep the first and the
        last `2 * max_chars` bytes. Returns whether the deadline was reached."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.fileno()
        os.set_blocking(out, False)
        with contextlib.suppress(OSError):  # a larger pipe: fewer wake-ups for a flood of output
            fcntl.fcntl(out, _F_SETPIPE_SZ, _READ_CHUNK)
        os.set_blocking(self.info_fd, False)
        exited = False
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            sel.register(self.info_fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and not exited:
                    return True
                ready = {key.fd for key, _ in sel.select(timeout=1.0 if exited else min(remaining, 0.05))}
                if self.info_fd in ready and not self._read_info():
                    sel.unregister(self.info_fd)
                chunk = _read_chunk(out) if out in ready else b""
                if chunk is None:  # EOF: every writer is gone
                    return False
                if chunk:
                    self._keep(chunk, 2 * max_chars)
                elif exited:  # killed with the tree, the writers left behind close the pipe within a second
                    return False
                if not exited and self.proc.poll() is not None:
                    exited = True
                    self.kill()

    def _keep(self, chunk: bytes, keep: int) -> None:
        self.total += len(chunk)
        room = keep - len(self.head)
        self.head += chunk[:room]
        self.tail += chunk[room:] if room > 0 else chunk
        del self.tail[: max(len(self.tail) - keep, 0)]

    def _read_info(self) -> bool:
        """Read bwrap's info JSON; False at its end."""
        data = _read_chunk(self.info_fd)
        if data:
            self.info += data
            match = re.search(rb'"child-pid"\s*:\s*(\d+)', self.info)
            self.inner_pid = int(match.group(1)) if match else None
        return data is not None

    def kill(self) -> None:
        """SIGKILL bwrap's child (the namespace's init: the kernel then kills every process in the namespace) and
        the command's process group (bwrap or unshare and anything still in its group)."""
        if self.inner_pid is None and self.info_fd >= 0:
            with contextlib.suppress(OSError):
                self._read_info()
        for kill, pid in ((os.kill, self.inner_pid), (os.killpg, self.proc.pid)):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Close the pipes (the thread that ran the command does, after `kill`)."""
        if self.info_fd >= 0:
            os.close(self.info_fd)
            self.info_fd = -1
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _read_chunk(fd: int) -> bytes | None:
    """Up to one chunk; b'' when nothing is ready, None at EOF."""
    try:
        data = os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return b""
    return data or None


def _shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
