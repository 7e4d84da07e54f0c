"""An OpenAI-compatible chat-completions server on loopback that plays scripted replies.

It answers both ways real servers (vLLM, SGLang) do: one JSON body, or with ``"stream": true``
server-sent events (``chat.completion.chunk`` deltas, a final chunk with ``finish_reason``, usage
when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``) — verifiers' clients stream.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    """Answers each conversation from a script keyed by its first user message.

    A script is a list of replies, one per assistant turn (step = assistant messages so far); a
    reply is text, {"tool_calls": [...]}, or a directive {"status": 503, "times": 1} /
    {"sleep": 1.0, "times": 1} that applies to the first attempts before the next reply is given.
    """

    def __init__(self):
        self.scripts: dict[str, list] = {}
        self.directives: dict[tuple[str, int], dict] = {}
        self.attempts: dict[tuple[str, int], int] = {}
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                status, reply = server.answer(body)
                if reply is None:  # the client gave up waiting; nothing to send
                    self.close_connection = True
                    return
                if status == 200 and body.get("stream"):
                    payload = server.events(reply, body).encode()
                    content_type = "text/event-stream"
                else:
                    payload, content_type = json.dumps(reply).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def answer(self, body):
        key = next(m["content"] for m in body["messages"] if m["role"] == "user")
        key = key if isinstance(key, str) else "".join(part.get("text", "") for part in key)  # content parts
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        attempt = self.attempts.get((key, step), 0)
        self.attempts[(key, step)] = attempt + 1
        directive = self.directives.get((key, step))
        if directive and attempt < directive.get("times", 10**9):
            if "sleep" in directive:
                time.sleep(directive["sleep"])
                return 200, None
            return directive["status"], {"error": {"message": "scripted failure"}}
        script = self.scripts[key]
        reply = script[step] if step < len(script) else "Done."
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else {"role": "assistant", "content": None, **reply}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip

    @staticmethod
    def events(reply, body):
        """The reply as the server-sent events of a streamed completion."""
        message, choice = reply["choices"][0]["message"], reply["choices"][0]
        delta = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        head = {"id": reply["id"], "object": "chat.completion.chunk", "created": 0, "model": reply["model"]}
        chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": reply["usage"]})
        return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()
