"""BM25 search MCP server (stdio) over the shipped corpus of fictional towns and people (see corpus).

Run: `python -m thermik.tasks.search.server`. Tools: search(query, k) -> the top-k documents as
'[doc_id] text' lines; open(doc_id) -> one document's full text.
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.tasks.search.corpus import default_index, format_results
from thermik.tools.mcp_launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec

MAX_K = 10
DEFAULT_K = 3
TOOL_NAMES = ("search", "open")


def server_spec() -> ServerSpec:
    return module_server_spec("thermik.tasks.search.server")


def build_server() -> MCPServer:
    index = default_index()
    app: MCPServer = MCPServer(name="thermik-search")

    @app.tool(name="search", description=f"BM25 search; returns the k best documents (1 <= k <= {MAX_K}).")
    def search(query: str, k: int = DEFAULT_K) -> str:
        if not 1 <= k <= MAX_K:
            raise ToolError(f"k must be between 1 and {MAX_K}, got {k}")
        return format_results(index.search(query, k))

    @app.tool(name="open", description="The full text of one document by its id.")
    def open_document(doc_id: str) -> str:
        doc = index.by_id.get(str(doc_id).strip().strip("[]"))
        if doc is None:
            raise ToolError(f"unknown doc_id {doc_id!r}; ids are 0..{len(index.documents) - 1}")
        return doc.text

    return app


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    build_server().run()


if __name__ == "__main__":
    main()
