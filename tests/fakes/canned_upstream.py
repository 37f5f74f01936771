"""A trivial OpenAI-compatible upstream that streams canned tokens as fast as it can (or as
slowly as asked). It stands in for an engine where the engine itself is not what is measured or
cannot misbehave on demand: the router's own throughput ceiling (tests/bench/router_overhead.py)
and the slow, stalled and flapping upstreams of the router's failure tests.

    python -m tests.fakes.canned_upstream --port 9000 [--token-delay S] [--first-byte-delay S]
        [--stall-after N] [--health-file PATH] [--workers N]

A raw ASGI app on uvicorn (no framework), so that its own overhead stays far below the router's.
With `--workers N`, uvicorn's own supervisor runs N processes on the one listening socket, so
that a paced upstream (`--token-delay`) does not itself queue at hundreds of streams; each
process then counts its own tokens in /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

TOKEN = "tok "


def build_app(token_delay: float = 0.0, first_byte_delay: float = 0.0,
              stall_after: int | None = None, health_file: str | None = None):
    generated = 0

    async def send_json(send, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def read_body(receive) -> bytes:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                return body

    async def completion(scope, receive, send, chat: bool) -> None:
        nonlocal generated
        arrived = time.monotonic()
        request = json.loads(await read_body(receive))
        count = request.get("max_tokens") or 16
        rid, created, model = "cmpl-canned", int(time.time()), request.get("model", "canned")
        if first_byte_delay:
            await asyncio.sleep(first_byte_delay)
        if not request.get("stream"):
            await asyncio.sleep(token_delay * count)
            generated += count
            choice = ({"index": 0, "message": {"role": "assistant", "content": TOKEN * count},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": TOKEN * count, "finish_reason": "length"})
            await send_json(send, 200, {
                "id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": model, "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": count,
                          "total_tokens": count + 1}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        # As the CPU engine logs it: the caller's x-request-id and the time to the first token.
        caller = dict(scope["headers"]).get(b"x-request-id", b"-").decode()
        print(f"request x-request-id={caller} first_token="
              f"{(time.monotonic() - arrived) * 1e3:.3f}ms", flush=True)
        kind = "chat.completion.chunk" if chat else "text_completion"
        for index in range(count):
            if stall_after is not None and index >= stall_after:
                await asyncio.sleep(3600)
            last = index == count - 1
            choice = ({"index": 0, "delta": {"content": TOKEN},
                       "finish_reason": "length" if last else None} if chat else
                      {"index": 0, "text": TOKEN, "finish_reason": "length" if last else None})
            chunk = {"id": rid, "object": kind, "created": created, "model": model,
                     "choices": [choice]}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + json.dumps(chunk).encode() + b"\n\n"})
            generated += 1
            if token_delay:
                await asyncio.sleep(token_delay)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/v1/chat/completions":
            await completion(scope, receive, send, chat=True)
        elif path == "/v1/completions":
            await completion(scope, receive, send, chat=False)
        elif path == "/health":
            down = health_file is not None and os.path.exists(health_file)
            await send_json(send, 503 if down else 200, {"status": "down" if down else "ok"})
        elif path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": [
                {"id": "canned", "object": "model", "created": 0, "owned_by": "tests"}]})
        elif path == "/metrics":
            text = ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                    "vllm:kv_cache_usage_perc 0\n"
                    f"vllm:generation_tokens_total {generated}\n").encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": text})
        else:
            await send_json(send, 404, {"error": {"message": "not found",
                                                  "type": "invalid_request_error"}})

    return app


FACTORY_ENV = "CANNED_UPSTREAM_ARGS"


def app_from_env():
    """The app of a `--workers` process (uvicorn imports it by name in each worker)."""
    options = json.loads(os.environ[FACTORY_ENV])
    return build_app(**options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--first-byte-delay", type=float, default=0.0)
    parser.add_argument("--stall-after", type=int, default=None)
    parser.add_argument("--health-file", default=None,
                        help="/health answers 503 while this file exists")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes serving the one listening socket")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    import uvicorn

    options = {"token_delay": args.token_delay, "first_byte_delay": args.first_byte_delay,
               "stall_after": args.stall_after, "health_file": args.health_file}
    common = {"host": args.host, "port": args.port, "log_level": "warning", "lifespan": "on",
              "backlog": 4096}
    if args.workers == 1:
        uvicorn.run(build_app(**options), **common)
        return
    os.environ[FACTORY_ENV] = json.dumps(options)
    uvicorn.run("tests.fakes.canned_upstream:app_from_env", factory=True,
                workers=args.workers, **common)


if __name__ == "__main__":
    main()
