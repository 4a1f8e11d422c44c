#!/usr/bin/env python3
"""Checks that a dualera binary serves `dualera up`: starts it on free loopback ports
in a temporary folder, sends a legacy (2025-11-25) initialize to the gateway, expects
200 with an Mcp-Session-Id, then stops it (SIGTERM) and expects a clean exit.

Usage: .ci/up_served.py PATH/TO/dualera
"""
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

WAIT = 60


def main() -> int:
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen(
            [binary, "up", "--dir", f"{work}/demo", "--listen", "127.0.0.1:0",
             "--admin", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        found = threading.Event()
        url: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                m = re.search(r"gateway \(legacy and modern hosts\): (\S+)", line)
                if m and not url:
                    url.append(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        try:
            if not found.wait(WAIT) or not url:
                print("up_served: no gateway URL in the banner:\n" + "".join(lines))
                return 1
            body = json.dumps({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "ci", "version": "1"}},
            }).encode()
            req = urllib.request.Request(url[0], data=body, method="POST", headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            })
            with urllib.request.urlopen(req, timeout=WAIT) as resp:
                session = resp.headers.get("Mcp-Session-Id")
                if resp.status != 200 or not session:
                    print(f"up_served: initialize answered {resp.status}, session {session!r}")
                    return 1
            print(f"up_served: {binary}: initialize 200, Mcp-Session-Id {session[:8]}…")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if code != 0:
            print(f"up_served: exit status {code}:\n" + "".join(lines))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
