"""The child-process side of `agent.entrypoint`: import `pkg.module:function`, call it with the task row and the
client config, write what it returns as JSON to THERMIK_RESULT_FILE (agents/process.py).

Run by path in the harness's interpreter (`agent.python`: e.g. the harness venv's), so it imports only the standard
library: `python bootstrap.py pkg.module:function`. The function may be sync or async; it gets
`(task, client)` with `client = {"base_url", "api_key", "model", "reward_url"}`.

`python bootstrap.py --serve pkg.module:function` is the fork server of `agent.preload` (agents/fork_server.py): it
imports the module once, then forks one child per episode. It reads one JSON line per episode on stdin
(`{"id", "env", "stdout", "stderr"}`) and answers on stdout `{"id", "pid"}` once the child runs and
`{"pid", "code"}` when it exits (the code as a process's return code: negative for a signal). Each child starts a
session of its own, dies with the server, takes the episode's environment and output files, and runs the episode
as `main` does; the server exits when its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import inspect
import json
import os
import select
import signal
import sys
import traceback
from typing import Any

PR_SET_PDEATHSIG = 1


def load(target: str) -> Any:
    module_name, _, function_name = target.partition(":")
    sys.path[0] = os.getcwd()  # the user's modules, not this script's folder (thermik/agents)
    return getattr(importlib.import_module(module_name), function_name)


def call(function: Any) -> None:
    task = json.loads(os.environ["THERMIK_TASK"])
    client = {
        "base_url": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
        "model": os.environ["OPENAI_MODEL"],
        "reward_url": os.environ.get("EPISODE_REWARD_URL", ""),
    }
    result = function(task, client)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    with open(os.environ["THERMIK_RESULT_FILE"], "w") as f:
        json.dump(result, f)


def main(target: str) -> None:
    call(load(target))


def serve(target: str) -> None:
    """The fork server (see the module docstring)."""
    requests, replies = os.dup(0), os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # the module's own prints must not reach the reply stream
    function = load(target)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(replies)
        if requests in ready:
            data = os.read(requests, 65536)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                request, server = json.loads(line), os.getpid()
                sys.stdout.flush(), sys.stderr.flush()  # nothing buffered here is written twice
                pid = os.fork()
                if pid == 0:
                    _child(function, request, server, (requests, wake_r, wake_w, replies.fileno()))
                replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")


def _reap(replies: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(function: Any, request: dict[str, Any], server: int, server_fds: tuple[int, ...]) -> None:
    """One episode in a forked child: never returns."""
    code = 0
    try:
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:  # the server died before the request took hold
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
        os.environ.update(request["env"])
        call(function)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main(sys.argv[1])
