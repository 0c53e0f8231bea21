"""`thermik rl @ FILE.toml --split`: the split run's three processes from one command (docs/process_split.md).

Starts `thermik inference`, `thermik trainer` and `thermik orchestrator` on the same arguments, each in a session of
its own and SIGKILLed by the kernel when the launcher dies, however it dies (thermik.lifetime), and streams their
output line by line with the process's name as a prefix. The run ends well when the trainer and the orchestrator
have both exited with 0: the server is then stopped. Any other exit (a non-zero code, a signal, the server leaving
early) stops the other processes and names the one that ended and why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from thermik.config.schema import ServerConfig
from thermik.errors import ThermikError
from thermik.inference.server.run import check_port_free
from thermik.lifetime import dying_with_parent

PROCESSES = ("inference", "trainer", "orchestrator")
DEFAULT_PORTS = {"http": 80, "https": 443}
FINISHERS = frozenset({"trainer", "orchestrator"})  # the run is over when both exit with 0
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this long
POLL_S = 0.2
_print_lock = threading.Lock()


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[str]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=3))  # its last lines, for the stop message


def check_server_reachable(server: ServerConfig, base_url: str) -> None:
    """The orchestrator samples from inference.base_url: it must name the port of the server the launcher starts
    (else the orchestrator waits for a server that is not there until split.wait_timeout_s)."""
    url = urlparse(base_url)
    port = url.port or DEFAULT_PORTS.get(url.scheme)
    if server.port == 0 or port != server.port:
        raise ThermikError(
            f"inference.base_url {base_url!r} does not reach the server this run starts on server.port {server.port}",
            hint="give both the same fixed port, e.g. --server.port 8001 --inference.base_url http://127.0.0.1:8001",
        )


def launch_split(argv: list[str], server: ServerConfig, base_url: str, asynchronous: bool = False) -> int:
    """Run the three processes on `argv` (a config's `@ FILE` and overrides; `server`: its [server] section,
    `base_url`: inference.base_url, `asynchronous`: max_async_steps > 0); returns the exit code of the run. A taken
    server.port, or an inference.base_url that does not reach the server this launcher starts, is refused before
    anything starts."""
    check_server_reachable(server, base_url)
    check_port_free(server)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # a stopped launcher stops its children
    threads = torch_threads(asynchronous, os.environ, os.cpu_count() or 1)
    children: list[Child] = []
    try:
        for name in PROCESSES:
            children.append(_start(name, argv, threads.get(name)))
        return _supervise(children)
    finally:
        _stop(children)


def torch_threads(asynchronous: bool, environ: Mapping[str, str], cpus: int) -> dict[str, int]:
    """Torch threads per process name. Asynchronous, the server decodes while the trainer trains, here on the same
    cores: each OpenMP team of all the cores would spin against the other, so each takes half of them (as
    `thermik rl` splits its threads between the two halves: runs/local.thread_split) and the orchestrator, which
    runs no model, one. Synchronous runs, or an OMP_NUM_THREADS the user set, keep the defaults."""
    if not asynchronous or "OMP_NUM_THREADS" in environ:
        return {}
    half = max(1, cpus // 2)
    return {"inference": half, "trainer": max(1, cpus - half), "orchestrator": 1}


def _start(name: str, argv: list[str], threads: int | None = None) -> Child:
    env = None if threads is None else {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(
        dying_with_parent([sys.executable, "-m", "thermik.cli", name, *argv]),  # SIGKILLed when the launcher dies
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own process group: stopping it stops what it started
    )
    child = Child(name, proc)
    threading.Thread(target=_stream, args=(child,), daemon=True).start()
    _say(f"[split] started {name} (pid {proc.pid})")
    return child


def _stream(child: Child) -> None:
    assert child.proc.stdout is not None
    for line in child.proc.stdout:
        child.tail.append(line.rstrip())
        _say(f"[{child.name}] {line.rstrip()}")


def _say(line: str, file: object = None) -> None:
    with _print_lock:
        print(line, file=file or sys.stdout, flush=True)


def _supervise(children: list[Child]) -> int:
    """Wait until both finishers exit with 0 (returns 0) or any process ends otherwise (returns its failure)."""
    finished: set[str] = set()
    while True:
        for child in children:
            code = child.proc.poll()
            if code is None or child.name in finished:
                continue
            if code == 0 and child.name in FINISHERS:
                finished.add(child.name)
                if finished == FINISHERS:
                    _say("[split] the trainer and the orchestrator finished; stopping the inference server")
                    return 0
                continue
            _report(child, code, [c.name for c in children if c is not child and c.proc.poll() is None])
            return code if code > 0 else 1
        time.sleep(POLL_S)


def _report(child: Child, code: int, running: list[str]) -> None:
    time.sleep(POLL_S)  # let its last lines reach the tail
    if code < 0:
        why = f"killed by {signal.Signals(-code).name}"
    elif code == 0:
        why = "exited with code 0 before the run ended"
    else:
        why = f"exited with code {code}"
    last = f"; its last line: {child.tail[-1]!r}" if child.tail else ""
    stopping = f"; stopping {', '.join(running)}" if running else ""
    _say(f"thermik rl --split: the {child.name} process (pid {child.proc.pid}) {why}{last}{stopping}", sys.stderr)


def _stop(children: list[Child]) -> None:
    """SIGTERM to every live process group, SIGKILL to what is left after STOP_GRACE_S."""
    live = [c for c in children if c.proc.poll() is None]
    for child in children:  # an exited process's group too: what it started (MCP servers) goes with it
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in live:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.proc.wait()
        _say(f"[split] stopped {child.name} (pid {child.proc.pid})")


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, sig)
