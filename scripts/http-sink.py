#!/usr/bin/env python3
"""A webhook receiver for drain measurements: answers 204 to every POST and counts them.

    scripts/http-sink.py 18080 &
    scripts/drain.sh 100000 'http://127.0.0.1:18080/hook'

Python's threaded server, so the rates it allows are a floor, not the relay's ceiling.
"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the relay's client expects
    count = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Sink.count += 1
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 18080
    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
