"""The child-process side of `agent.entrypoint`: import `pkg.module:function`, call it with the task row and the
client config, write what it returns as JSON to THERMIK_RESULT_FILE (agents/process.py).

Run by path in the harness's interpreter (`agent.python`: e.g. the harness venv's), so it imports only the standard
library: `python bootstrap.py pkg.module:function`. The function may be sync or async; it gets
`(task, client)` with `client = {"base_url", "api_key", "model", "reward_url"}`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys


def main(target: str) -> None:
    module_name, _, function_name = target.partition(":")
    sys.path[0] = os.getcwd()  # the user's modules, not this script's folder (thermik/rollout)
    function = getattr(importlib.import_module(module_name), function_name)
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


if __name__ == "__main__":
    main(sys.argv[1])
