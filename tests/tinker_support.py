"""Test helpers for `thermik tinker`: start it as a user does (a subprocess on loopback) and drive it with the
official tinker SDK, unmodified."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import cli_env, thermik_argv

API_KEY = "tml-thermik-test"
os.environ.setdefault("TINKER_API_KEY", API_KEY)  # the SDK refuses to start without a key (any "tml-" key here)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TinkerServer:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (what a crash or an OOM kill does)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_tinker(model_dir: Path, state_dir: Path, *extra: str, port: int = 0) -> TinkerServer:
    """`thermik tinker` on 127.0.0.1; waits until /api/v1/healthz answers."""
    port = port or free_port()
    log = state_dir.parent / f"tinker-{port}-{time.monotonic_ns()}.log"
    args = ["--model.path", str(model_dir), "--server.port", str(port), "--service.state_dir", str(state_dir)]
    proc = subprocess.Popen(
        thermik_argv("tinker", *args, *extra), env=cli_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                return TinkerServer(proc, url, log)
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail(f"thermik tinker did not start:\n{log.read_text(errors='replace')}")


def fixed_datum(tokenizer, text: str = "the quick brown fox jumps over the lazy dog"):
    """A next-token datum for cross_entropy: input ids[:-1], targets ids[1:], weight 1 everywhere."""
    from tinker import types

    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": np.array(ids[1:], np.int64), "weights": np.ones(len(ids) - 1, np.float32)},
    )
