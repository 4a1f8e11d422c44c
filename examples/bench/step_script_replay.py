#!/usr/bin/env python3
"""What a replicated step's script costs Redis to run, replayed on an idle Redis.

The bench reads Redis's CPU per flow and `INFO commandstats` while every process of
the scenario shares the machine's two cores; there a script call's execution time
(`evalsha`'s `usec_per_call`) more than doubles, and what inside it costs what cannot
be told apart. This replays the step scripts (`client::STEP`) of real flows, one at a
time, on a Redis of its own that nothing else uses, and prints, per script text:

- `evalsha`'s execution time per call (`usec_per_call`, the commands the script ran
  included);
- the commands the script ran, with their own execution times (Redis counts a
  script's commands in `INFO commandstats` too);
- the same for a script that does nothing but return (`--baseline`): what running a
  script with those arguments costs before it does anything.

The steps come from a `redis-cli MONITOR` capture taken while a gateway served legacy
flows on that Redis, for instance:

    redis-server --port 6399 --save '' --appendonly no --daemonize yes
    redis-cli -p 6399 MONITOR > /tmp/monitor.txt &
    python3 examples/bench/callgrind_counts.py --dualera target/profiling/dualera \\
        --out /tmp/cg --calls 5 --flows 10 --sessions 5 \\
        --session-store redis://127.0.0.1:6399/0
    kill %1
    python3 examples/bench/step_script_replay.py --monitor /tmp/monitor.txt \\
        [--script VARIANT.lua ...] [--passes 30]

A step is an `EVALSHA` with one key and at least 24 arguments (the other scripts
have other shapes). Each is replayed as it was sent, after setting the session's
version to the one it expects (`HDEL`, `HINCRBY`: commands no step runs but a
session's end), so that it stores rather than conflicts; every pass
starts from an empty database (the streams' entry ids then grow as they did). The
script replayed is `STEP` as `crates/gateway/src/store/redis/client.rs` has it now
(`--source`), and each `--script` file after it: a variant is measured against the
same steps. Loopback only; the Redis it starts (`redis-server` on a free port, in a
temporary directory) is stopped at the end. Standard library only.
"""

import argparse
import hashlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BASELINE = "return '1'"


def unrepr(token):
    """A MONITOR argument (`sdscatrepr`'s quoting) back to its bytes."""
    out = bytearray()
    i = 0
    escapes = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b",
               "\\": b"\\", '"': b'"'}
    while i < len(token):
        c = token[i]
        if c == "\\" and i + 1 < len(token):
            n = token[i + 1]
            if n == "x":
                out.append(int(token[i + 2:i + 4], 16))
                i += 4
                continue
            out += escapes.get(n, n.encode())
            i += 2
            continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    return bytes(out)


def steps(path):
    """The step calls of a MONITOR capture: each as its arguments after `EVALSHA SHA`."""
    found = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            if "[0 lua]" in line or '"EVALSHA"' not in line.upper():
                continue
            args = [unrepr(t) for t in re.findall(r'"((?:[^"\\]|\\.)*)"', line)]
            # EVALSHA sha numkeys key version state ARGV[3..]
            if len(args) >= 4 + 24 and args[0].upper() == b"EVALSHA" and args[2] == b"1":
                found.append(args[2:])
    return found


def step_script(source):
    text = open(source, encoding="utf-8").read()
    m = re.search(r'const STEP: &str = r"(.*?)";', text, re.S)
    if not m:
        sys.exit(f"no STEP script in {source}")
    return m.group(1)


class Resp:
    """One RESP connection (replies read whole: they are small here)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))
        data = b""
        while not data.endswith(b"\r\n") or not complete(data):
            chunk = self.s.recv(1 << 20)
            if not chunk:
                sys.exit("redis closed the connection")
            data += chunk
        if data.startswith(b"-"):
            sys.exit(f"redis: {data.decode(errors='replace').strip()}")
        return data


def complete(data):
    """Whether `data` holds one whole RESP reply."""
    def parse(i):
        line_end = data.find(b"\r\n", i)
        if line_end < 0:
            return None
        kind, head = data[i:i + 1], data[i + 1:line_end]
        i = line_end + 2
        if kind in b"+-:":
            return i
        n = int(head)
        if kind == b"$":
            return i + n + 2 if n >= 0 and len(data) >= i + n + 2 else (i if n < 0 else None)
        for _ in range(max(n, 0)):
            i = parse(i)
            if i is None:
                return None
        return i
    return parse(0) == len(data)


def stats(r):
    text = r.send(["INFO", "commandstats"]).decode()
    out = {}
    for line in text.split("\r\n"):
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            fields = dict(kv.split("=") for kv in rest.split(","))
            out[name] = (int(fields["calls"]), int(fields["usec"]))
    return out


def replay(r, script, calls, passes):
    """Runs `calls` with `script` `passes` times; evalsha's µs per call and the
    commands the script ran (calls and µs per step)."""
    sha = hashlib.sha1(script.encode()).hexdigest()
    r.send(["SCRIPT", "LOAD", script])
    usec = n = 0
    inner = {}
    for _ in range(passes):
        r.send(["FLUSHALL"])
        r.send(["CONFIG", "RESETSTAT"])
        for args in calls:
            key, version = args[1], args[2]
            # With commands no step runs (but a session's end, which drops `d` with
            # HDEL), so that Redis's counts of the script's own stay apart.
            r.send(["HDEL", key, "v"])
            r.send(["HINCRBY", key, "v", version])
            r.send(["EVALSHA", sha] + args)
        st = stats(r)
        c, u = st.pop("evalsha", (0, 0))
        n += c
        usec += u
        for name, (c, u) in st.items():
            if name in ("hdel", "hincrby", "config|resetstat", "flushall", "info", "script|load"):
                continue
            a = inner.setdefault(name, [0, 0.0])
            a[0] += c
            a[1] += u
    return usec / max(n, 1), {k: (c / max(n, 1), u / max(c, 1)) for k, (c, u) in inner.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--monitor", required=True, help="a redis-cli MONITOR capture")
    ap.add_argument("--source", default="crates/gateway/src/store/redis/client.rs")
    ap.add_argument("--script", action="append", default=[], help="a variant to measure too")
    ap.add_argument("--passes", type=int, default=30)
    o = ap.parse_args()
    calls = steps(o.monitor)
    if not calls:
        sys.exit(f"no step calls in {o.monitor}")
    scripts = [("STEP (" + o.source + ")", step_script(o.source)), ("baseline: " + BASELINE, BASELINE)]
    scripts += [(p, open(p, encoding="utf-8").read()) for p in o.script]
    redis = shutil.which("redis-server")
    if not redis:
        sys.exit("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="dualera-replay-")
    p = subprocess.Popen([redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", tmp],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                r = Resp(port)
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("redis-server did not start")
                time.sleep(0.05)
        size = sum(len(a) for c in calls for a in c) / len(calls)
        print(f"{len(calls)} steps, {sum(len(c) for c in calls) / len(calls) - 1:.1f} keys and arguments "
              f"and {size:.0f} bytes each; {o.passes} passes, alternating by script")
        rows = {name: [] for name, _ in scripts}
        inner = {}
        # Interleaved, twice over: a drift of the machine spreads over every script.
        for _ in range(2):
            for name, text in scripts:
                us, ran = replay(r, text, calls, max(o.passes // 2, 1))
                rows[name].append(us)
                inner.setdefault(name, ran)
        for name, _ in scripts:
            us = sum(rows[name]) / len(rows[name])
            ran = inner[name]
            own = sum(c * u for c, u in ran.values())
            n = sum(c for c, _ in ran.values())
            print(f"{name}: {us:.2f} µs per call; inside it {n:.1f} commands per step "
                  f"taking {own:.2f} µs of their own")
            for k, (c, u) in sorted(ran.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
                print(f"    {k:<12} {c:5.2f} per step at {u:.2f} µs")
    finally:
        p.terminate()
        p.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
