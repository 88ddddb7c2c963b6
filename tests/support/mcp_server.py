"""A real MCP server (the `mcp` SDK's MCPServer) for the tests: stdio or streamable HTTP.

    python tests/support/mcp_server.py [--http PORT | --sse PORT] [--name NAME]

Tools: `add` (numbers), `echo` (text), `fail` (raises: a tool error), `sleep` (waits,
to run past a timeout), `crash` (the process exits: a dead server), `calls` (how many
tool calls this process served, so a test can see that a call really ran here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CALLS = {"count": 0}


def build(name: str) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool(description="Add two numbers.")
    def add(a: float, b: float) -> str:
        CALLS["count"] += 1
        total = a + b
        return str(int(total) if total == int(total) else total)

    @server.tool(description="Return the text unchanged.")
    def echo(text: str) -> str:
        CALLS["count"] += 1
        return text

    @server.tool(description="Always fails with the given message.")
    def fail(message: str = "boom") -> str:
        CALLS["count"] += 1
        raise ToolError(message)

    @server.tool(description="Sleep for some seconds, then say so.")
    async def sleep(seconds: float) -> str:
        CALLS["count"] += 1
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="Exit the server process at once.")
    def crash() -> str:
        sys.stderr.flush()
        os._exit(3)

    @server.tool(description="How many tool calls this process has served.")
    def calls() -> str:
        return str(CALLS["count"])

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT")
    parser.add_argument("--sse", type=int, help="serve the older SSE transport on 127.0.0.1:PORT")
    parser.add_argument("--name", default="test-server")
    args = parser.parse_args()
    server = build(args.name)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    elif args.sse:
        server.run("sse", host="127.0.0.1", port=args.sse)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
