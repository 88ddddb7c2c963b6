"""MCP client side: config shapes, server supervision, tool conversion.

Nothing here imports the engine; the `mcp` SDK itself is imported only when a server
is started, so a daemon without MCP servers never pays for it.
"""
