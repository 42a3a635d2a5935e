"""An OTLP/HTTP sink for the overhead benchmarks: takes every POST, answers 200, keeps nothing.
Usage: python3 bench/otlp-sink.py PORT"""
import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
