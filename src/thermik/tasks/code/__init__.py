"""Function writing against hidden tests, run in the python_sandbox MCP server."""
