"""The patched engine's usage middleware (`engine_patch/http_api/usage_fields.py`) run around a stand-in ASGI app
that records a reuse as a generation does: the messages it sends, for the usage tests of every API."""

import asyncio

from stable_prefix.engine_patch.cache.request_reuse import RequestReuse, current_request_reuse
from stable_prefix.engine_patch.http_api.usage_fields import ReuseUsageMiddleware


def run_middleware(path: str, content_type: bytes, body_chunks: list[bytes], reuse_seen: RequestReuse) -> list[dict]:
    """Drive the ASGI middleware around a fake app that records a reuse, as a generation does."""
    async def app(scope, receive, send):
        reuse = current_request_reuse()
        if reuse is not None:  # only generation routes get a record
            reuse.record(reuse_seen.prompt_tokens, reuse_seen.reused)
        length = str(sum(len(chunk) for chunk in body_chunks)).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type), (b"content-length", length)]})
        for index, chunk in enumerate(body_chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": index < len(body_chunks) - 1})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    asyncio.run(ReuseUsageMiddleware(app)(scope, receive, send))
    return sent
