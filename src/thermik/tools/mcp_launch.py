"""How MCPPool launches a thermik server module with the current interpreter, and where built task data lives."""

from __future__ import annotations

import os
import sys

from thermik.tools.mcp_pool import ServerSpec


def module_server_spec(module: str, *args: str, name: str = "", data_path: str | None = None) -> ServerSpec:
    """`python -m MODULE ARGS`; PYTHONPATH is passed on (the SDK forwards only a safe subset of our environment)."""
    env = (("PYTHONPATH", os.environ["PYTHONPATH"]),) if os.environ.get("PYTHONPATH") else ()
    return ServerSpec(command=sys.executable, args=("-m", module, *args), env=env, name=name, data_path=data_path)


def cache_dir() -> str:
    """Where built data (the SQL database) lives: $XDG_CACHE_HOME/thermik, else ~/.cache/thermik.

    Not a THERMIK_* variable: those are config overrides and an unknown one is an error.
    """
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "thermik")
