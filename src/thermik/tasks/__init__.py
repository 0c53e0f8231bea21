"""Built-in tasks, one package each: env.py, generate.py (rows + solver), server.py (its MCP server, if any).

The name table of env + generator per task is `thermik.tasks.registry.TASKS`.
"""
