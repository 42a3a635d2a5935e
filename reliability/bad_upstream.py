#!/usr/bin/env python3
"""An OpenAI-style upstream that misbehaves on purpose, by path prefix, for reliability/chaos.py:
  /hang/v1/...     reads the request and never answers
  /garbage/v1/...  200 with a body that is not what was asked (broken JSON, or SSE noise)
  /fail/v1/...     500 with a JSON error
  /cut/v1/...      200, one good SSE chunk (or half a JSON body), then the connection drops
usage: bad_upstream.py PORT
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.reply(200, "application/json", json.dumps({"object": "list", "data": []}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        stream = bool(body.get("stream"))
        mode = self.path.strip("/").split("/")[0]
        if mode == "hang":
            time.sleep(3600)
        elif mode == "garbage":
            if stream:
                self.reply(200, "text/event-stream", b"data: {not json\n\nevent: ???\ndata: \x00\xff\n\ndata: [DONE]\n\n")
            else:
                self.reply(200, "application/json", b'{"choices": [{"message": ')
        elif mode == "fail":
            self.reply(500, "application/json", b'{"error": {"message": "upstream exploded", "type": "server_error"}}')
        elif mode == "cut":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream" if stream else "application/json")
            self.send_header("content-length", "100000")
            self.end_headers()
            self.wfile.write(f"data: {json.dumps(CHUNK)}\n\n".encode() if stream else b'{"id": "x", "choi')
            self.wfile.flush()
            self.close_connection = True
        else:
            self.reply(404, "application/json", b'{"error": {"message": "no such mode", "type": "invalid_request_error"}}')

    def reply(self, status, kind, data):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
