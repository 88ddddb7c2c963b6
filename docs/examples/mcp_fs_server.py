"""A read-only filesystem MCP server (the `mcp` SDK), confined to one directory.

    python docs/examples/mcp_fs_server.py ROOT

Tools: `list_directory`, `read_file`, `search_files`. Paths are relative to ROOT; any
path that resolves outside it (`..`, a symlink out) is refused. See docs/mcp.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

MAX_READ_BYTES = 1_000_000
MAX_MATCHES = 200


def build(root: Path) -> MCPServer:
    server = MCPServer("files", log_level="WARNING")

    def inside(path: str) -> Path:
        target = (root / path).resolve()
        if target != root and root not in target.parents:
            raise ToolError(f"{path!r} is outside the served directory")
        return target

    @server.tool(description="List a directory (relative to the root): names, `/` for dirs.")
    def list_directory(path: str = ".") -> str:
        target = inside(path)
        if not target.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        entries = sorted(target.iterdir(), key=lambda p: p.name)
        return "\n".join(p.name + ("/" if p.is_dir() else "") for p in entries)

    @server.tool(description="Read a text file (relative to the root), up to 1 MB.")
    def read_file(path: str) -> str:
        target = inside(path)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file")
        data = target.read_bytes()[:MAX_READ_BYTES]
        return data.decode("utf-8", errors="replace")

    @server.tool(description="Find files whose names match a glob pattern, e.g. `*.md`.")
    def search_files(pattern: str) -> str:
        matches = [str(p.relative_to(root)) for p in root.rglob(pattern) if p.is_file()]
        return "\n".join(sorted(matches)[:MAX_MATCHES]) or "(no matches)"

    return server


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: mcp_fs_server.py DIRECTORY")
    build(Path(sys.argv[1]).resolve()).run("stdio")
