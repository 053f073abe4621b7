"""`raftq config init`: one node config per host, the systemd unit and install steps; every
config loads with raftq.node.base.settings.load, all share one fresh secret, files are 0600."""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from raftq.node.base.settings import load
from tests.cluster.test_up import raftq

ROOT = Path(__file__).resolve().parent.parent


def modes(d: Path) -> dict:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [d, *d.iterdir()]}


def test_init_writes_a_config_per_host_the_unit_and_the_steps(tmp_path):
    out = tmp_path / "cfg"
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    code, text, err = raftq("config", "init", "--hosts", ",".join(hosts), "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "n1.toml", "n2.toml", "n3.toml", "raftq.service"]
    assert modes(out) == {"cfg": 0o700, **{n: 0o600 for n in ("README.md", "n1.toml", "n2.toml", "n3.toml",
                                                              "raftq.service")}}
    assert f"next: follow {out}/README.md" in text

    settings = [load(out / f"n{i}.toml") for i in (1, 2, 3)]
    for i, (s, host) in enumerate(zip(settings, hosts)):
        assert s.node_id == f"n{i + 1}"
        assert (s.http_host, s.http_port, s.raft, s.url) == (host, 7001, f"{host}:7101", f"http://{host}:7001")
        assert str(s.data_dir) == "/var/lib/raftq" and s.durability == "fsync"
        assert [(p.id, p.raft, p.url) for p in s.peers] == [(f"n{j + 1}", f"{h}:7101", f"http://{h}:7001")
                                                             for j, h in enumerate(hosts)]
        assert s.limits.dead_letter_retention_ms == 7 * 86_400_000
    assert len({s.secret for s in settings}) == 1 and re.fullmatch(r"[0-9a-f]{64}", settings[0].secret)
    assert len({s.limits.fingerprint() for s in settings}) == 1

    # The unit is the repository's deploy/systemd/raftq.service.
    assert (out / "raftq.service").read_text() == (ROOT / "deploy/systemd/raftq.service").read_text()

    readme = (out / "README.md").read_text()
    for i, h in enumerate(hosts, 1):
        assert f"### n{i} on {h}" in readme and f"scp n{i}.toml raftq.service root@{h}:/tmp/" in readme
        assert f"install -m 0640 -o root -g raftq /tmp/n{i}.toml /etc/raftq/node.toml" in readme
    assert "raftq status --urls http://10.0.0.1:7001,http://10.0.0.2:7001,http://10.0.0.3:7001" in readme
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    assert len(blocks) == 1 + 2 * len(hosts) + 1
    for b in blocks:                          # every command block is valid shell
        subprocess.run(["bash", "-n"], input=b, text=True, check=True)

    # A second init makes a new secret, and does not overwrite without --force.
    code, text, err = raftq("config", "init", "--hosts", ",".join(hosts), "--out", str(out))
    assert code == 2 and "already holds n1.toml" in err and "--force" in err
    assert load(out / "n1.toml").secret == settings[0].secret
    code, text, err = raftq("config", "init", "--hosts", ",".join(hosts), "--out", str(out), "--force")
    assert code == 0, err
    assert load(out / "n1.toml").secret != settings[0].secret


def test_init_with_a_pattern_ports_data_dir_and_included_sections(tmp_path):
    inc = tmp_path / "limits.toml"
    inc.write_text('[limits]\nmax_lease_duration_ms = 60000\n\n[storage]\ndedup_window_ms = 3600000\n\n'
                   '[[queues]]\nname = "emails"\ndefault_max_attempts = 5\n\n'
                   '[auth]\napi_keys = [{ name = "ops", key = "k-0123456789", role = "admin" }]\n')
    out = tmp_path / "five"
    code, text, err = raftq("config", "init", "--hosts", "raftq-{n}.internal", "--nodes", "5", "--out", str(out),
                            "--http-port", "8080", "--raft-port", "9090", "--data-dir", "/srv/raftq",
                            "--durability", "memory", "--include", str(inc))
    assert code == 0, err
    for i in range(1, 6):
        s = load(out / f"n{i}.toml")
        assert s.raft == f"raftq-{i}.internal:9090" and s.url == f"http://raftq-{i}.internal:8080"
        assert len(s.peers) == 5 and str(s.data_dir) == "/srv/raftq" and s.durability == "memory"
        assert s.limits.queue("emails").default_max_attempts == 5 and s.limits.default_queue.max_lease_duration_ms == 60000
        assert s.limits.dedup_window_ms == 3_600_000 and s.limits.dead_letter_retention_ms == 7 * 86_400_000
        assert s.api_keys == ({"name": "ops", "key": "k-0123456789", "role": "admin"},)
    unit = (out / "raftq.service").read_text()
    assert "ReadWritePaths=/srv/raftq" in unit and "WorkingDirectory=/srv/raftq" in unit

    code, text, err = raftq("config", "init", "--hosts", "fd00::1,fd00::2,fd00::3", "--out", str(tmp_path / "v6"))
    assert code == 0, err
    s = load(tmp_path / "v6" / "n2.toml")
    assert s.raft == "[fd00::2]:7101" and s.url == "http://[fd00::2]:7001"


@pytest.mark.parametrize("args, says", [
    (["--hosts", "a,b"], "2 hosts; use an odd number"),
    (["--hosts", "a,b,a"], "a given more than once"),
    (["--hosts", "h{n}"], "give --nodes N too"),
    (["--hosts", "a,b,c", "--nodes", "5"], "--nodes 5 but --hosts names 3 host(s)"),
    (["--hosts", "a:7001,b,c"], "is not a host name or IP address"),
    (["--hosts", "a,b,c", "--http-port", "7101"], "--http-port and --raft-port must differ"),
    (["--hosts", "a,b,c", "--data-dir", "data"], "give an absolute path"),
])
def test_init_refuses_what_cannot_work(tmp_path, args, says):
    code, text, err = raftq("config", "init", *args, "--out", str(tmp_path / "x"))
    assert code == 2 and says in err, err
    assert not (tmp_path / "x").exists()


def test_init_refuses_an_include_with_a_bad_key_naming_it(tmp_path):
    inc = tmp_path / "bad.toml"
    inc.write_text("[[queues]]\nname = \"q\"\nmax_lease_duration = 5\n")
    code, text, err = raftq("config", "init", "--hosts", "a,b,c", "--out", str(tmp_path / "x"), "--include", str(inc))
    assert code == 2 and f"{inc}: queues[q].max_lease_duration: unknown key" in err, err
    assert not (tmp_path / "x").exists()


def test_config_is_a_command_group():
    code, text, err = raftq("config")
    assert code == 2 and "init" in err
    code, text, err = raftq("config", "--help")
    assert code == 0 and "init" in text


def test_the_deploy_readme_command_runs_as_pasted(tmp_path):
    text = (ROOT / "deploy/README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("raftq config init "))
    args = line.split()[1:]
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", *args], capture_output=True, text=True,
                       cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "raftq-config"
    assert load(out / "n3.toml").raft == "10.0.0.3:7101"
    # The README's install lines name files config init wrote.
    for name in ("n1.toml", "raftq.service"):
        assert f"/tmp/{name}" in text and (out / name).exists()
