"""Small loopback stand-ins that answer like each model server where it says who it is (written by us from each
server's source or documentation, never recorded), and a chat completion in llama.cpp's shape, so `up --upstream`
can be run before one without the server itself. Standard library only: a clean venv's test runs one too.

    with standin("llama.cpp") as url:   # http://127.0.0.1:PORT
        ...
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "standin-model"
JSON = "application/json"

# Where each server says who it is, as it answers (status, content type, body). Paths not listed answer 404.
IDENTITY_ANSWERS: dict[str, dict[str, tuple[int, str, str]]] = {
    # llama-server b11434: /props (tools/server/server-context.cpp get_res_props), /health.
    "llama.cpp": {
        "/props": (200, JSON, json.dumps({"total_slots": 4, "model_alias": MODEL, "model_path": "/models/standin.gguf",
                                          "build_info": "b11434-0a1b2c3", "is_sleeping": False, "endpoint_slots": True})),
        "/health": (200, JSON, '{"status":"ok"}'),
    },
    # vLLM's OpenAI server: /version, Prometheus /metrics with `vllm:` series, an empty /health, and in its dev mode a
    # /server_info of its own (not SGLang's).
    "vllm": {
        "/version": (200, JSON, '{"version":"0.32.0"}'),
        "/server_info": (200, JSON, json.dumps({"vllm_config": "model='standin-model', ...", "vllm_env": {}, "system_env": {}})),
        "/metrics": (200, "text/plain; version=0.0.4", "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
                                                       "# TYPE vllm:prefix_cache_queries_total counter\n"
                                                       f'vllm:prefix_cache_queries_total{{model_name="{MODEL}"}} 0.0\n'),
        "/health": (200, JSON, ""),
    },
    # vllm-mlx with our patch (engine_patch/install.py `stats`), and as shipped (its /health and /v1/cache/stats).
    "vllm-mlx-patched": {
        "/v1/cache/stats": (200, JSON, json.dumps({"entries": 0, "engine": "batched", "vllm_mlx_version": "0.6.0"})),
        "/health": (200, JSON, json.dumps({"status": "healthy", "model_loaded": True, "model_name": MODEL, "engine_type": "batched"})),
    },
    "vllm-mlx": {
        "/v1/cache/stats": (200, JSON, json.dumps({"engine_cache": None, "multimodal_kv_cache": {}})),
        "/health": (200, JSON, json.dumps({"status": "healthy", "model_loaded": True, "model_name": MODEL, "engine_type": "batched"})),
        "/metrics": (404, JSON, '{"detail":"Metrics endpoint is disabled"}'),
    },
    # LM Studio's REST API (/api/v0/models) beside its OpenAI one.
    "lm-studio": {
        "/api/v0/models": (200, JSON, json.dumps({"object": "list", "data": [
            {"id": MODEL, "object": "model", "type": "llm", "publisher": "standin", "arch": "llama", "compatibility_type": "gguf",
             "quantization": "Q4_K_M", "state": "loaded", "max_context_length": 8192}]})),
    },
    # Ollama: /api/version, /api/tags.
    "ollama": {
        "/api/version": (200, JSON, '{"version":"0.12.3"}'),
        "/api/tags": (200, JSON, json.dumps({"models": [{"name": MODEL, "model": MODEL}]})),
    },
    # SGLang: /server_info with its server arguments.
    "sglang": {
        "/server_info": (200, JSON, json.dumps({"model_path": "/models/standin", "tp_size": 1, "version": "0.5.2"})),
        "/get_server_info": (200, JSON, json.dumps({"model_path": "/models/standin", "tp_size": 1, "version": "0.5.2"})),
        "/health": (200, JSON, ""),
    },
    # A server none of the above: answers /v1/models and nothing that names it.
    "unknown": {},
}

MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "standin"}]}
# llama.cpp's non-streamed chat completion: its usage and its timings (cache_n reused, prompt_n prefilled).
CHAT_COMPLETION = {
    "object": "chat.completion", "id": "chatcmpl-standin", "model": MODEL, "system_fingerprint": "b11434-0a1b2c3",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello from the stand-in."}}],
    "usage": {"completion_tokens": 5, "prompt_tokens": 40, "total_tokens": 45, "prompt_tokens_details": {"cached_tokens": 32}},
    "timings": {"cache_n": 32, "prompt_n": 8, "prompt_ms": 4.0, "predicted_n": 5, "predicted_ms": 10.0},
}


def handler_for(server: str) -> type[BaseHTTPRequestHandler]:
    answers = IDENTITY_ANSWERS[server]

    class StandIn(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status: int, content_type: str, body: str) -> None:
            payload = body.encode()
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path == "/v1/models":
                self.answer(200, JSON, json.dumps(MODELS))
            elif path in answers:
                self.answer(*answers[path])
            else:
                self.answer(404, JSON, '{"error":"not found"}')

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.split("?")[0] == "/v1/chat/completions":
                self.answer(200, JSON, json.dumps(CHAT_COMPLETION))
            else:
                self.answer(404, JSON, '{"error":"not found"}')

        def log_message(self, *args) -> None:  # quiet: the test says what matters
            pass

    return StandIn


@contextlib.contextmanager
def standin(server: str) -> Iterator[str]:
    """A stand-in for `server` (a key of IDENTITY_ANSWERS) on 127.0.0.1, its base URL while the block runs."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(server))
    thread = threading.Thread(target=httpd.serve_forever, name=f"standin-{server}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def main() -> None:
    """`python tests/support/server_standins.py SERVER PORT`: one stand-in in its own process until killed."""
    import sys

    httpd = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), handler_for(sys.argv[1]))
    httpd.serve_forever()


if __name__ == "__main__":
    main()
