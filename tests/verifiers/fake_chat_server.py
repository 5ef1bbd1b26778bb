"""A tiny OpenAI-compatible server on stdlib http.server: `/chat/completions` answers from a script.

Each request takes the next scripted reply (the last one repeats): a string is an assistant text reply,
a dict `{"tool": name, "arguments": {...}}` an assistant tool call, `{"status": 500}` an error reply. Every request's path, headers and
JSON body is kept in `requests`. Streaming requests (`"stream": true`) get the reply as SSE chunks.
`connections` counts the TCP connections accepted; with `keep_alive` a connection serves many requests
(HTTP/1.1), so a client that pools its connections opens few.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeChatServer:
    def __init__(self, replies: list[str | dict[str, Any]], *, keep_alive: bool = False) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.keep_alive = keep_alive
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self) -> str | dict[str, Any]:
        with self._lock:
            index = min(len(self.requests) - 1, len(self.replies) - 1)
            return self.replies[index]

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if fake.keep_alive else "HTTP/1.0"

            def setup(self) -> None:  # once per TCP connection, however many requests it carries
                super().setup()
                with fake._lock:
                    fake.connections += 1

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                reply = fake._next()
                if isinstance(reply, dict) and "status" in reply:
                    self._send(
                        reply["status"], {"error": {"message": "scripted failure", "type": "server_error"}}
                    )
                    return
                message: dict[str, Any] = {"role": "assistant", "content": None}
                finish = "stop"
                if isinstance(reply, str):
                    message["content"] = reply
                else:
                    finish = "tool_calls"
                    message["tool_calls"] = [
                        {
                            "id": f"call_{len(fake.requests)}",
                            "type": "function",
                            "function": {
                                "name": reply["tool"],
                                "arguments": json.dumps(reply.get("arguments", {})),
                            },
                        }
                    ]
                usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
                created = int(time.time())
                if body.get("stream"):
                    self._stream(body, message, finish, usage, created)
                    return
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(fake.requests)}",
                        "object": "chat.completion",
                        "created": created,
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": usage,
                    },
                )

            def _stream(self, body, message, finish, usage, created) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")  # no length: the stream ends with the connection
                self.close_connection = True
                self.end_headers()
                delta = {k: v for k, v in message.items() if v is not None}
                if "tool_calls" in delta:
                    delta["tool_calls"] = [{"index": 0, **call} for call in delta["tool_calls"]]
                base = {
                    "id": "chatcmpl-s",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body.get("model", "fake"),
                }
                for chunk in (
                    {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                    {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                    {**base, "choices": [], "usage": usage},
                ):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


if __name__ == "__main__":  # python fake_chat_server.py 'monopoly' -> serve until Ctrl-C
    import sys

    replies = [json.loads(a) if a.startswith("{") else a for a in sys.argv[1:]]
    with FakeChatServer(replies or ["Monopoly"]) as server:
        print(server.base_url, flush=True)
        threading.Event().wait()
