"""Stands in for vLLM's process tree where vLLM itself is not needed: the parent (the API
server) starts a child that outlives it unless its group is reaped (vLLM's EngineCore,
renamed and with no home path on its command line), then answers /health and one
completion. Each start appends 'parent PID' and 'child PID' to the file named by argv[2]."""

import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, record = int(sys.argv[1]), sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(record, "a") as fh:
    fh.write(f"parent {__import__('os').getpid()}\nchild {child.pid}\n")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self._send({"ok": True})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"text": "!"}]})

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
