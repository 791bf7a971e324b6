"""Request bodies past a size are refused with 413, declared or streamed (chunked) alike."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harombe.service.problems import HTTPProblem


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of request body reach the app."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _refusal(self) -> HTTPProblem:
        return HTTPProblem(
            413,
            "RequestTooLarge",
            f"the request body is over {self.max_bytes} bytes (service.max_request_bytes); "
            "send less, or raise the limit",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refusal().response()(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._refusal()
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except HTTPProblem as problem:  # a route that read the stream itself
            if not started:
                await problem.response()(scope, receive, send)
