"""A stand-in for a REST spreadsheet database, run as its own process (issue 29: the kind
of service runner was tried against through an adapter written from the how-to).

Rows live in memory behind a small HTTP API, with the two limits such services have and
an adapter must live with:

* a request line longer than ``MAX_REQUEST_LINE`` bytes is refused with 431 (Request
  Header Fields Too Large), as an HTTP server with a 16 KiB line buffer does: a URL holds
  about 430 of runner's write_ids;
* a list answers ``DEFAULT_PAGE`` rows unless ``limit`` asks for more (at most
  ``MAX_PAGE``), and says in ``pageInfo.isLastPage`` whether more pages follow.

API::

    POST /rows   {"rows": [{"write_id", "fields"}]}   -> 200 {"inserted": n}
    GET  /rows?where=write_id,in,ID,ID,...[&limit=N][&offset=M]
                 -> 200 {"list": [{"write_id", "fields", "status"}],
                         "pageInfo": {"isLastPage": bool}}

Usage: ``python -m tests.procs.rows_service``; it prints ``listening on port N`` and
serves until SIGTERM.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_REQUEST_LINE = 16 * 1024
DEFAULT_PAGE = 25
MAX_PAGE = 1000

ROWS: list[dict[str, Any]] = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # an answer's headers and body are two writes

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test reads only the port line."""

    def _answer(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        try:
            doc = json.loads(self.rfile.read(length))
            rows = [{"write_id": str(r["write_id"]), "fields": dict(r["fields"]),
                     "status": "new"} for r in doc["rows"]]
        except (ValueError, KeyError, TypeError):
            self._answer(400, {"msg": "malformed rows"})
            return
        with LOCK:
            ROWS.extend(rows)
        self._answer(200, {"inserted": len(rows)})

    def do_GET(self) -> None:
        if len(self.requestline) > MAX_REQUEST_LINE:
            self.close_connection = True
            self._answer(431, {"msg": "Request Header Fields Too Large"})
            return
        query = parse_qs(urlsplit(self.path).query)
        where = query.get("where", [""])[0].split(",")
        if where[:2] != ["write_id", "in"]:
            self._answer(400, {"msg": "where=write_id,in,... is required"})
            return
        wanted = set(where[2:])
        limit = min(int(query.get("limit", [DEFAULT_PAGE])[0]), MAX_PAGE)
        offset = int(query.get("offset", ["0"])[0])
        with LOCK:
            found = [row for row in ROWS if row["write_id"] in wanted]
        page = found[offset : offset + limit]
        self._answer(200, {"list": page,
                           "pageInfo": {"isLastPage": offset + limit >= len(found)}})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
