"""Calculator: arithmetic through the calculator MCP server."""
