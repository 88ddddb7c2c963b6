"""The ASGI layer in front of the Litestar router.

It runs before routing, so it sees every request, including unknown paths and CORS
preflights: it answers preflights, refuses requests without a valid API key (401)
or over the rate limit (429) in the protocol's own error shape, counts every HTTP
response for /metrics, and cancels a handler whose client disconnected (so a
non-streaming generation stops at once instead of running to max_tokens).
Settings are read from ServerState on every request, so all of this hot-reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from vllm_mlx.api.dashboard import OPEN_UI_PATHS
from vllm_mlx.api.edge import boundary, cors
from vllm_mlx.api.edge.auth import (
    authenticate,
    is_api_path,
    protocol_of,
    required_scope,
    scope_refusal,
)
from vllm_mlx.api.edge.limits import RateLimiter, TokenRateLimiter, client_id, retry_after_header
from vllm_mlx.api.edge.quota import quota_refusal, token_rate_refusal
from vllm_mlx.api.edge.refusals import BodyCapture, error_message, log_refusal
from vllm_mlx.api.error_shapes import error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.principal import Principal, current_principal
from vllm_mlx.api.state import NOTE_KEY, ServerState, open_note, remember_settings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.leases import release_all, request_leases
from vllm_mlx.telemetry.hooks import end_request, start_request
from vllm_mlx.usage.ledger import NO_KEY
from vllm_mlx.usage.record import RequestUsage, current_usage

# Plain ASGI shapes: Litestar's TypedDicts cover every scope type and get in the way here.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCONNECTED = 499  # nginx's "client closed request": what a cancelled handler is logged as
PREFLIGHT = APIError(204, "CORS preflight")  # a marker: _refusal's "answer the preflight"


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def send_json(
    send: Send, status: int, payload: Any, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Response:
    """Wraps send: remembers the status and adds CORS headers for permitted origins."""

    def __init__(self, send: Send, extra_headers: list[tuple[bytes, bytes]]) -> None:
        self._send = send
        self._extra = extra_headers
        self.cors = bool(extra_headers)  # the origin is permitted
        self.status = 0
        self.capture = BodyCapture()  # a 4xx body, for the refusal log line

    async def __call__(self, message: Message) -> None:
        self.capture.see(message)
        if message["type"] == "http.response.start":
            self.status = message["status"]
            if self._extra:
                message = {**message, "headers": [*message.get("headers", []), *self._extra]}
        await self._send(message)


class OpsMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState, known_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.state = state
        self.limiter = RateLimiter()
        self.token_limiter = TokenRateLimiter()
        self._known_paths = frozenset(known_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        settings = self.state.settings  # once per request: a reload never splits one
        remember_settings(scope, settings)
        headers = _headers(scope)
        origin = cors.allowed_origin(headers.get("origin"), settings.server.cors_origins)
        response = _Response(send, cors.response_headers(origin) if origin else [])
        note = open_note(scope)
        caller = current_principal.set(None)  # set by the key check, for this request only
        usage = RequestUsage()  # what the handler spends, for the usage accounting
        spending = current_usage.set(usage)
        span = start_request(self.state.tracing, scope["method"], scope["path"], headers)
        try:
            await self._handle(scope, receive, response, headers, settings)
        finally:
            principal = current_principal.get()
            current_principal.reset(caller)
            current_usage.reset(spending)
            client = scope.get("client")
            peer = str(client[0]) if client else None
            route = self._route(scope)
            end_request(span, route, response.status or DISCONNECTED, note)
            self._account(scope, settings, route, principal, usage, response.status)
            log_refusal(response.capture, route, scope["method"], note, peer)
            # The status page's recent errors; /health's 503 while loading is a state.
            if response.capture.status >= 400 and route != "/health":
                message = error_message(response.capture)
                model = note.get("model")
                activity = self.state.metrics.activity
                activity.error(response.capture.status, route, message, model)
            self.state.metrics.http_request(
                route,
                scope["method"],
                response.status or DISCONNECTED,
                time.monotonic() - started,
            )

    def _account(
        self,
        scope: Scope,
        settings: Settings,
        route: str,
        principal: Principal | None,
        usage: RequestUsage,
        status: int,
    ) -> None:
        """Count the request for its key: /metrics, the usage database, the token rate.

        Requests refused for a missing or wrong key count for nobody (they have no key).
        """
        path = boundary.route_path(scope["path"], scope.get("root_path", ""))
        if not is_api_path(path) or (principal is None and settings.auth.enabled):
            return
        key = principal.name if principal is not None else NO_KEY
        error = status >= 400  # a client that left (0, logged 499) is not an error
        self.state.metrics.keys.observe(key, route, usage, error)
        ledger = self.state.usage
        if ledger is not None and settings.usage.enabled:
            ledger.record(key, route, usage, error)
        if principal is not None and principal.tokens_per_minute:
            self.token_limiter.spend(
                client_id(principal.name, None), principal.tokens_per_minute, usage.tokens
            )

    def _route(self, scope: Scope) -> str:
        # Templates, never raw paths, keep the label set bounded.
        template = scope.get("path_template")
        if isinstance(template, str):
            return template
        path = boundary.route_path(scope["path"], scope.get("root_path", ""))
        return path if path in self._known_paths else "unmatched"

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        response: _Response,
        headers: dict[str, str],
        settings: Settings,
    ) -> None:
        # The path the router will match: judging any other spelling (`//v1/...`)
        # would let it past the key check.
        path = boundary.route_path(scope["path"], scope.get("root_path", ""))
        limit = boundary.max_body_bytes(settings)
        refusal = self._refusal(scope, path, headers, settings, limit)
        if refusal is PREFLIGHT:
            await self._preflight(response, headers, response.cors)
            return
        if refusal is not None:
            payload = error_body(protocol_of(path, headers), refusal)
            extra = [(k.lower().encode(), v.encode()) for k, v in (refusal.headers or {}).items()]
            await send_json(response, refusal.status, payload, extra)
            return
        if scope["method"] == "HEAD" and (path in ("/health", "/metrics") or path in OPEN_UI_PATHS):
            # Health checks written with `wget --spider` / `curl -I`: GET's headers, no body.
            scope = {**scope, "method": "GET"}
            response = _Response(_headers_only(response), [])
        await self._run_app(scope, _limited(receive, limit), response)

    def _refusal(
        self, scope: Scope, path: str, headers: dict[str, str], settings: Settings, limit: int
    ) -> APIError | None:
        """The first check the request fails, in order: Host, key and rate, body."""
        refusal = boundary.host_refusal(headers, settings)
        if refusal is not None:
            return refusal
        if settings.server.cors_origins and cors.is_preflight(scope["method"], headers):
            return PREFLIGHT  # answered before the key check: preflights carry no key
        if boundary.needs_key(path, settings):
            refusal = self._gate(scope, path, headers, settings)
        return (
            refusal
            or boundary.content_type_refusal(scope["method"], headers, path)
            or boundary.length_refusal(headers, limit)
        )

    async def _preflight(self, response: _Response, headers: dict[str, str], allowed: bool) -> None:
        # Preflights carry no credentials, so they are answered before the key check.
        if not allowed:
            error = APIError(400, "CORS origin not allowed", "invalid_request")
            await send_json(response, 400, error_body("openai", error))
            return
        raw = cors.preflight_headers(headers)  # response adds the allow-origin header
        await response({"type": "http.response.start", "status": 204, "headers": raw})
        await response({"type": "http.response.body", "body": b"", "more_body": False})

    def _gate(
        self, scope: Scope, path: str, headers: Mapping[str, str], settings: Settings
    ) -> APIError | None:
        """401 for a missing or wrong key, 403 outside its scopes, 429 over its rate
        limit, else None (and the caller is known for the rest of the request)."""
        auth = settings.auth
        result = authenticate(headers, auth)
        client = scope.get("client")
        peer = str(client[0]) if client else None
        if result.refusal is not None:  # logged with every 4xx (refusals.py)
            self.state.metrics.unauthorized.labels(result.reason).inc()
            return result.refusal
        principal = result.principal
        if principal is not None:
            scope[NOTE_KEY]["key"] = principal.name  # for the refusal and request log lines
            current_principal.set(principal)
            refusal = scope_refusal(principal, scope["method"], path)
            if refusal is not None:
                return refusal
        if not is_api_path(path) or _unlimited_read(scope, path):
            return None
        refusal = self._rate_refusal(principal, peer, auth.rate_limit)
        if refusal is None and principal is not None and _spends_tokens(scope, path):
            refusal = token_rate_refusal(self.token_limiter, principal) or quota_refusal(
                self.state.usage if settings.usage.enabled else None, principal
            )
        if refusal is not None:
            self.state.metrics.rate_limited.inc()
        return refusal

    def _rate_refusal(
        self, principal: Principal | None, peer: str | None, rate: int
    ) -> APIError | None:
        if principal is not None and principal.requests_per_minute is not None:
            rate = principal.requests_per_minute
        if rate <= 0:
            return None
        wait = self.limiter.acquire(client_id(principal.name if principal else None, peer), rate)
        if wait is None:
            return None
        retry = retry_after_header(wait)
        return APIError(
            429,
            f"Rate limit of {rate} requests per minute exceeded; retry in {retry} s.",
            "rate_limit",
            code="rate_limit_exceeded",
            headers={"Retry-After": retry},
        )

    async def _run_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; cancel it if the client disconnects once its body has been read."""
        watch = _DisconnectWatch(receive)
        # The task copies the context, so the models its handler acquires land in `held`;
        # they are released once the response is over, streamed bodies included.
        with request_leases() as held:
            task = asyncio.ensure_future(self.app(scope, watch.receive, send))
        gone = asyncio.ensure_future(watch.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()  # the handler's finally blocks abort its generation
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            for pending in (task, gone, watch.watcher):
                if pending is not None and not pending.done():
                    pending.cancel()
            release_all(held)


def _unlimited_read(scope: Scope, path: str) -> bool:
    """GET /v1/status: the status page polls it every two seconds, and a read of
    counters must not spend the requests a key's rate limit grants for inference."""
    return path == "/v1/status" and scope["method"] in ("GET", "HEAD")


def _spends_tokens(scope: Scope, path: str) -> bool:
    """What the token limits guard: POSTs to the inference routes (a key over its
    quota still lists models and reads its own status)."""
    return scope["method"] == "POST" and required_scope("POST", path) == "inference"


def _headers_only(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return wrapped


def _limited(receive: Receive, limit: int) -> Receive:
    """receive() that refuses a body growing past `limit` (chunked bodies declare no size).

    The APIError reaches the handler reading the body, whose router renders it.
    """
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise boundary.body_too_large(limit)
        return message

    return wrapped


class _DisconnectWatch:
    """Hands the request body to the app, then listens for http.disconnect itself.

    Reading past the body is what reveals a disconnect (the server answers the next
    receive() only when the client goes away); the app gets the same message if it
    asks again, e.g. Litestar's streaming response, which listens for it too.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._body_done = False
        self.gone = asyncio.Event()
        self.watcher: asyncio.Task[None] | None = None

    async def receive(self) -> Message:
        if self._body_done:
            await self.gone.wait()
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone.set()
        elif not message.get("more_body", False):
            self._body_done = True
            self.watcher = asyncio.ensure_future(self._watch())
        return message

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return
