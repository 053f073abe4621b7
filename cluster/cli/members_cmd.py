"""`raftq members list | add ID RAFT URL | remove ID`: the cluster's membership, changed online
one member at a time through the Raft log (docs/cluster.md "Membership changes").

`list` asks every node it knows (the --urls and the members they name) for its own view, so a
node that disagrees or was removed shows. `add` and `remove` go to the leader and return once the
change is committed; an add first waits for the new node to catch up (it must be running, with a
config naming the current members and itself), which takes as long as sending it the snapshot.
"""
from __future__ import annotations

from .commands import EXIT_FAILED, EXIT_OK, Ctx, _path, format_table

# An add waits for the new node to receive the log (or the snapshot) before it is proposed.
CHANGE_WAIT_S = 600.0


async def cmd_members_list(ctx: Ctx) -> int:
    answers = await ctx.probe(ctx.urls)
    urls = list(ctx.urls)
    for a in answers:
        for m in (a.view or {}).get("members", []):
            if m.get("url") and m["url"].rstrip("/") not in urls:
                urls.append(m["url"].rstrip("/"))
    if len(urls) > len(ctx.urls):
        answers += await ctx.probe(urls[len(ctx.urls):])
    views = [a.view for a in answers if a.view]
    # The membership in force: that of the node that leads (else of the highest commit index).
    best = max(views, key=lambda v: (v.get("role") == "leader" and not v.get("removed"), v.get("commit_index") or 0),
               default=None)
    if best is None:
        ctx.err("raftq: no node answered: " + "; ".join(f"{a.url}: {a.error}" for a in answers))
        return EXIT_FAILED
    by_id = {v["node_id"]: v for v in views}
    members = best.get("members", [])
    if ctx.json:
        ctx.dump({"members": [{"id": m["id"], "raft": m.get("raft") or m.get("raft_addr"), "url": m["url"]}
                              for m in members],
                  "leader": (best.get("leader") or {}).get("id"),
                  "removed": sorted(v["node_id"] for v in views if v.get("removed"))})
        return EXIT_OK
    rows = []
    for m in members:
        v = by_id.get(m["id"])
        seen = [x["id"] for x in v.get("members", [])] if v else None
        agrees = "-" if v is None else ("yes" if seen == [x["id"] for x in members] else "no: " + ",".join(seen))
        rows.append([m["id"], m.get("raft") or m.get("raft_addr"), m["url"], v["role"] if v else "unreachable", agrees])
    ctx.out(format_table(["ID", "RAFT", "URL", "ROLE", "SAME MEMBERS"], rows))
    for v in views:
        if v.get("removed"):
            ctx.out(f"{v['node_id']} was removed from the cluster and serves nothing: stop it")
    if best.get("membership_change"):
        ctx.out(f"under way: {best['membership_change']}")
    return EXIT_OK


async def _change(ctx: Ctx, op: str, method: str, path: str, body):
    ctx.mutating = True
    out = await ctx.client.call(op, method, path, body, mutating=True, timeout=max(ctx.timeout, CHANGE_WAIT_S),
                                extra_wait=CHANGE_WAIT_S)
    ctx.mutating = False
    return out


async def cmd_members_add(ctx: Ctx) -> int:
    a = ctx.args
    out = await _change(ctx, "member_add", "POST", "/v1/cluster/members", {"id": a.id, "raft": a.raft, "url": a.url})
    if ctx.json:
        ctx.dump(out)
    elif not out.get("changed", True):
        ctx.out(f"{a.id} is a member already (members: {', '.join(m['id'] for m in out['members'])})")
    else:
        ctx.out(f"{a.id} added (it caught up in {out.get('caught_up_s', 0):.1f} s); members: "
                f"{', '.join(m['id'] for m in out['members'])}")
    return EXIT_OK


async def cmd_members_remove(ctx: Ctx) -> int:
    a = ctx.args
    out = await _change(ctx, "member_remove", "DELETE", f"/v1/cluster/members/{_path(a.id)}", None)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"{a.id} removed; members: {', '.join(m['id'] for m in out['members'])}. Stop {a.id}'s process: it "
                "serves nothing any more")
    return EXIT_OK


def add_parsers(sub, add_common, run) -> None:
    def client(parser, fn, needs_client=True):
        add_common(parser, top=False)
        parser.set_defaults(fn=lambda a, fn=fn: run(a, fn, needs_client=needs_client))
        return parser

    m = sub.add_parser("members", help="the cluster's members: list, add, remove (online, one at a time)",
                       description="The cluster's membership, changed online through the Raft log, one member at a "
                                   "time (docs/cluster.md \"Membership changes\").")
    msub = m.add_subparsers(dest="members_command", required=True, metavar="ACTION")
    ml = client(msub.add_parser("list", help="the members in force, and whether every node agrees"), cmd_members_list,
                needs_client=False)
    ml.set_defaults(command="members list")
    ma = client(msub.add_parser("add", help="add a running new node (its config names the current members and itself);"
                                " returns once it caught up and the change is committed"), cmd_members_add)
    ma.add_argument("id", metavar="ID", help="the new node's node.id")
    ma.add_argument("raft", metavar="RAFT", help="its node.raft, host:port")
    ma.add_argument("url", metavar="URL", help="its node.url, the address clients use")
    ma.set_defaults(command="members add")
    mr = client(msub.add_parser("remove", help="remove a member (the leader hands leadership over first); the "
                                "removed node stops serving"), cmd_members_remove)
    mr.add_argument("id", metavar="ID")
    mr.set_defaults(command="members remove")
