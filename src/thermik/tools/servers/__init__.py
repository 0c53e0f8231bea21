"""MCP servers shipped with thermik, each runnable as `python -m thermik.tools.servers.<name>`."""
