"""Agents as entrypoints and commands: the user's own agent harness plays each episode (`[agent]`, docs/agents.md).

`agent.entrypoint = "pkg.module:function"` (sync or async, called with the task row and a client config) or
`agent.command = "..."` (a program in any venv, with OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL / THERMIK_TASK in
its environment) runs once per episode against a capture endpoint of its own (thermik.capture), whose recorded turns
are the episode's token-exact samples. harness_env.py wraps each row's env (the agent loop hands the episode to it),
process.py runs the harness as a process tree of its own, scoring.py reads its result, episode.py ties them together.
"""
