"""A stand-in for a local model server: answers GET /v1/models (and nothing else) on a port. Run
as `python models_server.py PORT` it is a child a LocalServer can start; `serving(port)` runs it
in the test process, a neighbour on that port."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LISTING = json.dumps({"object": "list", "data": [{"id": "smollm2"}]}).encode()


class _Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the name http.server calls
        found = self.path.rstrip("/") == "/v1/models"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(LISTING) if found else 0))
        self.end_headers()
        if found:
            self.wfile.write(LISTING)

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read no log
        pass


@contextmanager
def serving(port: int) -> Iterator[http.server.ThreadingHTTPServer]:
    """The listing server on 127.0.0.1:`port`, in a thread of this process, for the block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), _Models).serve_forever()
