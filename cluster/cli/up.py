"""`raftq up`: a local cluster in the foreground that is a lab for failover, and `raftq local`,
which acts on it from another terminal.

`raftq up` runs the nodes (cluster/local.py) and supervises them: a node that dies is reported
and started again after a back-off (1 s, doubling while it keeps dying soon after its start, at
most 30 s) unless `--no-restart`; leader changes and a restarted node's catch-up are reported as
they happen. Everything lives in one directory (default `$XDG_STATE_HOME/raftq/up`, else
`~/.local/state/raftq/up`), kept at exit, so the next `raftq up` continues the same cluster:

    n1.toml ...      the node configs, rewritten at every start (from up.toml and the layout)
    n1.log ...       each node's log, appended to across restarts
    data/n1 ...      each node's journal and snapshot
    up.json          the state: layout (ids, ports, URLs), PIDs, each node's state and restarts
    up.toml          the [limits], [storage], [[queues]], [auth], [tuning] of the last --config
    secret           the cluster's random Raft secret
    ca.pem ...       with --tls: the throwaway CA (ca.pem, ca-key.pem), each node's certificate
                     and key (n1-cert.pem, n1-key.pem ...), with --mtls a client certificate
                     (client-cert.pem, client-key.pem); made once, reused while valid
    up.lock          held by the running `raftq up` (a second one on the directory is refused)
    control/         requests from `raftq local` and their replies

Every file is 0600 and every directory 0700 (the nodes run with umask 077).

`raftq local ACTION NODE` drops a request in control/ and waits for the supervisor's reply: it
alone owns the node processes, so it can tell a death it caused from one it did not, and restart
both the same way. `raftq local status` reads up.json and asks each node itself.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...node.core.limits import ConfigError
from ..shell_worker import describe_exit
from ..files import private_dir, write_private
from ..local import LocalCluster, free_ports, http_json
from . import sections as S

STATE, CONFIG, SECRET, LOCK, CONTROL = "up.json", "up.toml", "secret", "up.lock", "control"
STATE_VERSION = 1
DEFAULT_RETENTION_MS = 7 * 86_400_000
BACKOFF_FIRST_S, BACKOFF_MAX_S, STABLE_AFTER_S = 1.0, 30.0, 10.0
STOP_TIMEOUT_S = 15.0
# What raftq up itself puts in its directory; anything else there means it is not ours.
OURS = re.compile(r"^(n\d+\.(toml|log)|data|up\.(json|toml|lock)|secret|control|\..+\.\d+\.tmp"
                  r"|ca(-key)?\.pem|n\d+-(cert|key)\.pem|client-(cert|key)\.pem)$")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UpError(Exception):
    """An expected failure: printed as `raftq up: ...` (or `raftq local: ...`), exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def default_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "raftq" / "up"


def resolve_dir(given: str | None) -> Path:
    return (Path(given).expanduser() if given else default_dir()).absolute()


def dir_option(directory: Path) -> str:
    """` --dir DIR` when DIR is not the default, for the commands we print."""
    return "" if directory == default_dir().absolute() else f" --dir {directory}"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def clock() -> str:
    return time.strftime("%H:%M:%S")


def fmt_ms_span(ms: int) -> str:
    if ms == 0:
        return "off"
    for unit, size in (("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            n = ms // size
            return f"{n} {unit[:-1] if n == 1 and unit != 's' else unit}" if unit != "s" else f"{n}s"
    return f"{ms} ms"


def exit_text(code: int | None) -> str:
    return "running" if code is None else describe_exit(code)


def read_state(directory: Path) -> dict | None:
    try:
        return json.loads((directory / STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UpError(f"{directory / STATE}: cannot read the state file ({e}); "
                      f"`raftq up{dir_option(directory)} --fresh` starts over")


def lock_holder(directory: Path) -> bool:
    """True when a `raftq up` holds the directory's lock (it is running)."""
    path = directory / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def take_lock(directory: Path) -> int:
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    for _ in range(20):                 # a `raftq local` may hold it shared for an instant
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.05)
    os.close(fd)
    state = read_state(directory) or {}
    raise UpError(f"raftq up is already running on {directory} (pid {state.get('supervisor_pid', '?')}): "
                  f"see `raftq local status{dir_option(directory)}`, or stop it (Ctrl-C in its terminal) first")


def port_free(port: int) -> bool:
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the nodes bind
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pid_runs(pid: int | None, needle: str) -> bool:
    """Whether process `pid` is alive and its command line contains `needle`."""
    if not pid:
        return False
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def proc_stopped(pid: int | None) -> bool:
    """Whether process `pid` is stopped (SIGSTOP), from /proc; False when unknown."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] in "Tt"
    except (OSError, ValueError, IndexError):
        return False


def last_log_line(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return None
    lines = [x for x in lines if not x.startswith("----- ")]
    return lines[-1][:300] if lines else None


# ---------------------------------------------------------------------------- raftq up
@dataclass
class Member:
    """What the supervisor knows about one node process."""
    state: str = "stopped"        # running | paused | stopping | down (restart due) | stopped
    pid: int | None = None
    started_at: float = 0.0       # monotonic
    starts: int = 0
    restarts: int = 0             # starts after the first one of this `raftq up`
    streak: int = 0               # deaths soon after a start, in a row (the back-off grows with it)
    restart_at: float | None = None
    last_exit: str | None = None
    last_exit_at: str | None = None
    down_since: float | None = None
    then: str | None = None       # after a requested stop: "start" or "wipe"
    stop_deadline: float = 0.0
    waiting: list = field(default_factory=list)   # request ids to answer once started again
    awaiting_ready: str | None = None             # why we watch for its catch-up ("restart", "wipe", ...)
    watch_from: float = 0.0                       # since when (monotonic)
    catch_up_to: int = 0                          # the cluster's commit index at that moment
    kill_reason: str | None = None                # set when we killed it on request


class Supervisor:
    def __init__(self, cluster: LocalCluster, directory: Path, *, restart: bool, layout: dict, out=None):
        self.c = cluster
        self.dir = directory
        self.restart = restart
        self.layout = layout
        self.out = out or sys.stdout
        self.members = [Member() for _ in range(cluster.n)]
        self.views: dict[int, tuple[float, dict | None, int | None]] = {}
        self.closing = threading.Event()
        self.stop_requested = False
        self.leader: int | None = None
        self.announced: tuple | None = None                   # (leader, term) last printed
        self.leaderless_since: float | None = None
        self.leaderless_said = False
        self.lost_leader: tuple[str, float] | None = None     # (id, when) of a leader that went away
        self.control = private_dir(directory / CONTROL)
        self.dirty = True
        self.started_wall = now_iso()

    # ------------------------------------------------------------------ output
    def say(self, text: str) -> None:
        print(f"{clock()} {text}", file=self.out, flush=True)

    def node_id(self, i: int) -> str:
        return self.c.ids[i]

    # ------------------------------------------------------------------ processes
    def progress(self) -> int:
        """How far the cluster is: the leader's commit index, else the furthest applied index."""
        views = self.fresh_views(time.monotonic())
        if self.leader is not None and self.leader in views:
            return int(views[self.leader].get("commit_index") or 0)
        return max((int(v.get("last_applied") or 0) for v in views.values()), default=0)

    def watch(self, i: int, why: str) -> None:
        """Report when node i has caught up with where the cluster is now."""
        m = self.members[i]
        m.awaiting_ready, m.watch_from, m.catch_up_to = why, time.monotonic(), self.progress()

    def start(self, i: int, why: str | None = None) -> None:
        m = self.members[i]
        try:
            with open(self.c.log_path(i), "ab") as log:
                log.write(f"----- {now_iso()} raftq up starts {self.node_id(i)}"
                          f"{f' ({why})' if why else ''} -----\n".encode())
        except OSError:
            pass
        self.c.start(i)
        p = self.c.procs[i]
        m.state, m.pid, m.started_at = "running", p.pid, time.monotonic()
        m.restart_at, m.then, m.kill_reason = None, None, None
        m.starts += 1
        if m.starts > 1:
            m.restarts += 1
        self.dirty = True

    def on_exit(self, i: int, code: int) -> str:
        """A node's process ended: what happened, said and recorded; returns the sentence."""
        m, nid = self.members[i], self.node_id(i)
        now = time.monotonic()
        m.pid, m.awaiting_ready = None, None
        m.last_exit, m.last_exit_at = exit_text(code), now_iso()
        self.dirty = True
        if m.state == "stopping":                       # we asked it to stop
            then, m.then = m.then, None
            m.state = "stopped"
            if then == "wipe":
                return self.wipe_and_start(i)
            if then == "start":
                self.start(i, "restart requested")
                self.watch(i, "restart")
                text = f"{nid} stopped ({m.last_exit}) and started again (pid {m.pid})"
                self.say(text)
                self.answer_waiting(i, text)
                return text
            return f"{nid} stopped"
        was_leader = self.leader == i
        if was_leader:
            self.lost_leader = (nid, now)
        m.down_since = now
        lived = now - m.started_at
        m.streak = m.streak + 1 if lived < STABLE_AFTER_S else 1
        what = m.kill_reason or f"{nid} exited ({m.last_exit})"
        text = what + ("; it was the leader: the others elect a new one within 1-3 s" if was_leader else "")
        if self.restart:
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (m.streak - 1))
            m.state, m.restart_at = "down", now + delay
            text += f"; restarting it in {delay:g}s" + (f" (died {m.streak} times in a row within "
                                                       f"{STABLE_AFTER_S:g}s of its start)" if m.streak > 1 else "")
        else:
            m.state = "stopped"
            text += (f"; not restarting it (--no-restart): `raftq local restart {nid}{dir_option(self.dir)}` "
                     "starts it")
        text += f"; log: {self.c.log_path(i)}"
        if code not in (0, -signal.SIGKILL, -signal.SIGTERM):
            line = last_log_line(self.c.log_path(i))
            if line:
                text += f"\n    its last log line: {line}"
        self.say(text)
        return text

    def wipe_and_start(self, i: int) -> str:
        nid = self.node_id(i)
        data = self.c.data_dir(i)
        size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) if data.exists() else 0
        self.c.wipe(i)
        self.start(i, "wiped")
        self.watch(i, "wipe")
        text = (f"{nid} stopped, its data dir emptied ({size / 1e6:.1f} MB removed) and started again "
                f"(pid {self.members[i].pid}): it catches up from the leader (by snapshot once the leader has compacted "
                f"its log)")
        self.say(text)
        self.answer_waiting(i, text)
        return text

    def request_stop(self, i: int, then: str | None) -> None:
        m = self.members[i]
        self.c.signal(i, signal.SIGCONT)
        self.c.signal(i, signal.SIGTERM)
        m.state, m.then, m.stop_deadline = "stopping", then, time.monotonic() + STOP_TIMEOUT_S
        self.dirty = True

    # ------------------------------------------------------------------ the loop
    def tick(self) -> None:
        now = time.monotonic()
        for i, m in enumerate(self.members):
            p = self.c.procs.get(i)
            if m.state in ("running", "paused", "stopping") and p is not None and p.poll() is not None:
                self.on_exit(i, p.returncode)
            elif m.state == "stopping" and now > m.stop_deadline:
                self.c.signal(i, signal.SIGKILL)
            elif m.state == "down" and m.restart_at is not None and now >= m.restart_at:
                self.start(i, f"restart {m.restarts + 1} after {m.last_exit}")
                self.watch(i, "restart")
                self.say(f"{self.node_id(i)} started again (pid {m.pid})")
        self.serve_requests()
        self.observe(now)
        if self.dirty:
            self.save()

    def run(self, leader_timeout: float, on_leader=None) -> int:
        """Start every node and supervise until asked to stop; the exit code."""
        for obs in [threading.Thread(target=self._observer, args=(i,), daemon=True) for i in range(self.c.n)]:
            obs.start()
        for i in range(self.c.n):
            self.start(i)
        self.save()
        t0 = time.monotonic()
        first_leader = True
        code = EXIT_OK
        try:
            while not self.stop_requested:
                self.tick()
                if first_leader and self.leader is not None:
                    first_leader = False
                    if on_leader is not None and on_leader(self.leader) is False:
                        break
                elif first_leader and time.monotonic() - t0 > leader_timeout:
                    down = [self.node_id(i) for i, m in enumerate(self.members) if m.state != "running"]
                    print(f"raftq up: no leader within {leader_timeout:g}s"
                          + (f"; nodes not running: {', '.join(down)}" if down else "")
                          + f"; see the node logs in {self.dir} (n1.log ...)", file=sys.stderr, flush=True)
                    code = EXIT_FAILED
                    break
                time.sleep(0.1)
        finally:
            self.shutdown()
        return code

    def shutdown(self) -> None:
        print("stopping nodes...", file=self.out, flush=True)
        for i in range(self.c.n):
            if self.c.alive(i):
                self.c.signal(i, signal.SIGCONT)
                self.c.signal(i, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for i in range(self.c.n):
            p = self.c.procs.get(i)
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except Exception:
                self.c.kill(i)
        self.closing.set()
        codes = []
        for i, m in enumerate(self.members):
            p = self.c.procs.get(i)
            if p is not None and m.pid is not None:
                m.last_exit, m.last_exit_at = exit_text(p.returncode), now_iso()
                codes.append(f"{self.node_id(i)} {m.last_exit}")
            m.state, m.pid, m.restart_at = "stopped", None, None
            for rid in m.waiting:
                self.reply(rid, {"ok": False, "message": "raftq up is stopping"})
            m.waiting.clear()
        self.leader = None
        self.save(status="stopped")
        self.c.close()
        print(f"stopped: {', '.join(codes) or 'no node was running'}", file=self.out, flush=True)
        print(f"the data stays in {self.dir}: `raftq up{dir_option(self.dir)}` continues this cluster, "
              f"`raftq up{dir_option(self.dir)} --fresh` starts over", file=self.out, flush=True)

    # ------------------------------------------------------------------ observation
    def _observer(self, i: int) -> None:
        while not self.closing.is_set():
            m = self.members[i]
            pid = m.pid
            view = self.c.cluster_view(i, timeout=1.0, digest=False) if m.state == "running" else None
            self.views[i] = (time.monotonic(), view, pid)
            self.closing.wait(0.25)

    def fresh_views(self, now: float) -> dict[int, dict]:
        out = {}
        for i, (at, view, pid) in list(self.views.items()):
            m = self.members[i]
            if view is not None and now - at < 1.5 and pid == m.pid and m.state == "running":
                out[i] = view
        return out

    def current_leader(self, views: dict[int, dict]) -> int | None:
        leaders = [i for i, v in views.items() if v.get("role") == "leader"]
        if len(leaders) != 1:
            return None
        lid = self.node_id(leaders[0])
        agree = sum(1 for v in views.values() if (v.get("leader") or {}).get("id") == lid)
        return leaders[0] if agree * 2 > self.c.n else None

    def observe(self, now: float) -> None:
        views = self.fresh_views(now)
        cur = self.current_leader(views)
        if cur is not None:
            term = views[cur].get("term")
            if (cur, term) != self.announced:
                after = ""
                if self.lost_leader is not None and self.lost_leader[0] != self.node_id(cur):
                    after = f", {now - self.lost_leader[1]:.1f}s after {self.lost_leader[0]} went away"
                if self.announced is None:
                    after = f", applied index {views[cur].get('last_applied')}"
                self.say(f"leader: {self.node_id(cur)} at {self.c.urls[cur]} (term {term}{after})")
                self.announced = (cur, term)
                self.dirty = True
            self.leader, self.lost_leader = cur, None
            self.leaderless_since, self.leaderless_said = None, False
        else:
            if self.leader is not None and self.leader not in views:     # it stopped answering
                if self.lost_leader is None:
                    self.lost_leader = (self.node_id(self.leader), now)
                self.leader = None
                self.dirty = True
            if self.leaderless_since is None:
                self.leaderless_since = now
            elif not self.leaderless_said and self.announced is not None and now - self.leaderless_since > 5:
                running = sum(1 for m in self.members if m.state == "running")
                self.say(f"no leader for {now - self.leaderless_since:.0f}s: {running} of {self.c.n} nodes "
                         f"running, a leader needs {self.c.n // 2 + 1}"
                         + ("" if running > self.c.n // 2 else
                            f"; `raftq local restart NODE{dir_option(self.dir)}` or resume a paused one"))
                self.leaderless_said = True
        for i, m in enumerate(self.members):
            v = views.get(i)
            if m.awaiting_ready and v is not None and v.get("ready") and \
                    int(v.get("last_applied") or 0) >= m.catch_up_to:
                how = {"wipe": "rebuilt from the leader", "resume": "answering again"}.get(
                    m.awaiting_ready, "caught up from its journal and the leader")
                lead = (v.get("leader") or {}).get("id", "?")
                role = "the leader" if lead == self.node_id(i) else f"a follower of {lead}"
                self.say(f"{self.node_id(i)} is back: {role}, applied index {v.get('last_applied')}, {how} "
                         f"{now - m.watch_from:.1f}s after its {m.awaiting_ready}")
                m.awaiting_ready = None
                m.streak = 0 if now - m.started_at >= STABLE_AFTER_S else m.streak
            if m.state == "running" and m.streak and now - m.started_at >= STABLE_AFTER_S:
                m.streak = 0            # it stayed up: the next death starts the back-off over

    # ------------------------------------------------------------------ state file
    def save(self, status: str = "running") -> None:
        nodes = []
        for i, m in enumerate(self.members):
            nodes.append({
                "id": self.node_id(i), "url": self.c.urls[i], "http_port": self.c.http_ports[i],
                "raft_port": self.c.raft_ports[i], "pid": m.pid, "state": m.state, "restarts": m.restarts,
                "restart_in_s": None if m.restart_at is None else round(max(0.0, m.restart_at - time.monotonic()), 1),
                "last_exit": m.last_exit, "last_exit_at": m.last_exit_at, "config": str(self.c.config_path(i)),
                "log": str(self.c.log_path(i)), "data_dir": str(self.c.data_dir(i))})
        state = {**self.layout, "version": STATE_VERSION, "dir": str(self.dir), "status": status,
                 "supervisor_pid": os.getpid() if status == "running" else None,
                 "started_at": self.started_wall, "updated_at": now_iso(), "restart": self.restart,
                 "leader": None if self.leader is None else self.node_id(self.leader),
                 "leader_url": None if self.leader is None else self.c.urls[self.leader],
                 "nodes": nodes}
        write_private(self.dir / STATE, json.dumps(state, indent=2) + "\n")
        self.dirty = False

    # ------------------------------------------------------------------ requests from `raftq local`
    def reply(self, rid: str, body: dict) -> None:
        try:
            write_private(self.control / f"{rid}.reply", json.dumps(body))
        except OSError:
            pass

    def answer_waiting(self, i: int, text: str) -> None:
        m = self.members[i]
        for rid in m.waiting:
            self.reply(rid, {"ok": True, "message": text, "node": self.node_id(i), "pid": m.pid,
                             "url": self.c.urls[i], "catch_up_to": m.catch_up_to})
        m.waiting.clear()

    def serve_requests(self) -> None:
        try:
            names = sorted(p.name for p in os.scandir(self.control) if p.name.endswith(".req"))
        except OSError:
            return
        for name in names:
            path = self.control / name
            rid = name[:-4]
            try:
                req = json.loads(path.read_text())
                path.unlink()
            except (OSError, ValueError):
                continue
            try:
                body = self.handle(rid, req)
            except UpError as e:
                body = {"ok": False, "message": str(e)}
            except Exception as e:          # a bug: say it, keep the cluster running
                body = {"ok": False, "message": f"raftq up could not do it: {type(e).__name__}: {e}"}
            if body is not None:
                self.reply(rid, body)

    def resolve(self, name: str) -> int:
        name = (name or "").strip()
        if name == "leader":
            if self.leader is None:
                raise UpError("no leader right now (an election may be under way); name a node: "
                              + ", ".join(self.c.ids), EXIT_FAILED)
            return self.leader
        if name == "follower":
            for i, m in enumerate(self.members):
                if i != self.leader and m.state == "running":
                    return i
            raise UpError("no running follower", EXIT_FAILED)
        if name in self.c.ids:
            return self.c.ids.index(name)
        raise UpError(f"unknown node {name!r}: this cluster has {', '.join(self.c.ids)} "
                      "(or say `leader` or `follower`)")

    def handle(self, rid: str, req: dict) -> dict | None:
        action = req.get("action")
        i = self.resolve(req.get("node", ""))
        m, nid = self.members[i], self.node_id(i)
        role = ", the leader" if i == self.leader else ""
        if action == "kill":
            sig = signal.Signals[f"SIG{req.get('signal', 'KILL')}"]
            if m.state not in ("running", "paused"):
                raise UpError(f"{nid} is not running ({self.describe_down(m)})", EXIT_FAILED)
            pid = m.pid
            m.kill_reason = f"{nid} (pid {pid}) killed with {sig.name} by `raftq local kill`"
            if sig == signal.SIGKILL:
                self.c.kill(i)
                text = self.on_exit(i, self.c.procs[i].returncode)
            else:
                self.c.signal(i, signal.SIGCONT)
                self.c.signal(i, sig)
                text = f"sent {sig.name} to {nid} (pid {pid}{role})"
            return {"ok": True, "message": text, "node": nid, "pid": pid}
        if action == "pause":
            if m.state != "running":
                raise UpError(f"{nid} is not running ({self.describe_down(m)})", EXIT_FAILED)
            self.c.pause(i)
            m.state = "paused"
            self.dirty = True
            text = (f"{nid} (pid {m.pid}{role}) paused with SIGSTOP: it keeps its connections and answers nothing"
                    f"; `raftq local resume {nid}{dir_option(self.dir)}` continues it")
            self.say(text)
            return {"ok": True, "message": text, "node": nid, "pid": m.pid}
        if action == "resume":
            if m.state == "running" and proc_stopped(m.pid):
                pass                            # stopped from outside raftq up: continue it too
            elif m.state != "paused":
                raise UpError(f"{nid} is not paused ({m.state})", EXIT_FAILED)
            self.c.resume(i)
            m.state = "running"
            self.watch(i, "resume")
            self.dirty = True
            text = f"{nid} (pid {m.pid}) resumed with SIGCONT"
            self.say(text)
            return {"ok": True, "message": text, "node": nid, "pid": m.pid, "url": self.c.urls[i],
                    "catch_up_to": m.catch_up_to}
        if action in ("restart", "wipe"):
            then = "start" if action == "restart" else "wipe"
            if m.state in ("running", "paused"):
                self.say(f"{nid} (pid {m.pid}{role}) stopping for a {action} (`raftq local {action}`)")
                self.request_stop(i, then)
                m.waiting.append(rid)
                return None                     # answered once it is started again
            if m.state == "stopping":
                m.then = then
                m.waiting.append(rid)
                return None
            if action == "wipe":
                m.waiting.append(rid)
                self.wipe_and_start(i)
                return None
            self.start(i, "restart requested")
            self.watch(i, "restart")
            text = f"{nid} started (pid {m.pid})"
            self.say(text)
            return {"ok": True, "message": text, "node": nid, "pid": m.pid, "url": self.c.urls[i],
                    "catch_up_to": m.catch_up_to}
        raise UpError(f"unknown action {action!r}")

    def describe_down(self, m: Member) -> str:
        if m.state == "down" and m.restart_at is not None:
            return f"down after {m.last_exit}, restarting in {max(0.0, m.restart_at - time.monotonic()):.1f}s"
        if m.state == "stopped":
            return f"stopped after {m.last_exit}" if m.last_exit else "stopped"
        return m.state


def prepare_dir(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise UpError(f"{directory} is a file; give a directory with --dir")
    if directory.exists():
        foreign = sorted(e for e in os.listdir(directory) if not OURS.match(e))
        if foreign:
            raise UpError(f"{directory} holds files raftq up did not make ({', '.join(foreign[:5])}"
                          f"{', ...' if len(foreign) > 5 else ''}); give an empty or new directory with --dir")
    private_dir(directory)


def wipe_dir(directory: Path) -> list[str]:
    removed = []
    for e in sorted(os.listdir(directory)):
        if e == LOCK or not OURS.match(e):
            continue
        path = directory / e
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(e)
    return removed


def stop_orphans(directory: Path, state: dict | None, out) -> None:
    """Nodes a previous `raftq up` left running (it was killed): stop them, or the ports clash."""
    orphans = [(n["id"], n["pid"], str(n.get("config", "\0"))) for n in (state or {}).get("nodes", [])
               if n.get("pid") and pid_runs(n["pid"], str(n.get("config", "\0")))]
    for nid, pid, _ in orphans:
        print(f"raftq up: stopping {nid} (pid {pid}), left running by a raftq up that did not stop its nodes",
              file=out, flush=True)
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    end = time.monotonic() + STOP_TIMEOUT_S
    while any(pid_runs(pid, cfg) for _, pid, cfg in orphans) and time.monotonic() < end:
        time.sleep(0.1)
    for _, pid, cfg in orphans:
        if pid_runs(pid, cfg):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def layout_for(args, prior: dict | None, directory: Path) -> dict:
    """Node count and ports: the directory's own when it holds a cluster, else from the options."""
    if prior:
        n = len(prior["nodes"])
        http = [x["http_port"] for x in prior["nodes"]]
        raft = [x["raft_port"] for x in prior["nodes"]]
        if args.nodes is not None and args.nodes != n:
            raise UpError(f"{directory} holds a {n}-node cluster; leave out --nodes to continue it, or give "
                          f"--fresh to start over with {args.nodes}")
        if args.base_port not in (None, 0) and (http[0], raft[0]) != (args.base_port, args.base_port + 100):
            raise UpError(f"{directory} holds a cluster on HTTP ports {http[0]}-{http[-1]} and Raft ports "
                          f"{raft[0]}-{raft[-1]}; leave out --base-port to continue it, or give --fresh to start over")
        return {"created_at": prior.get("created_at"), "starts": int(prior.get("starts", 0)) + 1,
                "http_ports": http, "raft_ports": raft, "count": n}
    n = 3 if args.nodes is None else args.nodes
    base = 7001 if args.base_port is None else args.base_port
    if base == 0:
        ports = free_ports(2 * n)
        http, raft = ports[:n], ports[n:]
    else:
        if not 1 <= base <= 65535 - 100 - n:
            raise UpError(f"--base-port {base}: HTTP ports base..base+{n - 1} and Raft ports base+100.. must be "
                          "valid ports (or 0 for any free ports)")
        http, raft = [base + i for i in range(n)], [base + 100 + i for i in range(n)]
    return {"created_at": now_iso(), "starts": 1, "http_ports": http, "raft_ports": raft, "count": n}


def load_config_sections(args, directory: Path) -> tuple[dict, str | None]:
    """The sections for every node: --config FILE (remembered as up.toml), else up.toml."""
    kept = directory / CONFIG
    if args.config:
        secs = S.load_sections(args.config)
        write_private(kept, Path(args.config).read_text())
        return secs, f"{args.config} (kept as {kept})"
    if kept.exists():
        try:
            return S.load_sections(kept), f"{kept} (from an earlier --config)"
        except ConfigError as e:
            raise ConfigError(f"{e}; fix it, or give --config FILE")
    return {}, None


def cluster_secret(directory: Path) -> str:
    path = directory / SECRET
    if path.exists():
        value = path.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    value = secrets.token_hex(32)
    write_private(path, value + "\n")
    return value


def demo(cluster: LocalCluster, leader: int) -> None:
    url = cluster.urls[leader]
    h = cluster.probe_headers
    ctx = cluster.client_ssl
    follower = (leader + 1) % cluster.n
    print(f"\ndemo: enqueue 3 jobs through follower {cluster.ids[follower]} (it redirects to the leader)")
    for i, prio in enumerate((0, 5, 9)):
        body = {"queue": "demo", "job_type": "greet", "priority": prio,
                "payload": {"data_b64": base64.b64encode(f"hello {i}".encode()).decode(), "encoding": "text/plain"}}
        status, out = http_json("POST", cluster.urls[follower] + "/v1/jobs", body, headers=h, context=ctx)
        if status == 307:
            status, out = http_json("POST", out["error"]["leader_url"] + "/v1/jobs", body, headers=h, context=ctx)
        print(f"  POST /v1/jobs priority {prio} -> {status} {json.dumps(out)}")
    status, out = http_json("POST", url + "/v1/reserve", {"queues": ["demo"], "lease_ms": 30000, "max_jobs": 3},
                            headers=h, context=ctx)
    for job in out.get("jobs", []):
        data = base64.b64decode(job["payload"]["data_b64"]).decode()
        print(f"  reserved {job['id']} priority {job['priority']} attempt {job['attempt']}: {json.dumps(data)}")
        s, _ = http_json("POST", url + f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]}, headers=h, context=ctx)
        print(f"  ack -> {s}")
    status, out = http_json("GET", url + "/v1/queues/demo", headers=h, context=ctx)
    print(f"  queue demo: ready {out['ready']}, in flight {out['in_flight']}, enqueued {out['enqueued']}, "
          f"acked {out['acked']}")
    views = cluster.wait_converged(10)
    print(f"  all {cluster.n} nodes at applied index {views[0]['last_applied']} with digest {views[0]['digest']}\n",
          flush=True)


def tls_record(cluster: LocalCluster) -> dict | None:
    """What `raftq local` needs to call TLS nodes (up.json "tls")."""
    if not cluster.tls:
        return None
    return {"mode": "mtls" if cluster.tls == "mtls" else "tls", "ca": str(cluster.ca_file),
            "client_cert": list(cluster.client_cert) if cluster.client_cert else None}


def tls_lines(cluster: LocalCluster, directory: Path) -> list[str]:
    """How to call a TLS cluster: curl and raftq, with the CA (and the client certificate)."""
    ca = cluster.ca_file
    curl_cert = raftq_cert = ""
    if cluster.client_cert:
        cert, key = cluster.client_cert
        curl_cert, raftq_cert = f" --cert {cert} --key {key}", f" --cert {cert} --key {key}"
    urls = "" if cluster.http_ports == [7001 + i for i in range(cluster.n)] else f" --urls {','.join(cluster.urls)}"
    what = ("TLS with client certificates (mTLS): the nodes refuse a client without one signed by "
            if cluster.tls == "mtls" else "TLS: the nodes' certificates are signed by ")
    made = ("made now" if "ca.pem" in cluster.certs_made else
            "kept from an earlier run" + (", node certificates renewed" if cluster.certs_made else ""))
    return [f"  {what}the throwaway CA {ca} ({made}; its key ca-key.pem, the node certificates n1-cert.pem ... "
            "and everything else there are 0600)",
            f"  curl --cacert {ca}{curl_cert} {cluster.urls[0]}/v1/cluster",
            f"  raftq --ca {ca}{raftq_cert}{urls} status",
            f"  Client({cluster.urls!r}, ca={str(ca)!r}"
            + (f", cert=({cluster.client_cert[0]!r}, {cluster.client_cert[1]!r})" if cluster.client_cert else "")
            + ")"]


def next_steps(cluster: LocalCluster, directory: Path) -> list[str]:
    """What to open and try once the cluster has a leader: the admin UI first (a new user's
    first question is where to look), then a job through the command line, then failover."""
    d = dir_option(directory)
    urls = "" if cluster.http_ports == [7001 + i for i in range(cluster.n)] else f" --urls {','.join(cluster.urls)}"
    tls = f" --ca {cluster.ca_file}" if cluster.tls else ""
    return [f"admin UI: {cluster.urls[0]}/ in a browser (any node's URL; it moves to the leader's page)",
            "try, in another terminal:",
            f"  raftq{tls}{urls} enqueue emails welcome --data '{{\"user\": 42}}'   then   "
            f"raftq{tls}{urls} queues",
            f"  raftq local status{d}   raftq local kill leader{d}   (pause|resume|restart|wipe NODE)",
            "Ctrl-C here stops the cluster"]


def cmd_up(args) -> int:
    try:
        return _up(args)
    except (UpError, ConfigError) as e:
        print(f"raftq up: {e}", file=sys.stderr, flush=True)
        return getattr(e, "code", EXIT_USAGE)
    except KeyboardInterrupt:               # before the nodes were started (then Ctrl-C stops them)
        print("raftq up: interrupted", file=sys.stderr, flush=True)
        return 130


def _up(args) -> int:
    if args.nodes is not None and (args.nodes < 1 or args.nodes % 2 == 0):
        raise UpError(f"--nodes {args.nodes}: use an odd number (1, 3, 5) so a majority survives a split")
    if args.config:                         # checked before anything is touched
        S.load_sections(args.config)
    directory = resolve_dir(args.dir)
    os.umask(0o077)                         # everything raftq up writes is its user's only
    prepare_dir(directory)
    lock = take_lock(directory)
    try:
        return _run_up(args, directory)
    finally:
        os.close(lock)


def _run_up(args, directory: Path) -> int:
    out = sys.stdout
    prior = read_state(directory)
    stop_orphans(directory, prior, out)
    if args.fresh:
        removed = wipe_dir(directory)
        if removed:
            print(f"raftq up: --fresh: removed the previous cluster in {directory} ({', '.join(removed)})",
                  flush=True)
        prior = None
    layout = layout_for(args, prior, directory)
    secs, config_from = load_config_sections(args, directory)
    storage = {"dead_letter_retention_ms": DEFAULT_RETENTION_MS, **(secs.get("storage") or {})}
    durability = args.durability or (prior or {}).get("durability") or "fsync"
    tls = "mtls" if args.mtls else bool(args.tls)
    _check_ports_free(layout, prior)
    cluster = LocalCluster(directory, nodes=layout["count"], durability=durability, limits=secs.get("limits"),
                           storage=storage, queues=secs.get("queues"), tuning=secs.get("tuning"),
                           secret=cluster_secret(directory), http_ports=layout["http_ports"],
                           raft_ports=layout["raft_ports"],
                           api_keys=list((secs.get("auth") or {}).get("api_keys") or []) or None, tls=tls)
    cluster.write_configs()
    n = cluster.n
    if prior:
        head = f"raftq up: continuing the {n}-node cluster in {directory} (start {layout['starts']}, made {layout['created_at']})"
    else:
        head = f"raftq up: a new {n}-node cluster in {directory}"
    print(head, flush=True)
    print(f"  configs, data and logs stay there: `raftq up{dir_option(directory)}` again continues this cluster, "
          f"`--fresh` starts over", flush=True)
    print(f"  durability {durability}, dead letters kept {fmt_ms_span(storage['dead_letter_retention_ms'])}, "
          + ("a node that dies is restarted (after 1 s, longer if it keeps dying)" if not args.no_restart
             else "a node that dies stays down (--no-restart)")
          + (f", config {config_from}" if config_from else ""), flush=True)
    for i in range(n):
        print(f"  {cluster.ids[i]}  {cluster.urls[i]}  raft 127.0.0.1:{cluster.raft_ports[i]}  "
              f"log {cluster.log_path(i)}", flush=True)
    if tls:
        for line in tls_lines(cluster, directory):
            print(line, flush=True)

    layout_rec = {"created_at": layout["created_at"], "starts": layout["starts"], "durability": durability,
                  "config": str(directory / CONFIG) if config_from else None, "secret_file": str(directory / SECRET),
                  "tls": tls_record(cluster)}
    sup = Supervisor(cluster, directory, restart=not args.no_restart, layout=layout_rec)

    def on_signal(signum, frame):
        sup.stop_requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    return sup.run(args.timeout, _on_leader(args, cluster, directory))


def _check_ports_free(layout: dict, prior: dict | None) -> None:
    """Refuse to start when a port of the layout is taken, saying which and what to do."""
    taken = [(p, f"{kind} port of n{j + 1}") for kind, ports in (("HTTP", layout["http_ports"]),
                                                                ("Raft", layout["raft_ports"]))
             for j, p in enumerate(ports) if not port_free(p)]
    if taken:
        raise UpError(f"port {taken[0][0]} ({taken[0][1]}) is in use" + (f" and {len(taken) - 1} more" if len(taken) > 1
                                                                        else "")
                      + ": another raftq up or another program holds it (`raftq local status` shows a raftq up); "
                      + ("--fresh --base-port 0 starts a new cluster on free ports" if prior else
                         "give --base-port N, or 0 for any free ports"), EXIT_FAILED)


def _on_leader(args, cluster: LocalCluster, directory: Path):
    """What the supervisor calls once the cluster has a leader: the demo (--demo), then the next
    steps; False (stop) after --exit-after-demo."""
    def on_leader(leader: int):
        if args.demo:
            try:
                demo(cluster, leader)
            except Exception as e:          # the cluster still runs; say why the demo stopped
                print(f"raftq up: the demo did not finish ({type(e).__name__}: {e}); the node logs are in "
                      f"{directory}", file=sys.stderr, flush=True)
                if args.exit_after_demo:
                    raise UpError("the demo failed", EXIT_FAILED)
        if args.exit_after_demo:
            return False
        for line in next_steps(cluster, directory):
            print(line, flush=True)
        return True
    return on_leader
