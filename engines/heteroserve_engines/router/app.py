"""The router's HTTP routes: parse -> call the serving object -> encode. Every error, 404 and
405 included, is answered in OpenAI's shape."""

from __future__ import annotations

from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..protocol.openai import ApiError
from .service import RouterService


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to pass `limit` (never read whole)."""
    too_large = ApiError(413, f"the request body exceeds the router's limit of {limit} bytes",
                         code="request_too_large", headers={"Connection": "close"})
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def disconnect_waiter(request: Request):
    """A coroutine factory that returns once the client has disconnected (the body is read)."""
    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    return wait


def create_app(service: RouterService) -> Starlette:
    limit = service.config.limits.max_body_bytes

    async def completion(request: Request, kind: str) -> Response:
        service.authorize(request.headers.get("authorization"))
        body = await read_body(request, limit)
        return await service.complete(kind, body, disconnect_waiter(request))

    async def chat_completions(request: Request) -> Response:
        return await completion(request, "chat")

    async def completions(request: Request) -> Response:
        return await completion(request, "completion")

    async def models(request: Request) -> Response:
        service.authorize(request.headers.get("authorization"))
        return JSONResponse(service.models().model_dump())

    async def model(request: Request) -> Response:
        service.authorize(request.headers.get("authorization"))
        return JSONResponse(service.model(request.path_params["model_id"]).model_dump())

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(_request: Request) -> Response:
        ok, healthy = service.readiness()
        return JSONResponse({"ready": ok, "healthy_upstreams": healthy},
                            status_code=200 if ok else 503)

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    async def api_error(_request: Request, error: ApiError) -> Response:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    async def http_error(request: Request, error: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(
                       error.status_code, str(error.detail))
        wrapped = ApiError(error.status_code, message, code="not_found"
                           if error.status_code == 404 else "method_not_allowed",
                           headers=dict(error.headers or {}))
        return await api_error(request, wrapped)

    @asynccontextmanager
    async def lifespan(_app: Starlette):
        await service.pool.start()
        try:
            yield
        finally:
            await service.pool.stop()
            await service.client.aclose()

    return Starlette(
        routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", model, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
                Route("/ready", ready, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"])],
        exception_handlers={ApiError: api_error, HTTPException: http_error},
        lifespan=lifespan,
    )
