"""A server that answers only ``GET …/identity``, with the JSON given as its argument:
for tests of identities ``runner target-serve`` never gives (a malformed declaration).
Prints ``listening on port N`` on stderr; stops on SIGTERM.

    python tests/procs/identity_server.py '{"target_id": "x", "protocol": 2}'
"""

from __future__ import annotations

import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


def main() -> int:
    body = sys.argv[1].encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path.rstrip("/").endswith("/identity")
            self.send_response(200 if found else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def do_POST(self) -> None:
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"listening on port {server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
