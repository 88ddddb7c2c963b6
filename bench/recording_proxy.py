"""An HTTP proxy that writes down every request a client sends, for bench/record_agents.py.

It sits between a real client (Claude Code, Codex CLI) and the daemon: each request is
kept (method, path, a few headers, the JSON body exactly as sent) and forwarded; the
reply is relayed as it arrives, chunk by chunk, so a streamed answer streams through.
A proxy, not a hook in the daemon, so the daemon has no recording notion and the bodies
are the client's bytes, before any parsing of ours.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

# Headers worth keeping with a recording: what selects behaviour, never credentials.
KEPT_HEADERS = ("user-agent", "anthropic-beta", "anthropic-version", "openai-beta")
# Hop-by-hop headers a proxy must not relay (RFC 9110 section 7.6.1), plus the length,
# which chunked relaying replaces.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "content-encoding",
}  # fmt: skip


@dataclass
class Recording:
    """The requests seen so far, in arrival order; `tag` labels the ones that follow."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tag: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> None:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"undecodable": raw.decode("utf-8", "replace")}
        with self.lock:
            self.records.append(
                {**self.tag, "method": method, "path": path, "headers": headers, "body": body}
            )


def handler_for(upstream: str, recording: Recording) -> type[BaseHTTPRequestHandler]:
    client = httpx.Client(base_url=upstream, timeout=httpx.Timeout(1800.0, connect=10.0))

    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # the daemon logs every request already

        def relay(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            kept = {k: v for k in KEPT_HEADERS if (v := self.headers.get(k)) is not None}
            recording.add(self.command, self.path, kept, raw)
            outgoing = {
                k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}
            }
            request = client.build_request(self.command, self.path, headers=outgoing, content=raw)
            reply = client.send(request, stream=True)
            try:
                self.send_response(reply.status_code)
                for key, value in reply.headers.multi_items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                if self.command == "HEAD":
                    return
                for chunk in reply.iter_raw():
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                reply.close()

        do_GET = do_POST = do_DELETE = do_HEAD = relay  # noqa: N815 (stdlib's naming)

    return Relay


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, Recording]]:
    """(the proxy's base URL, its Recording) while it runs, forwarding to upstream."""
    recording = Recording()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(upstream, recording))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recording
    finally:
        server.shutdown()
        server.server_close()
