"""A transparent recording HTTP proxy for the client → gateway hop (standard library only).

The interop clients talk to the gateway through this tap so that a failing case can print
the exact HTTP exchange: methods, the MCP headers, request bodies and every response body
or SSE event, in order, with timestamps. Bodies are forwarded unchanged; SSE responses are
streamed through chunk by chunk as they arrive (never buffered), so live elicitation,
sampling and roots rounds work exactly as they do without the tap.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
              "upgrade", "host", "content-length"}
SHOWN_HEADERS = ("mcp-session-id", "mcp-protocol-version", "mcp-method", "mcp-name", "last-event-id")
MAX_SHOWN = 2000  # characters of one body or event in the transcript


class Wiretap:
    def __init__(self, target_url: str, client: str = "client", server: str = "gateway"):
        # Who is on either side, for the transcript ("gateway -> upstream" on hop 2).
        self.up = f"{client} -> {server}"
        self.down = f"{server} -> {client}"
        t = urlsplit(target_url)
        self.host, self.port, self.path = t.hostname, t.port, t.path
        self.lines: list[str] = []
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.counter = 0
        # (method, HTTP status) of every exchange, in order.
        self.statuses: list[tuple[str, int]] = []
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # the transcript replaces the access log
                pass

            def do_POST(self):
                tap.forward(self)

            do_GET = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = do_POST

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                # A client dropping an idle keep-alive connection is not news; note, don't print.
                tap.note(0, f"connection from {client_address[1]} ended abruptly")

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def note(self, n: int, text: str) -> None:
        if len(text) > MAX_SHOWN:
            text = text[:MAX_SHOWN] + f"... ({len(text)} chars)"
        with self.lock:
            self.lines.append(f"{time.monotonic() - self.start:8.3f} #{n} {text}")

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.counter += 1
            n = self.counter
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        shown = " ".join(f"{k}={h.headers[k]}" for k in SHOWN_HEADERS if h.headers.get(k))
        self.note(n, f"{self.up} {h.command} {shown} {body.decode(errors='replace')}".rstrip())
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = f"{self.host}:{self.port}"
        if body or h.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        try:
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            self.note(n, f"gateway unreachable: {e}")
            h.send_error(502)
            conn.close()
            return
        ctype = resp.getheader("Content-Type", "")
        sid = resp.getheader("Mcp-Session-Id")
        self.note(n, f"{self.down} HTTP {resp.status} {ctype}" + (f" mcp-session-id={sid}" if sid else ""))
        with self.lock:
            self.statuses.append((h.command, resp.status))
        try:
            h.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    h.send_header(k, v)
            if "text/event-stream" in ctype:
                self.stream(n, h, resp)
            else:
                data = resp.read()
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
                h.wfile.flush()
                if data:
                    self.note(n, f"{self.down} {data.decode(errors='replace')}")
        except OSError as e:  # the client went away: drop the upstream request too
            self.note(n, f"client closed the connection ({type(e).__name__})")
            h.close_connection = True
        finally:
            conn.close()

    def stream(self, n: int, h: BaseHTTPRequestHandler, resp: http.client.HTTPResponse) -> None:
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        pending = ""
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            h.wfile.flush()
            pending += chunk.decode(errors="replace").replace("\r\n", "\n")
            while "\n\n" in pending:
                event, pending = pending.split("\n\n", 1)
                shown = " ".join(ln for ln in event.split("\n") if not ln.startswith(":") and ln)
                if shown:
                    self.note(n, f"{self.down} SSE {shown}")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
        self.note(n, f"{self.down} SSE stream ended")

    def transcript(self, last: int | None = None) -> str:
        with self.lock:
            lines = list(self.lines)
        if last is not None and len(lines) > last:
            lines = [f"... ({len(lines) - last} earlier lines)"] + lines[-last:]
        return "\n".join(lines)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
