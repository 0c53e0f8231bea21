"""Search-R1 style QA over the shipped corpus, with the search MCP server."""
