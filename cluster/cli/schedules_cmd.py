"""`raftq schedules list | show | put | delete | pause | resume | trigger`: cron and interval
schedules, replicated state changed online through the log (docs/semantics.md "Schedules").

`put` takes the common fields as options (`--cron` or `--every-ms`, `--queue`, `--type`, ...) or a
whole JSON body with `--file` (the body of PUT /v1/schedules/{name}, docs/api.md "Schedules").
"""
from __future__ import annotations

import json
import time

from .commands import (EXIT_OK, EXIT_UNREACHABLE, CliError, Ctx, _path, collect_pages, fmt_ms, fmt_rel, format_pairs,
                       format_table)


def _spec(s: dict) -> str:
    if s.get("cron") is not None:
        return f"{s['cron']} ({s['time_zone']})"
    return f"every {s['every_ms']} ms"


def _state(s: dict) -> str:
    if s["paused"]:
        return "paused"
    if s["next_fire_at_ms"] is None:
        return "finished"
    return "error: " + s["last_error"] if s.get("last_error") else "active"


async def cmd_schedules_list(ctx: Ctx) -> int:
    rows = await collect_pages(ctx, "schedules", "/v1/schedules", "schedules")
    if ctx.json:
        ctx.dump(rows)
        return EXIT_OK
    if not rows:
        ctx.out("no schedules; make one: raftq schedules put NAME --cron '*/5 * * * *' --queue Q --type T")
        return EXIT_OK
    now = int(time.time() * 1000)
    ctx.out(format_table(
        ["NAME", "SPEC", "QUEUE", "NEXT", "LAST TICK", "LAST JOB", "FIRED", "STATE"],
        [[s["name"], _spec(s), s["job"]["queue"],
          fmt_rel(s["next_fire_at_ms"] - now) if s["next_fire_at_ms"] is not None else None,
          fmt_rel(s["last_tick_at_ms"] - now) if s["last_tick_at_ms"] is not None else None,
          s["last_job_state"], s["fired"], _state(s)] for s in rows], right={6}))
    return EXIT_OK


async def cmd_schedules_show(ctx: Ctx) -> int:
    s = await ctx.call("schedule", "GET", f"/v1/schedules/{_path(ctx.args.name)}")
    if ctx.json:
        ctx.dump(s)
        return EXIT_OK
    ctx.out(format_pairs([
        ("name", s["name"]), ("version", s["version"]), ("spec", _spec(s)), ("state", _state(s)),
        ("next fire", fmt_ms(s["next_fire_at_ms"])), ("last tick", fmt_ms(s["last_tick_at_ms"])),
        ("last job", f"{s['last_job_id']} ({s['last_job_state']})" if s["last_job_id"] else None),
        ("fired", s["fired"]), ("skipped (overlap)", s["skipped"]), ("catch-up", s["catchup"]),
        ("overlap", s["overlap"]), ("job", json.dumps(s["job"], indent=2)),
    ]))
    return EXIT_OK


def _body(a) -> dict:
    if a.file:
        try:
            with open(a.file, encoding="utf-8") as f:
                body = json.load(f)
        except (OSError, ValueError) as e:
            raise CliError(f"--file {a.file}: {e}", EXIT_UNREACHABLE)
        if not isinstance(body, dict):
            raise CliError(f"--file {a.file}: must hold a JSON object (the body of PUT /v1/schedules/NAME)",
                           EXIT_UNREACHABLE)
        return body
    if (a.cron is None) == (a.every_ms is None):
        raise CliError("give --cron SPEC or --every-ms N (or --file BODY.json)", EXIT_UNREACHABLE)
    if not a.queue or not a.type:
        raise CliError("give the job's --queue and --type (or --file BODY.json)", EXIT_UNREACHABLE)
    job: dict = {"queue": a.queue, "job_type": a.type}
    if a.payload is not None:
        import base64
        job["payload"] = {"data_b64": base64.b64encode(a.payload.encode()).decode(), "encoding": a.encoding}
    for key, value in (("priority", a.priority), ("max_attempts", a.max_attempts)):
        if value is not None:
            job[key] = value
    body: dict = {"job": job}
    for key, value in (("cron", a.cron), ("time_zone", a.tz), ("every_ms", a.every_ms), ("catchup", a.catchup),
                       ("overlap", a.overlap), ("max_count", a.max_count), ("start_at_ms", a.start_at_ms),
                       ("end_at_ms", a.end_at_ms)):
        if value is not None:
            body[key] = value
    if a.paused:
        body["paused"] = True
    return body


async def cmd_schedules_put(ctx: Ctx) -> int:
    a = ctx.args
    body = _body(a)
    if a.expect_version is not None:
        body["expect_version"] = a.expect_version
    out = await ctx.call("schedule_put", "PUT", f"/v1/schedules/{_path(a.name)}", body, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        when = fmt_ms(out["next_fire_at_ms"]) if out["next_fire_at_ms"] is not None else "never (paused or finished)"
        ctx.out(f"schedule {a.name!r} {'created' if out['created'] else 'replaced'} (version {out['version']}); "
                f"next fire {when}")
    return EXIT_OK


async def cmd_schedules_delete(ctx: Ctx) -> int:
    a = ctx.args
    q = f"?expect_version={a.expect_version}" if a.expect_version is not None else ""
    out = await ctx.call("schedule_delete", "DELETE", f"/v1/schedules/{_path(a.name)}{q}", None, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"schedule {a.name!r} deleted: it fires nothing more (jobs it made stay in their queue)")
    return EXIT_OK


async def _simple(ctx: Ctx, action: str) -> dict:
    return await ctx.call(f"schedule_{action}", "POST", f"/v1/schedules/{_path(ctx.args.name)}/{action}", {},
                          mutating=True)


async def cmd_schedules_pause(ctx: Ctx) -> int:
    out = await _simple(ctx, "pause")
    ctx.dump(out) if ctx.json else ctx.out(f"schedule {ctx.args.name!r} paused: no tick fires until it is resumed")
    return EXIT_OK


async def cmd_schedules_resume(ctx: Ctx) -> int:
    out = await _simple(ctx, "resume")
    ctx.dump(out) if ctx.json else ctx.out(f"schedule {ctx.args.name!r} resumed: its next tick is the first after "
                                           "now (the paused ones are not caught up)")
    return EXIT_OK


async def cmd_schedules_trigger(ctx: Ctx) -> int:
    out = await _simple(ctx, "trigger")
    ctx.dump(out) if ctx.json else ctx.out(out["job_id"])
    return EXIT_OK


def add_parsers(sub, add_common, run) -> None:
    def client(parser, fn, command):
        add_common(parser, top=False)
        parser.set_defaults(fn=lambda a, fn=fn: run(a, fn), command=command)
        return parser

    s = sub.add_parser("schedules", help="cron and interval schedules: list, show, put, delete, pause, resume, "
                       "trigger", description="Cron and interval schedules: replicated, one job per tick across "
                       "any failover (docs/semantics.md \"Schedules\").")
    ssub = s.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    client(ssub.add_parser("list", help="every schedule: its spec, next fire, last tick and job, state"),
           cmd_schedules_list, "schedules list")
    sh = client(ssub.add_parser("show", help="one schedule in full"), cmd_schedules_show, "schedules show")
    sh.add_argument("name", metavar="NAME")
    p = client(ssub.add_parser("put", help="create or replace a schedule"), cmd_schedules_put, "schedules put")
    p.add_argument("name", metavar="NAME", help="1..128 characters of A-Z a-z 0-9 . _ : @ -")
    p.add_argument("--cron", metavar="SPEC", help="5-field cron expression or @hourly/@daily/@weekly/@monthly/@yearly")
    p.add_argument("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC), e.g. Europe/Berlin")
    p.add_argument("--every-ms", type=int, metavar="N", help="a fixed interval instead of --cron (>= 1000)")
    p.add_argument("--queue", metavar="QUEUE", help="the job's queue")
    p.add_argument("--type", metavar="TYPE", help="the job's job_type")
    p.add_argument("--payload", metavar="TEXT", help="the job's payload (UTF-8 text)")
    p.add_argument("--encoding", default="application/json", help="the payload's encoding (default application/json)")
    p.add_argument("--priority", type=int, metavar="0-9")
    p.add_argument("--max-attempts", type=int, metavar="N")
    p.add_argument("--catchup", choices=("skip", "one", "all"), help="missed ticks after an outage (default one)")
    p.add_argument("--overlap", choices=("allow", "skip", "replace"), help="while the last tick's job is not "
                   "finished (default allow)")
    p.add_argument("--max-count", type=int, metavar="N", help="fire at most N ticks")
    p.add_argument("--start-at-ms", type=int, metavar="MS")
    p.add_argument("--end-at-ms", type=int, metavar="MS")
    p.add_argument("--paused", action="store_true", help="create it paused")
    p.add_argument("--expect-version", type=int, metavar="N", help="0: create only; N: replace version N only")
    p.add_argument("--file", metavar="BODY.json", help="the whole request body instead of the options above")
    d = client(ssub.add_parser("delete", help="delete a schedule (the jobs it made stay)"), cmd_schedules_delete,
               "schedules delete")
    d.add_argument("name", metavar="NAME")
    d.add_argument("--expect-version", type=int, metavar="N", help="only if it is at version N")
    for action, fn, text in (("pause", cmd_schedules_pause, "stop firing until resumed"),
                             ("resume", cmd_schedules_resume, "fire again from the next tick on"),
                             ("trigger", cmd_schedules_trigger, "run the schedule's job once now (audited); "
                                                                "prints its job id")):
        a = client(ssub.add_parser(action, help=text), fn, f"schedules {action}")
        a.add_argument("name", metavar="NAME")
