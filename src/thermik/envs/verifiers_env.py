"""verifiers v1 environments: `verifiers:<taskset id>`, run by verifiers itself in a venv of its own.

verifiers 0.4 cannot share thermik's venv (it pins mcp==2.0.0 and openai<3). This process starts
`verifiers_bridge.py` under that venv's python; the bridge starts verifiers' own env server (or connects to one at
`env.verifiers.address`) and drives it with verifiers' own `EnvClient`, in JSON lines on its stdin/stdout. An
episode runs entirely in verifiers (its harness, tools and rewards); its model calls come back to this process's
engine through a capture episode's token-in `/inference/v1/generate` endpoint (thermik.agents.verifiers_episode,
which records the samples). docs/environments.md, "verifiers v1".
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import itertools
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, ClassVar

from thermik.config.schema import EnvConfig, VerifiersConfig
from thermik.envs.base import Env, Message, StepOutput

PREFIX = "verifiers:"
BRIDGE = Path(__file__).with_name("verifiers_bridge.py")
DEFAULT_VENV = Path.home() / ".cache" / "thermik" / "verifiers-venv"
BUILD_HINT = "build it with `bash scripts/verifiers_venv.sh` (or point env.verifiers.python at a venv with verifiers)"


def default_venv() -> Path:
    """Where scripts/verifiers_venv.sh builds the venv: $VERIFIERS_VENV, else DEFAULT_VENV."""
    return Path(os.environ.get("VERIFIERS_VENV") or DEFAULT_VENV).expanduser()


def venv_python(cfg: VerifiersConfig) -> Path:
    """The verifiers venv's python: the configured one, else the default venv's (scripts/verifiers_venv.sh)."""
    return Path(cfg.python) if cfg.python else default_venv() / "bin" / "python"


def env_config(taskset: str, cfg: VerifiersConfig) -> dict[str, Any]:
    """verifiers' EnvConfig for the taskset: a plain chat harness run locally, then the configured fields."""
    base: dict[str, Any] = {
        "taskset": {"id": taskset},
        "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    }
    return _merge(base, cfg.env)


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class BridgeError(RuntimeError):
    """The verifiers side failed a request (the message is verifiers' own)."""


class Bridge:
    """One `verifiers_bridge.py` process; requests from any thread or event loop, answered by id."""

    def __init__(self, python: Path, config: dict[str, Any], address: str, timeout_s: float) -> None:
        if not python.is_file():
            raise ValueError(f"verifiers environments run in their own venv; none at {python}: {BUILD_HINT}")
        cmd = [str(python), str(BRIDGE), json.dumps(config), *(["--address", address] if address else [])]
        env = {**os.environ, "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")])}  # its uv
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, env=env, start_new_session=True
        )
        self.ids, self.lock = itertools.count(1), threading.Lock()
        self.pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self.ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        threading.Thread(target=self._read, daemon=True, name="verifiers-bridge").start()
        try:
            first = self.ready.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ValueError(f"the verifiers env server did not start in {timeout_s:.0f} s") from None
        if "fatal" in first:
            self.close()
            raise ValueError(f"verifiers could not serve {config['taskset']['id']!r}: {first['fatal']}")
        self.address = first["ready"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray print of the taskset's code
            future = self.ready if "id" not in message else self.pending.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(message)
        gone = {
            "fatal": f"the verifiers bridge exited (code {self.proc.wait()})",
            "error": "the verifiers bridge exited",
        }
        for future in [self.ready, *self.pending.values()]:
            if not future.done():
                future.set_result(gone)

    def request(self, op: str, **fields: Any) -> concurrent.futures.Future[dict[str, Any]]:
        """Send one request; the future holds the reply (raising BridgeError for an error reply, via `result`)."""
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self.lock:
            request_id = next(self.ids)
            self.pending[request_id] = future
            if self.proc.poll() is not None or self.proc.stdin is None:
                self.pending.pop(request_id)
                future.set_result({"error": "the verifiers bridge is not running"})
                return future
            self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        return future

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def checked(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply, or BridgeError carrying the verifiers side's message."""
    if "error" in reply:
        raise BridgeError(reply["error"])
    return reply


_STARTED: list[Bridge] = []


@functools.cache
def _bridge(python: str, config_json: str, address: str, timeout_s: float) -> Bridge:
    bridge = Bridge(Path(python), json.loads(config_json), address, timeout_s)
    atexit.register(bridge.close)
    _STARTED.append(bridge)
    return bridge


def close_bridges() -> None:
    """Close every bridge this process started (a long-lived process that is done with verifiers; exit does it too)."""
    _bridge.cache_clear()
    while _STARTED:
        _STARTED.pop().close()


def bridge_for(taskset: str, cfg: VerifiersConfig) -> Bridge:
    """The process's bridge for this taskset and config (started on first use, closed at exit)."""
    key = (
        str(venv_python(cfg)),
        json.dumps(env_config(taskset, cfg), sort_keys=True),
        cfg.address,
        cfg.startup_timeout_s,
    )
    bridge = _bridge(*key)
    if bridge.proc.poll() is not None:  # it died (its episodes failed): later episodes get a new one
        _bridge.cache_clear()
        bridge = _bridge(*key)
    return bridge


class VerifiersEnv(Env):
    """A row of a verifiers taskset; verifiers plays the whole episode (`plays_episode`), so `step` never runs."""

    plays_episode: ClassVar[bool] = True
    taskset: ClassVar[str] = ""

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        task = extra_info.get("verifiers_task")
        if not isinstance(task, dict):
            raise ValueError(
                "a verifiers row needs extra_info.verifiers_task (the taskset's task data); let `thermik rl` make "
                "the rows from the taskset (no data.train_path)"
            )
        self.task, self.cfg = task, options.verifiers

    def step(self, action: str) -> StepOutput:
        raise TypeError("verifiers plays its episodes itself: run them with thermik.agents.verifiers_episode.play")

    async def arun(self, client: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
        """One episode on the verifiers side: {"traces": [...], "errors": [...]} (verifiers_bridge.py)."""
        import asyncio

        future = bridge_for(self.taskset, self.cfg).request("run", task=self.task, client=client, sampling=sampling)
        return checked(await asyncio.wrap_future(future))["episode"]


@functools.cache
def verifiers_env_class(taskset: str) -> type[Env]:
    """The env class of `verifiers:<taskset id>` (the taskset is checked when the bridge loads it)."""
    if not taskset:
        raise ValueError("name the verifiers taskset: verifiers:<taskset id>")
    return type(f"Verifiers_{taskset}", (VerifiersEnv,), {"taskset": taskset})


def prompt_messages(task: dict[str, Any]) -> list[Message]:
    """A task's prompt as chat messages (for the row's prompt; verifiers renders its own)."""
    prompt, system = task.get("prompt"), task.get("system_prompt")
    messages = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif isinstance(prompt, list):
        messages += [{"role": m.get("role", "user"), "content": str(m.get("content") or "")} for m in prompt]
    return messages or [{"role": "user", "content": ""}]
