"""Notification between the split processes: the side that publishes rings, the side that waits wakes at once.

A `Doorbell` listens on a Linux abstract-namespace Unix socket named after the run directory and a role (no file
to clean up, no path-length limit); `ring` connects and sends one line. A ring that finds nobody listening (the
other process is not up yet, or restarting) is lost without harm: the waiting side still looks for the published
directory every `split.poll_interval_s`, so notification only shortens the wait, it never decides it. On platforms
without abstract sockets the doorbell stays silent and waiting falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import sys
from pathlib import Path

ROLLOUTS = "rollouts"  # rung by the orchestrator when it publishes a batch; the trainer listens
WEIGHTS = "weights"  # rung by the trainer when it publishes weights; the orchestrator listens
SUPPORTED = sys.platform.startswith("linux")


def run_key(run_dir: Path) -> str:
    """A short name for this run directory that the split processes agree on (doorbells, shared-memory slots)."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def address(run_dir: Path, role: str) -> str:
    """The abstract socket name of `role`'s doorbell for this run directory."""
    return f"\0thermik-split-{run_key(run_dir)}-{role}"


class Doorbell:
    """A listener that sets `event` whenever someone rings (`wait` clears it)."""

    def __init__(self, run_dir: Path, role: str) -> None:
        self.address = address(run_dir, role)
        self.event = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> Doorbell:
        """Listen, when the platform can and no other process of this run listens already (then: polling only)."""
        if SUPPORTED and self._server is None:
            with contextlib.suppress(OSError):  # the name is taken: an older process of this run still listens
                self._server = await asyncio.start_unix_server(self._rung, path=self.address)
        return self

    async def _rung(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.readline()
        self.event.set()
        writer.close()

    async def wait(self, timeout_s: float) -> None:
        """Until rung or `timeout_s` passed, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout_s)
        self.event.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def ring(run_dir: Path, role: str, message: str = "") -> bool:
    """Tell `role`'s listener that something was published; False when nobody listens (no harm: it polls)."""
    if not SUPPORTED:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(address(run_dir, role))
            sock.sendall(f"{message}\n".encode())
        except OSError:
            return False
    return True
