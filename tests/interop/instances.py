"""Several instances behind one gateway, for the interop suite's `*/instances` columns.

`Instances` stands where `run.Dualera` stands (same attributes: url, upstream, workspace,
repo, notes(), upstream_call(), log_tail(), stop()): two `dualera serve` processes on one
PostgreSQL database (a private throw-away cluster, shared by the run, one database per
case), with the same `[[state.keys]]`, behind one `dualera gateway --upstream A
--upstream B`. PostgreSQL comes from Debian (tests/services/debian.sh); it refuses to run
as root, so as root the cluster runs as the `postgres` user. A missing PostgreSQL fails
the case.

`rounds()` reads the instances' logs afterwards: every MRTR round's first attempt and its
retry (the server logs a digest of the `requestState` each call issued and received), so a
case can assert which instance answered each. `kill(i)` stops an instance with SIGKILL,
as a crashed machine would, while the case goes on.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from procs import free_port, modern_call, wait_line

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
INSTANCES = 2
STATE_SECRET = "interop-instances-secret-0123456789abcdef"
# `call answered` lines of the modern server (DUALERA_LOG=debug): one per tools/call,
# prompts/get or resources/read it answered, with the requestState digests.
ANSWERED = re.compile(r"call answered(?P<fields>.*)$")
FIELD = re.compile(r'(state_in|state_out|result)="?([0-9a-z_]+)"?')


def run(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return p.stdout


class PgCluster:
    """A throw-away PostgreSQL cluster on a free loopback port (fsync off: scratch)."""

    def __init__(self) -> None:
        run(["bash", str(ROOT / "tests/services/debian.sh"), "postgresql"])
        versions = sorted((int(p.name), p / "bin") for p in Path("/usr/lib/postgresql").iterdir()
                          if p.name.isdigit() and (p / "bin" / "initdb").exists())
        if not versions:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bin = versions[-1][1]
        self.as_postgres = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="dualera-interop-pg-"))
        self.password = os.urandom(18).hex()
        (self.dir / "pwfile").write_text(self.password)
        if self.as_postgres:
            run(["chown", "-R", "postgres:postgres", str(self.dir)])
        self.port = 0
        run(self._cmd("initdb", "-D", str(self.dir / "data"), "-U", "postgres", "-A", "scram-sha-256",
                      "-E", "UTF8", "--no-locale", "--no-sync", f"--pwfile={self.dir / 'pwfile'}"))
        last = ""
        for _ in range(5):
            self.port = free_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c max_connections=200 "
                    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            try:
                run(self._cmd("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"),
                              "-w", "-t", "120", "-o", opts, "start"))
                break
            except RuntimeError as e:
                last = str(e)
        else:
            raise RuntimeError(f"PostgreSQL did not start: {last}")
        self.databases = 0

    def _cmd(self, program: str, *args: str) -> list[str]:
        path = str(self.bin / program)
        return ["runuser", "-u", "postgres", "--", path, *args] if self.as_postgres else [path, *args]

    def psql(self, db: str, sql: str) -> str:
        env = dict(os.environ, PGPASSWORD=self.password, PGSSLMODE="disable")
        return run([str(self.bin / "psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                    "-h", "127.0.0.1", "-U", "postgres", "-p", str(self.port), "-d", db, "-c", sql], env=env)

    def create_database(self) -> tuple[str, str]:
        self.databases += 1
        name = f"case_{self.databases}"
        self.psql("postgres", f"CREATE DATABASE {name}")
        return name, f"postgres://postgres:{self.password}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.port:
            subprocess.run(self._cmd("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"),
                           capture_output=True, timeout=60)
            self.port = 0
        shutil.rmtree(self.dir, ignore_errors=True)


_CLUSTER: PgCluster | None = None


def cluster() -> PgCluster:
    """The run's cluster, started on first use and stopped when the suite exits."""
    global _CLUSTER
    if _CLUSTER is None:
        _CLUSTER = PgCluster()
        atexit.register(_CLUSTER.stop)
    return _CLUSTER


class Instances:
    def __init__(self, binary: Path, workdir: Path):
        self.dir = workdir / "demo"
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.instance_logs: list[Path] = []
        self.instance_urls: list[str] = []
        self.instances: list[subprocess.Popen] = []
        self.killed: list[int] = []
        self.log_path = workdir / "gateway.log"
        try:
            self._start(binary)
        except Exception:
            self.stop()
            raise

    def _spawn(self, args: list[str], log: Path, env: dict) -> subprocess.Popen:
        out = open(log, "w")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        out.close()
        self.procs.append(p)
        return p

    def _start(self, binary: Path) -> None:
        pg = cluster()
        self.database, url = pg.create_database()
        self.pg = pg
        self.dir.mkdir(parents=True)
        notes = self.dir.resolve() / "notes"
        repo = self.dir.resolve() / "repo"
        # The demo layout (workspace, repository, seeded notes) is made by the first
        # instance's --demo; the shared config adds the state keys every instance needs.
        config = self.workdir / "serve.toml"
        config.write_text(
            f'[state]\n[[state.keys]]\nid = "interop"\nsecret = "{STATE_SECRET}"\n\n'
            f'[[grants]]\nprincipal = "local"\nworkspaces = ["file://{notes}"]\nrepositories = ["{repo}"]\n')
        env = dict(os.environ, DUALERA_LOG="info,dualera_server::router=debug", NO_COLOR="1",
                   DUALERA_STORE_URL=url)
        for i in range(INSTANCES):
            log = self.workdir / f"serve-{i}.log"
            self.instance_logs.append(log)
            p = self._spawn([str(binary), "serve", "--demo", str(self.dir), "--config", str(config),
                             "--listen", "127.0.0.1:0"], log, env)
            self.instances.append(p)
            self.instance_urls.append(wait_line(log, "modern server listening on", p).split()[-1])
            if i == 0:
                demo = wait_line(log, "demo workspace", p)
                m = re.search(r"demo workspace (\S+) and repository (.+)$", demo)
                self.workspace, self.repo = m.group(1), m.group(2).strip()
        self.upstream = self.instance_urls[0]
        env = dict(os.environ, DUALERA_LOG="debug", NO_COLOR="1")
        env.pop("DUALERA_STORE_URL", None)
        args = [str(binary), "gateway", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
        for u in self.instance_urls:
            args += ["--upstream", u]
        g = self._spawn(args, self.log_path, env)
        self.url = wait_line(self.log_path, "gateway listening on", g).split()[-1]
        self.admin = wait_line(self.log_path, "admin listening on", g).split()[-1]

    def notes(self) -> dict[str, dict[str, str]]:
        out = self.pg.psql(self.database, "SELECT id, workspace, title, body FROM notes ORDER BY id")
        notes = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            nid, ws, title, body = line.split("\t", 3)
            notes[f"note-{nid}"] = {"workspace": ws, "title": title, "body": body}
        return notes

    def upstream_call(self, method: str, params: dict | None = None) -> dict:
        """A raw 2026-07-28 request straight to the modern server (the reference answer)."""
        return modern_call(self.upstream, method, params)

    def kill(self, i: int) -> None:
        """Stops instance `i` at once (SIGKILL: no graceful shutdown, as on a crash)."""
        p = self.instances[i]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        self.killed.append(i)

    def rounds(self) -> list[dict]:
        """Every retry the instances answered: {state, asked: instance that issued the
        state, answered: instance that got the retry, result}, in log order."""
        issued: dict[str, int] = {}
        retries: list[tuple[int, str, str]] = []
        for i, log in enumerate(self.instance_logs):
            for line in log.read_text(errors="replace").splitlines():
                m = ANSWERED.search(line)
                if not m:
                    continue
                fields = dict(FIELD.findall(m.group("fields")))
                if "state_out" in fields:
                    issued[fields["state_out"]] = i
                if "state_in" in fields:
                    retries.append((i, fields["state_in"], fields.get("result", "")))
        return [{"state": s, "asked": issued.get(s), "answered": i, "result": r} for i, s, r in retries]

    def log_tail(self, n: int = 80) -> str:
        parts = []
        for log in [self.log_path, *self.instance_logs]:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"--- {log.name} (tail {n}):\n" + "\n".join(lines[-n:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
