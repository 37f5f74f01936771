"""The HTTP routes (Starlette): /v1/completions, /v1/chat/completions (SSE when streaming),
/v1/models, /health, /metrics and GET /v1/kv/{handle} (the KV pull). Each parses the body,
calls the serving object and encodes its answer; every error is OpenAI-shaped.

Behind the CPU engine's `Guard` (serving_limits.py): a body over --max-body-bytes is 413 before
it is read, anything unexpected a 500 with `Connection: close`. While draining (SIGTERM), new
completions are 503 `shutting_down`; the serving object ends running ones at the deadline."""

from __future__ import annotations

from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..kv_handoff.export import KvExports
from ..protocol.openai import SSE_MEDIA_TYPE, ApiError, parse_body
from ..serving_limits import Drain, Guard, error_response
from .serving import OpenAIServing


def create_app(serving: OpenAIServing, exports: KvExports, registry: CollectorRegistry,
               drain: Drain, max_body_bytes: int) -> Guard:
    async def answer(request: Request, chat: bool) -> Response:
        drain.refuse_new()
        payload = parse_body(await request.body())
        result = await serving.create(payload, chat, request.is_disconnected)
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type=SSE_MEDIA_TYPE)

    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)

    async def models(_request: Request) -> Response:
        return JSONResponse(serving.models())

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def api_error(_request: Request, error: ApiError) -> Response:
        # A 413's body was not read: the connection cannot carry another request.
        return error_response(error, close=error.status == 413)

    async def http_error(request: Request, error: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(
                       error.status_code, str(error.detail))
        return await api_error(request, ApiError(
            error.status_code, message, headers=dict(error.headers or {}),
            code="not_found" if error.status_code == 404 else "method_not_allowed"))

    @asynccontextmanager
    async def lifespan(_app: Starlette):
        try:
            yield
        finally:
            exports.release_all()

    return Guard(Starlette(
        routes=[Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
                Route("/v1/kv/{handle}", exports.route, methods=["GET"])],
        exception_handlers={ApiError: api_error, HTTPException: http_error},
        lifespan=lifespan,
    ), max_body_bytes)
