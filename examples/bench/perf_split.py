#!/usr/bin/env python3
"""Where a replicated flow's extra CPU goes, in real CPU time: kernel included.

callgrind (`callgrind_counts.py`) counts instructions; it does not see the kernel, a
wake-up, or a cache miss, and those are most of what a round trip to Redis costs on a
machine whose cores everything shares. This runs the bench's replicas scenario under
`perf record -a -g -e cpu-clock` (every CPU, call stacks by frame pointer) and splits
the samples of the one-host rounds. Those rounds alternate flows one by one between one
gateway in memory and the two replicas, so in any stretch of them both variants run the
same number of flows: their sample counts compare per flow as they stand.

With `--capacity` it splits the capacity rounds instead (8 hosts at once, the variants
alternating by round: one variant's gateways work while the other's idle). The
variants run different numbers of flows there, so each variant's samples are priced
by its own CPU per flow in those rounds (the bench's table), not by the other's.

A sample whose leaf frame is the kernel's goes under its system call: socket writes
(whose loopback TCP path runs the receiver's side too, up to waking it), socket reads,
`futex` (a thread waking or waiting for another), `epoll_wait` (the runtime waiting for
I/O), or none (an interrupt, the scheduler). Any other sample is put under the
innermost frame of its stack that belongs to one of these (first match from the leaf
up): the MessagePack codec (`rmp`), the Redis client (`redis::`, its parser
`combine::`, `tokio_util::codec`, and the store's command connections,
`store::redis_conns`), `serde_json`, the adapters' machines, hyper, the
Redis store, the rest of the gateway, the tokio runtime, and the allocator and libc's
copies.

Usage (a build with frame pointers, so that user stacks unwind; its own target dir):

    CARGO_TARGET_DIR=/tmp/fp RUSTFLAGS="-C force-frame-pointers=yes" \\
        cargo build --profile profiling --all-features --locked --examples --bin dualera
    python3 examples/bench/perf_split.py --target /tmp/fp/profiling --out /tmp/split \\
        [--affinity] [--capacity] [--pin bench=0 --pin redis=1]

It needs `perf` with `perf_event_paranoid` allowing system-wide sampling (or root). It
prints one table, leaves `perf.data`, the bench's output and the split as JSON in
`--out` (with each variant's process ids, to read `perf.data` again by process).
Standard library only.
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

COMPONENTS = [
    ("MessagePack codec", r"rmp"),
    ("Redis client", r"^<?redis::|combine::|tokio_util::codec|store::redis_conns"),
    ("serde_json", r"serde_json"),
    ("adapters", r"dualera_adapters"),
    ("hyper", r"hyper"),
    ("Redis store", r"store::redis::"),
    ("gateway, other", r"dualera_gateway|dualera_common"),
    ("tokio runtime", r"tokio::"),
    ("allocator, copies", r"_rjem|memmove|memcpy|memcmp"),
]
COMPILED = [(name, re.compile(p)) for name, p in COMPONENTS]
SYSCALLS = [
    ("kernel: no system call (interrupts, scheduling)", r"exit_to_user_mode"),
    ("kernel: socket writes", r"writev|sendto|sendmsg|ksys_write"),
    ("kernel: socket reads", r"recv|read"),
    ("kernel: futex", r"futex"),
    ("kernel: epoll_wait", r"epoll"),
]
# A one-host round's line, and a capacity round's.
ROUND = re.compile(r"^\s+round \d: in memory ")
CAPACITY_ROUND = re.compile(r"^\s+round \d \(\d+ hosts each\): ")
GATEWAY_CPU = re.compile(r"gateway CPU per replicated flow .*?\| ([\d.]+) \((\d+) / (\d+) µs\)")
# The capacity table's rows: each variant's gateway CPU per flow in those rounds.
CAPACITY_HEAD = re.compile(r"^\d+ hosts at once per variant")
CAPACITY_ROW = re.compile(r"^\| (1 gateway|2 gateway replicas)[^|]*\| [\d.]+ \| (\d+) \|")


def watch_processes(stop, found):
    """Polls `ps` for the one-host rounds' gateways (one in memory, two replicas) until
    it has them all, or until `stop` is set; later phases' gateways are not wanted."""
    while not stop.is_set():
        if len(found.get("memory", ())) >= 1 and len(found.get("replicas", ())) >= 2:
            return
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pid, _, args = line.strip().partition(" ")
            if " gateway " in f" {args} " and "bench-gateway-redis.toml" in args:
                found.setdefault("replicas", set()).add(pid)
            elif " gateway " in f" {args} " and "bench-gateway.toml" in args:
                found.setdefault("memory", set()).add(pid)
        time.sleep(0.5)


def record(o):
    bench = os.path.join(o.target, "examples", "bench")
    dualera = o.dualera or os.path.join(o.target, "dualera")
    data = os.path.join(o.out, "perf.data")
    cmd = ["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", str(o.freq), "-k",
           "CLOCK_MONOTONIC", "-o", data, "--", bench, "--no-build", "--dualera", dualera,
           "--scenarios", "replicas", "--rounds", "2", "--secs", str(o.secs)]
    if o.affinity:
        cmd.append("--replica-affinity")
    for pin in o.pin:
        cmd += ["--pin", pin]
    found, stop = {}, threading.Event()
    t = threading.Thread(target=watch_processes, args=(stop, found), daemon=True)
    t.start()
    lines = []
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        lines.append((time.clock_gettime(time.CLOCK_MONOTONIC), line.rstrip("\n")))
    stop.set()
    if p.wait() != 0:
        sys.exit(f"perf_split: perf record or the bench failed ({p.returncode}); "
                 + " / ".join(l for _, l in lines[-5:]))
    with open(os.path.join(o.out, "bench.txt"), "w") as f:
        f.writelines(f"{ts:.3f} {l}\n" for ts, l in lines)
    return data, lines, found


def window(lines, capacity=False):
    """The one-host rounds: from a round's length before round 1 ends to round 2's end.
    The capacity rounds: from there to the last capacity round's end (the gateways
    are only measured, not loaded, between the two)."""
    ends = [ts for ts, l in lines if ROUND.match(l)]
    if len(ends) < 2:
        sys.exit("perf_split: the bench printed no one-host rounds")
    if capacity:
        last = [ts for ts, l in lines if CAPACITY_ROUND.match(l)]
        if not last:
            sys.exit("perf_split: the bench printed no capacity rounds")
        return ends[-1], last[-1]
    length = ends[1] - ends[0]
    return ends[0] - length, ends[1]


def capacity_cpu(lines):
    """Each variant's gateway CPU per flow in the capacity rounds, from the bench's
    table: {"memory": µs, "replicas": µs}."""
    cpu, inside = {}, False
    for _, l in lines:
        if CAPACITY_HEAD.match(l):
            inside = True
        elif inside:
            m = CAPACITY_ROW.match(l)
            if m:
                cpu["memory" if m.group(1) == "1 gateway" else "replicas"] = int(m.group(2))
            if len(cpu) == 2:
                break
    return cpu


def split(data, pids, t0, t1):
    """Samples per place for each variant's processes within [t0, t1]."""
    out = subprocess.Popen(["perf", "script", "-i", data, "-F", "pid,time,ip,sym,dso"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           errors="replace")
    owner = {pid: v for v, ps in pids.items() for pid in ps}
    counts = {v: collections.Counter() for v in pids}
    cur, stack = None, []

    def flush():
        if cur is None or not stack:
            return
        if "kernel" in stack[0][1]:
            names = [f for f, _ in stack]
            if "do_syscall_64" in names[1:]:
                call = names[names.index("do_syscall_64") - 1]
                comp = next((n for n, p in SYSCALLS if re.search(p, call)),
                            "kernel: other system calls")
            else:
                comp = "kernel: no system call (interrupts, scheduling)"
        else:
            comp = next((n for f, _ in stack for n, p in COMPILED if p.search(f)), "other")
        counts[cur][comp] += 1

    for line in out.stdout:
        if not line.strip():
            flush()
            cur, stack = None, []
        elif not line.startswith("\t"):
            m = re.match(r"\s*(\d+)\s+([\d.]+):", line)
            cur = owner.get(m.group(1)) if m and t0 <= float(m.group(2)) <= t1 else None
            stack = []
        elif cur is not None:
            m = re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)$", line.rstrip())
            if m:
                stack.append((m.group(1), m.group(2)))
    flush()
    out.wait()
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True,
                    help="profile dir holding dualera and examples/bench")
    ap.add_argument("--dualera", help="another build of the binary (default: TARGET/dualera)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--freq", type=int, default=997)
    ap.add_argument("--secs", type=int, default=3)
    ap.add_argument("--affinity", action="store_true",
                    help="each replicated session on one replica (the bench's --replica-affinity)")
    ap.add_argument("--capacity", action="store_true",
                    help="split the capacity rounds (8 hosts at once), not the one-host rounds")
    ap.add_argument("--pin", action="append", default=[], metavar="NAME=CPUS",
                    help="passed to the bench as is (repeatable): e.g. --pin bench=0 --pin redis=1")
    o = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf_split: `perf` is not installed (Debian: linux-perf)")
    binaries = (os.path.join(o.target, "examples", "bench"),
                o.dualera or os.path.join(o.target, "dualera"))
    for path in binaries:
        if not os.access(path, os.X_OK):
            sys.exit(f"perf_split: {path} is not an executable; build it first "
                     "(see the usage above)")
    os.makedirs(o.out, exist_ok=True)
    data, lines, pids = record(o)
    if set(pids) != {"memory", "replicas"}:
        sys.exit(f"perf_split: did not find both variants' gateways ({sorted(pids)})")
    t0, t1 = window(lines, o.capacity)
    counts = split(data, pids, t0, t1)
    nm, nr = sum(counts["memory"].values()), sum(counts["replicas"].values())
    rounds = "capacity rounds" if o.capacity else "one-host rounds"
    if not nm or not nr:
        sys.exit(f"perf_split: no samples of the gateways in the {rounds}")
    # µs per flow a sample stands for, per variant: its gateway CPU per flow (the
    # bench's own figure, from /proc) over its samples in the window. In the one-host
    # rounds both variants run the same flows, so the in-memory figure prices both.
    if o.capacity:
        cap = capacity_cpu(lines)
        per = {v: cap[v] / n for v, n in (("memory", nm), ("replicas", nr))} \
            if len(cap) == 2 else None
        said = (f"the bench's CPU per flow {cap['memory']} / {cap['replicas']} µs"
                if per else "the bench's CPU per flow not found")
    else:
        cpu = next((m for _, l in lines for m in [GATEWAY_CPU.search(l)] if m), None)
        per = {v: int(cpu.group(3)) / nm for v in ("memory", "replicas")} if cpu else None
        said = f"the bench's CPU ratio {cpu.group(1) if cpu else '?'}×"
    price = (lambda v, x: x * per[v]) if per else (lambda v, x: x)
    keys = sorted(set(counts["memory"]) | set(counts["replicas"]),
                  key=lambda k: -(price("replicas", counts["replicas"][k])
                                  - price("memory", counts["memory"][k])))
    print(f"{rounds}, {t1 - t0:.1f} s: samples in memory {nm}, both replicas {nr} "
          f"({nr / nm:.2f}×; {said})")
    unit = "µs per flow" if per else "samples"
    print(f"| where ({unit}) | in memory | both replicas | extra | share of the extra |")
    print("|---|---:|---:|---:|---:|")
    extra = price("replicas", nr) - price("memory", nm)
    rows = []
    for k in keys:
        a, b = counts["memory"][k], counts["replicas"][k]
        if a + b < max(3, (nm + nr) // 500):
            continue
        pa, pb = price("memory", a), price("replicas", b)
        f = (lambda x: f"{x:.0f}") if per else (lambda x: str(int(x)))
        share = f"{100 * (pb - pa) / extra:.0f} %" if extra > 0 else "–"
        print(f"| {k} | {f(pa)} | {f(pb)} | {f(pb - pa)} | {share} |")
        rows.append({"where": k, "memory": a, "replicas": b})
    with open(os.path.join(o.out, "split.json"), "w") as fh:
        json.dump({"rounds": rounds, "window_s": t1 - t0, "us_per_sample": per,
                   "rows": rows,
                   # For reading `perf.data` again by process (`perf script -F pid,...`).
                   "pids": {v: sorted(p) for v, p in pids.items()},
                   "samples": {"memory": nm, "replicas": nr}}, fh, indent=1)


if __name__ == "__main__":
    main()
