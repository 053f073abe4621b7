"""A bad node config stops the node at start with one clear line and exit code 2."""
import subprocess
import sys

import pytest

from conftest import poll

from raftq.node.limits import ConfigError
from raftq.node.settings import load, parse

GOOD = """
[node]
id = "n1"
http = "127.0.0.1:7001"
raft = "127.0.0.1:7101"
data_dir = "data/n1"

[cluster]
peers = [
  { id = "n1", raft = "127.0.0.1:7101", url = "http://127.0.0.1:7001" },
  { id = "n2", raft = "127.0.0.1:7102", url = "http://127.0.0.1:7002" },
  { id = "n3", raft = "127.0.0.1:7103", url = "http://127.0.0.1:7003" },
]
"""

CASES = [
    ("unknown key", GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\ndatadir = "x"'), "node.datadir"),
    ("missing field", GOOD.replace('raft = "127.0.0.1:7101"\n', "", 1), "node.raft"),
    ("contradicting limits", GOOD + "\n[limits]\ndefault_max_attempts = 200\n", "limits.default_max_attempts"),
    ("retry delay above its max", GOOD + "\n[limits]\nretry_delay_ms = 10\nretry_delay_max_ms = 5\n",
     "limits.retry_delay_ms"),
    ("queue override contradicts", GOOD + '\n[[queues]]\nname = "e"\nmax_attempts_ceiling = 2\n', "queues[e].default_max_attempts"),
    ("unknown queue key", GOOD + '\n[[queues]]\nname = "e"\nmax_reserve_batch = 2\n', "queues[e].max_reserve_batch"),
    ("non-loopback raft without secret",
     GOOD.replace("127.0.0.1:7103", "10.0.0.3:7103"), "cluster.secret"),
    ("peer list without this node", GOOD.replace('id = "n1"', 'id = "n9"', 1), "cluster.peers"),
    ("bad durability", GOOD.replace("[cluster]", '[cluster]\ndurability = "sometimes"'), "cluster.durability"),
    ("not toml", "[node\n", "not valid TOML"),
    ("unknown section", GOOD + "\n[limitz]\nx = 1\n", "limitz"),
    ("unknown event loop", GOOD + '\n[tuning]\nevent_loop = "trio"\n', "tuning.event_loop"),
    ("schedule in an unknown zone", GOOD + '\n[[schedules]]\nname = "x"\ncron = "0 3 * * *"\ntime_zone = "Nowhere/Land"\n'
     'job = { queue = "q", job_type = "t" }\n', "schedules[0].time_zone"),
    ("schedule twice", GOOD + 2 * '\n[[schedules]]\nname = "x"\nevery_ms = 60000\njob = { queue = "q", job_type = "t" }\n',
     "schedules[1].name"),
]


@pytest.mark.parametrize("name,text,key", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_refused_with_the_key(name, text, key, tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert key in str(exc.value)


def test_bad_config_exits_2_with_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD + "\n[limits]\ndefault_max_attempts = 200\n")
    proc = subprocess.run([sys.executable, "-m", "raftq.node", "--config", str(path)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "limits.default_max_attempts" in lines[0] and "max_attempts_ceiling" in lines[0]
    missing = subprocess.run([sys.executable, "-m", "raftq.node", "--config", str(tmp_path / "nope.toml")],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_good_config_defaults():
    import tomllib
    s = parse(tomllib.loads(GOOD))
    assert s.url == "http://127.0.0.1:7001" and s.durability == "fsync" and s.secret is None
    assert [p.id for p in s.others] == ["n2", "n3"]
    assert s.limits.max_enqueue_batch == 256 and s.limits.queue("x").default_max_attempts == 3
    seeded = parse(tomllib.loads(GOOD + '\n[[schedules]]\nname = "nightly"\ncron = "0 3 * * *"\n'
                                        'job = { queue = "reports", job_type = "nightly" }\n'))
    assert [(n, d["cron"], d["time_zone"], d["catchup"]) for n, d in seeded.schedules] == \
        [("nightly", "0 3 * * *", "UTC", "one")]


def test_a_node_with_a_different_toml_follows_the_log_and_says_so(make_cluster):
    """The start-up refusal ("limits differ from the majority") is gone: a node restarted with
    other limits in its TOML serves the configuration in force and reports the difference."""
    from raftq.cluster.local import http_json
    c = make_cluster()
    leader = c.wait_leader()
    victim = (leader + 1) % 3
    c.stop(victim)
    c.config_path(victim).write_text(c.config_path(victim).read_text() + "\n[limits]\nmax_enqueue_batch = 7\n")
    c.start(victim)

    def view():
        status, v = http_json("GET", c.urls[victim] + "/v1/cluster?digest=false")
        return v if status == 200 and v.get("toml_differs") else None
    v = poll(view, 30, what="the restarted node to report toml_differs")
    assert v["config_version"] == 1 and c.procs[victim].poll() is None
    assert http_json("GET", c.urls[victim] + "/v1/server-info")[1]["max_enqueue_batch"] == 256
    others = [http_json("GET", u + "/v1/cluster?digest=false")[1] for i, u in enumerate(c.urls) if i != victim]
    assert [o["toml_differs"] for o in others] == [False, False]
    log = poll(lambda: (t := c.log_path(victim).read_text()) and "differs from the cluster's configuration" in t
               and t, 10, what="the log line")
    assert "limits.max_enqueue_batch" in log and log.count("differs from the cluster's configuration") == 1


def test_nodes_run_on_uvloop_unless_told_asyncio(make_cluster):
    from raftq.cluster.local import http_json
    c = make_cluster(tuning={"event_loop": "asyncio"})
    c.wait_converged()
    assert {http_json("GET", u + "/v1/cluster?digest=false")[1]["event_loop"] for u in c.urls} == {"asyncio"}
    d = make_cluster()
    d.wait_converged()
    assert {http_json("GET", u + "/v1/cluster?digest=false")[1]["event_loop"] for u in d.urls} == {"uvloop"}
