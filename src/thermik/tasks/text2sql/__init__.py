"""Text-to-SQL over the shop database, with the sql MCP server."""
