"""Where a node calls the others (`[node] peer_urls`, node/service/members.py): the entry of the
member called, else the URL it advertises; the leader's advertised URL is what clients get."""
from types import SimpleNamespace

from raftq.node.base.settings import Peer
from raftq.node.service.members import Members
from raftq.node.service.roles import TimeAndRoles

PEERS = (Peer("n1", "10.9.0.1:7101", "http://127.0.0.1:7001"), Peer("n2", "10.9.0.2:7101", "http://127.0.0.1:7002"),
         Peer("n3", "10.9.0.3:7101", "http://127.0.0.1:7003"))


class Node(Members, TimeAndRoles):
    """n1, with the parts of NodeService that the two methods read."""

    def __init__(self, leader_raft, peer_urls, removed=False):
        self.settings = SimpleNamespace(node_id="n1", raft=PEERS[0].raft, url=PEERS[0].url, peer_urls=peer_urls,
                                        peer_by_raft=lambda r: next((p for p in PEERS if p.raft == r), None))
        self.replica = SimpleNamespace(removed=removed, leader_raft=lambda: leader_raft,
                                       member_by_raft=lambda r: next((p for p in PEERS if p.raft == r), None))


INTERNAL = {"n1": "http://n1:7001", "n2": "http://n2:7002"}


def test_a_listed_member_is_called_at_its_entry_the_others_at_their_url():
    node = Node(None, INTERNAL)
    assert [node.peer_url(p) for p in PEERS] == ["http://n1:7001", "http://n2:7002", "http://127.0.0.1:7003"]
    assert [Node(None, {}).peer_url(p) for p in PEERS] == [p.url for p in PEERS]


def test_the_leader_is_dialled_at_its_entry_and_advertised_at_its_url():
    node = Node(PEERS[1].raft, INTERNAL)
    assert node.leader_peer_url() == "http://n2:7002" and node.leader_url() == "http://127.0.0.1:7002"
    node = Node(PEERS[2].raft, INTERNAL)
    assert node.leader_peer_url() == node.leader_url() == "http://127.0.0.1:7003"


def test_this_node_leading_is_its_own_url_and_no_leader_is_none():
    # The callers tell "I lead" by comparing with settings.url: this node's own entry is not used.
    assert Node(PEERS[0].raft, INTERNAL).leader_peer_url() == "http://127.0.0.1:7001"
    assert Node(None, INTERNAL).leader_peer_url() is None
    assert Node(PEERS[1].raft, INTERNAL, removed=True).leader_peer_url() is None
    assert Node("10.9.0.9:7101", INTERNAL).leader_peer_url() is None       # a leader no member list names
