"""MCP client side: config shapes, server supervision, tool conversion.

Nothing here imports the engine; the `mcp` SDK itself is imported only when a server
is started, so a daemon without MCP servers never pays for it.
"""

# config.py imports mcp.settings midway (once Section and setting exist), and
# mcp.settings imports those from config.py: loading config.py first, whichever module
# is asked for first, keeps that order.
import vllm_mlx.config  # noqa: F401
