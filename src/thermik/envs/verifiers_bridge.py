"""The verifiers side of `verifiers:<taskset>` environments: run by the verifiers venv's python, never imported by
thermik (it imports only verifiers and the standard library).

    <venv>/bin/python verifiers_bridge.py '<env config JSON>' [--address tcp://host:port]

Starts verifiers' own env server for the config (`serve_env`, one worker, in a child process; or connects to a
running one at --address) and drives it with verifiers' own `EnvClient`. thermik talks to this process in JSON
lines on stdin/stdout, one request per line, replies tagged with the request's id (several may be in flight):

    {"id": 1, "op": "tasks", "limit": 100}          -> {"id": 1, "tasks": [task data, ...]}
    {"id": 2, "op": "run", "task": {...}, "client": {"base_url", "model", "renderer_model_name"},
     "sampling": {...}}                              -> {"id": 2, "episode": {"traces": [...], "errors": [...]}}

A trace is {"reward", "num_turns", "stop_condition", "errors", "messages", "branches": [{"token_ids",
"sampled_mask", "logprobs"}]}; a failed request answers {"id", "error"}. The first line out is {"ready": address}
or {"fatal": message}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import traceback
from typing import Any


def _trace(trace: Any) -> dict[str, Any]:
    branches = [
        {"token_ids": list(b.token_ids), "sampled_mask": [bool(m) for m in b.sampled_mask],
         "logprobs": b.spread(lambda node: node.logprobs)}
        for b in trace.branches if b.trainable
    ]  # fmt: skip
    messages = [m.model_dump(mode="json", exclude_none=True) for m in trace.messages]
    return {
        "reward": float(trace.reward or 0.0),
        "num_turns": trace.num_turns,
        "stop_condition": trace.stop_condition,
        "errors": [f"{e.type}: {e.message}" for e in trace.errors],
        "messages": messages,
        "branches": branches,
    }


def _tasks(config: Any, limit: int) -> list[dict[str, Any]]:
    from verifiers.v1.utils.loaders import load_taskset

    out = []
    for task in load_taskset(config.taskset):
        if len(out) >= limit:
            break
        out.append(task.data.model_dump(mode="json"))
    return out


async def _handle(request: dict[str, Any], client: Any, config: Any) -> dict[str, Any]:
    from verifiers.v1.configs.client import TrainClientConfig
    from verifiers.v1.types import SamplingConfig

    if request["op"] == "tasks":
        return {"tasks": await asyncio.to_thread(_tasks, config, int(request["limit"]))}
    if request["op"] != "run":
        raise ValueError(f"unknown op {request['op']!r}")
    spec = request["client"]
    train = TrainClientConfig(
        base_url=spec["base_url"], api_key_var="THERMIK_VERIFIERS_API_KEY",
        renderer_model_name=spec["renderer_model_name"],
    )  # fmt: skip
    episode = await client.run(train, spec["model"], SamplingConfig(**request["sampling"]), request["task"])
    errors = [f"{e.type}: {e.message}" for e in getattr(episode, "errors", []) or []]
    return {"episode": {"traces": [_trace(t) for t in episode.traces], "errors": errors}}


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _serve(config: Any, client: Any) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task] = set()

    async def answer(request: dict[str, Any]) -> None:
        try:
            _reply({"id": request.get("id"), **await _handle(request, client, config)})
        except Exception as exc:  # a failed request is an answer, never the end of the bridge
            _reply({"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})

    while line := await reader.readline():
        task = asyncio.create_task(answer(json.loads(line)))
        pending.add(task)
        task.add_done_callback(pending.discard)


def _start_server(config: Any) -> tuple[multiprocessing.Process, str]:
    """verifiers' env server for `config`, one worker on an OS-assigned loopback port, in a child process."""
    from verifiers.v1.serve.pool import env_config_data, serve_env

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    keep, death_pipe = ctx.Pipe()  # the server stops itself when this process dies (the pipe closes), however
    kwargs = {"max_workers": 1, "address": "tcp://127.0.0.1:0", "address_queue": queue,
              "config_data": env_config_data(config), "death_pipe": death_pipe}  # fmt: skip
    proc = ctx.Process(target=serve_env, kwargs=kwargs, daemon=True)
    proc.start()
    proc.keep = keep  # type: ignore[attr-defined]
    return proc, queue.get(timeout=300)


async def _main(config_json: str, address: str | None) -> None:
    from verifiers.v1.serve.client import EnvClient
    from verifiers.v1.utils.loaders import resolve_env_config

    config = resolve_env_config(json.loads(config_json))
    proc = None
    if address is None:
        proc, address = _start_server(config)
    client = EnvClient(address)
    try:
        await client.wait_for_server_startup(timeout=300)
        _reply({"ready": address})
        await _serve(config, client)
    finally:
        await client.close()
        if proc is not None:
            proc.terminate()
            proc.join(timeout=10)


def main() -> None:
    # Run as a script, its folder (thermik/envs) leads sys.path: none of thermik's modules there may shadow a package
    # verifiers imports (openenv, reasoning_gym, ...).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="verifiers EnvConfig as JSON")
    parser.add_argument("--address", default=None, help="a running verifiers env server (tcp://host:port)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # thermik's terminate: run the finally that stops the server
    try:
        asyncio.run(_main(args.config, args.address))
    except Exception as exc:
        _reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]})
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
