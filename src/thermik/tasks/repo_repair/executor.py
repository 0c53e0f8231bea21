"""The command executor that runs inside an episode's sandbox (started once per episode, as `python -I -S -c`).

It reads one JSON request per line on stdin ({"script", "wall_s", "keep"}), runs the script with bash in a new
session, reads its output (stdout and stderr interleaved) until the script exits or its wall time runs out,
keeping the first and last `keep` bytes, then kills every other process of the sandbox's PID namespace (a
daemonised child too) and answers one JSON line on stdout: {"head", "tail" (base64), "total", "code",
"timed_out", "seconds"}. Standard library only: it runs under the sandbox's Python with nothing else importable.
"""

import base64
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time

CHUNK = 1 << 20


def kill_others(script_pid: int) -> None:
    """SIGKILL every process of this PID namespace but its init and this one, until none is left; reap those that
    are ours (all orphans, when this is the namespace's init), but the script, whose status Popen reads."""
    me = os.getpid()
    for _ in range(200):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others or (others == [script_pid] and _is_zombie(script_pid)):
            return
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in others:
            if pid != script_pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        time.sleep(0.001)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def keep_chunk(state: dict, chunk: bytes, keep: int) -> None:
    state["total"] += len(chunk)
    head, tail = state["head"], state["tail"]
    room = keep - len(head)
    head += chunk[:room]
    tail += chunk[room:] if room > 0 else chunk
    del tail[: max(len(tail) - keep, 0)]


def read_output(proc: subprocess.Popen, state: dict, deadline: float, keep: int) -> bool:
    """Read until the script exits (then what is left, briefly) or the deadline; True at the deadline."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    exited = False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not exited:
                return True
            ready = sel.select(timeout=0.2 if exited else min(remaining, 0.05))
            try:
                chunk = os.read(fd, CHUNK) if ready else b""
            except BlockingIOError:
                chunk = b""
            if ready and not chunk:  # EOF: every writer is gone
                return False
            if chunk:
                keep_chunk(state, chunk, keep)
            elif exited:  # a writer left behind: killed below
                return False
            if not exited and proc.poll() is not None:
                exited = True
                kill_others(proc.pid)


def run(request: dict) -> dict:
    start = time.monotonic()
    state = {"head": bytearray(), "tail": bytearray(), "total": 0}
    proc = subprocess.Popen(
        ["/bin/bash", "-c", request["script"]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = start + request["wall_s"]
    timed_out = read_output(proc, state, deadline, request["keep"])
    if not timed_out:  # the output ended (EOF) before the script: it runs on until it exits or its time is up
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            timed_out = True
    kill_others(proc.pid)
    proc.wait()
    proc.stdout.close()
    code = proc.returncode
    head, tail = (base64.b64encode(bytes(state[k])).decode() for k in ("head", "tail"))
    status = -9 if timed_out else (128 - code if code < 0 else code)
    return {"head": head, "tail": tail, "total": state["total"], "code": status, "timed_out": timed_out}


def main() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        out.write(json.dumps(run(json.loads(line))).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
