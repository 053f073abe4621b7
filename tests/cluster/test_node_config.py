"""A bad node config stops the node at start with one clear line and exit code 2."""
import subprocess
import sys

import pytest

from conftest import poll

from raftq.node.core.limits import ConfigError
from raftq.node.base.settings import load, parse

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

# The key settings of a [[queues]] entry (docs/semantics.md "Keys"): each bad one names its key.
KEYED = GOOD + '\n[[queues]]\nname = "r"\n'
KEY_CASES = [
    ("negative key_concurrency", KEYED + "key_concurrency = -1\n", "queues[r].key_concurrency: must be >= 0"),
    ("key_concurrency not an integer", KEYED + 'key_concurrency = "2"\n', "queues[r].key_concurrency"),
    ("key_rate not a table", KEYED + "key_rate = 5\n", "queues[r].key_rate: must be a table"),
    ("key_rate without period", KEYED + "key_rate = { count = 5 }\n", "queues[r].key_rate.period_ms: required"),
    ("key_rate count 0", KEYED + "key_rate = { count = 0, period_ms = 1000 }\n", "queues[r].key_rate.count: must be >= 1"),
    ("key_rate count above 1000", KEYED + "key_rate = { count = 1001, period_ms = 1000 }\n",
     "queues[r].key_rate.count: must be <= 1000"),
    ("key_rate unknown key", KEYED + "key_rate = { count = 5, period_ms = 1000, burst = 2 }\n",
     "queues[r].key_rate.burst: unknown key"),
    ("rate period 0", KEYED + "rate = { count = 5, period_ms = 0 }\n", "queues[r].rate.period_ms: must be >= 1"),
    ("key_field empty", KEYED + 'key_field = ""\n', "queues[r].key_field"),
    ("key_field not a string", KEYED + "key_field = 3\n", "queues[r].key_field"),
    ("key weight 0", KEYED + "key_weights = { acme = 0 }\n", "queues[r].key_weights.acme: must be >= 1"),
    ("key weight above 1000", KEYED + "key_weights = { acme = 1001 }\n", "queues[r].key_weights.acme: must be <= 1000"),
    ("key_weights not a table", KEYED + 'key_weights = ["acme"]\n', "queues[r].key_weights: must be a table"),
    ("key_limits entry empty", KEYED + "key_limits = { acme = {} }\n", "queues[r].key_limits.acme: must be a table"),
    ("key_limits unknown key", KEYED + "key_limits = { acme = { burst = 1 } }\n",
     "queues[r].key_limits.acme.burst: unknown key"),
    ("key_limits negative", KEYED + "key_limits = { acme = { concurrency = -1 } }\n",
     "queues[r].key_limits.acme.concurrency: must be >= 0"),
    ("key_limits bad rate", KEYED + "key_limits = { acme = { rate = { count = 2000, period_ms = 10 } } }\n",
     "queues[r].key_limits.acme.rate.count: must be <= 1000"),
    ("key longer than max_key_bytes", GOOD + "\n[limits]\nmax_key_bytes = 4\n\n[[queues]]\nname = \"r\"\n"
     "key_weights = { abcde = 2 }\n", "queues[r].key_weights.abcde: the key is longer than max_key_bytes (4)"),
    ("key with a control character", KEYED + 'key_limits = { "a\\u0007b" = { concurrency = 1 } }\n',
     "must not contain control characters"),
    ("too many key overrides", KEYED + "key_weights = { " + ", ".join(f"k{i} = 2" for i in range(10_001)) + " }\n",
     "queues[r].key_weights: names 10001 keys, at most 10000"),
    ("max_key_bytes 0", GOOD + "\n[limits]\nmax_key_bytes = 0\n", "limits.max_key_bytes: must be >= 1"),
    ("key settings are per queue only", GOOD + "\n[limits]\nkey_concurrency = 1\n", "limits.key_concurrency: unknown key"),
]


@pytest.mark.parametrize("name,text,key", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_refused_with_the_key(name, text, key, tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert key in str(exc.value)


@pytest.mark.parametrize("name,text,message", KEY_CASES, ids=[c[0] for c in KEY_CASES])
def test_bad_key_settings_are_refused_naming_the_key(name, text, message, tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert message in str(exc.value), str(exc.value)


def test_key_settings_of_a_queue_are_taken_and_reach_its_limits():
    import tomllib
    from raftq.node.core.limits import Limits
    text = GOOD + """
[limits]
max_key_bytes = 64

[[queues]]
name = "reports"
key_field = "tenant"
key_concurrency = 2
key_rate = { count = 10, period_ms = 1000 }
key_weights = { acme = 3, "globex corp" = 1000 }
key_limits = { acme = { concurrency = 5 }, initech = { rate = { count = 1, period_ms = 60000 } }, stopped = { concurrency = 0 } }
rate = { count = 1000, period_ms = 1 }

[[queues]]
name = "plain"
"""
    s = parse(tomllib.loads(text))
    q = s.limits.queue("reports")
    assert (q.key_field, q.key_concurrency, q.key_rate, q.rate) == ("tenant", 2, (10, 1000), (1000, 1))
    assert q.key_weights == {"acme": 3, "globex corp": 1000}
    assert q.key_limits == {"acme": (5, None), "initech": (None, (1, 60_000)), "stopped": (0, None)}
    assert s.limits.max_key_bytes == 64
    assert "reports" in s.limits.gated                  # a queue-wide rate: reserve gates the queue
    plain = s.limits.queue("plain")
    assert (plain.key_field, plain.key_concurrency, plain.key_rate, plain.rate) == (None, None, None, None)
    assert plain.key_weights == {} and plain.key_limits == {} and "plain" not in s.limits.gated
    # The configuration the first leader seeds (version 1) is this TOML's: the replicated
    # document gives every node the same limits back, and the queue's view shows them.
    again = Limits.from_doc(s.limits.doc)
    assert again.queue("reports") == q and again.fingerprint() == s.limits.fingerprint()
    assert q.describe()["key_limits"]["initech"] == {"concurrency": None, "rate": {"count": 1, "period_ms": 60_000}}


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


def test_api_followers_is_forward_unless_set_and_only_its_two_values():
    import tomllib
    assert parse(tomllib.loads(GOOD)).followers == "forward"
    for value in ("forward", "redirect"):
        assert parse(tomllib.loads(GOOD + f'\n[api]\nfollowers = "{value}"\n')).followers == value
    assert parse(tomllib.loads(GOOD + "\n[api]\n")).followers == "forward"
    for text, key in (('followers = "307"', "api.followers"), ("followers = true", "api.followers"),
                      ('follower = "redirect"', "api.follower: unknown key")):
        with pytest.raises(ConfigError) as e:
            parse(tomllib.loads(GOOD + f"\n[api]\n{text}\n"))
        assert key in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="api: must be a table"):
        parse({**tomllib.loads(GOOD), "api": "redirect"})


def test_node_peer_urls_are_taken_per_member_and_checked():
    import tomllib
    assert parse(tomllib.loads(GOOD)).peer_urls == {}
    text = GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\npeer_urls = { n1 = "http://n1:7001", '
                        'n2 = "http://n2:7002/", n4 = "https://10.1.0.4" }')
    s = parse(tomllib.loads(text))
    # The trailing slash goes (a path is appended to it); ids not in the peer list are kept
    # (a member added online later).
    assert s.peer_urls == {"n1": "http://n1:7001", "n2": "http://n2:7002", "n4": "https://10.1.0.4"}
    assert [p.url for p in s.peers] == ["http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"]
    for bad in ('"n2:7002"', '"http://n2:7002/v1"', '"http://"', '"ftp://n2"', '"http://n2:99999"', '""', "7002"):
        line = f'data_dir = "data/n1"\npeer_urls = {{ n2 = {bad} }}'
        with pytest.raises(ConfigError) as e:
            parse(tomllib.loads(GOOD.replace('data_dir = "data/n1"', line)))
        assert "node.peer_urls.n2" in str(e.value), (bad, str(e.value))
    with pytest.raises(ConfigError, match="node.peer_urls: must be a table"):
        parse(tomllib.loads(GOOD.replace('data_dir = "data/n1"', 'data_dir = "data/n1"\npeer_urls = "http://n2"')))


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
