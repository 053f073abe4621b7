"""The node process: `raftq node --config FILE` / `python -m raftq.node --config FILE`."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from aiohttp import web

from .api.guard import GuardedRunner, allowed_hosts, install_redaction
from .api.http import build_app
from .core.limits import ConfigError
from .replication.replica import StorageFailure
from .service.node_service import EXIT_STORAGE, NodeService
from .base.settings import Settings, load

log = logging.getLogger("raftq.node")


async def serve(settings: Settings, tls_loaded=None, accept_damaged_log: bool = False) -> int:
    """`tls_loaded`: node/base/tls.py's Loaded when the node serves TLS (checked before the start)."""
    loop = asyncio.get_running_loop()
    try:
        service = NodeService(settings, loop, accept_damaged_log=accept_damaged_log)
    except StorageFailure as e:
        # Opening the data dir failed (a journal or meta write, an upgrade, a rename): the same
        # rule as a failed write later on.
        msg = (f"storage failure: {e.op} of {e.path} failed with errno {e.errno} ({e.strerror}); exiting with "
               f"code {EXIT_STORAGE}")
        log.critical(msg)
        print(f"raftq node {settings.node_id}: {msg}", file=sys.stderr, flush=True)
        return EXIT_STORAGE
    app = build_app(service)
    runner = GuardedRunner(app, tuning=settings.tuning, allowed_hosts=allowed_hosts(settings), access_log=None,
                           handle_signals=False, shutdown_timeout=5.0)
    app["runner"] = runner
    await runner.setup()
    if tls_loaded is None:
        site = web.TCPSite(runner, settings.http_host, settings.http_port, reuse_address=True)
    else:
        from .base.tls import TlsSite
        t = settings.tuning
        site = TlsSite(runner, settings.http_host, settings.http_port, tls_loaded, settings.url,
                       handshake_timeout=float(t["http_header_timeout_s"]), max_pending=int(t["max_connections"]))
    try:
        await site.start()
    except OSError as e:
        print(f"raftq node {settings.node_id}: cannot listen on {settings.http_host}:{settings.http_port}: "
              f"{e.strerror}; is another node using that port?", file=sys.stderr, flush=True)
        service.replica.destroy()
        return 1
    grpc_server = await start_grpc(service)
    if isinstance(grpc_server, int):
        await runner.cleanup()
        service.replica.destroy()
        return grpc_server
    stop = asyncio.Event()
    service.start(on_fatal=stop.set)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: reload_tls(site, settings, grpc_server))
    log.info("node %s serving %s (raft %s, data %s, durability %s)", settings.node_id, settings.url,
             settings.raft, settings.data_dir, settings.durability)
    if tls_loaded is not None:
        log_tls(tls_loaded, settings, "serving TLS with")
    await stop.wait()
    log.info("node %s stopping", settings.node_id)
    await service.stop()
    if grpc_server is not None:
        await grpc_server.stop()
    await runner.cleanup()
    if service.fatal:
        print(f"raftq node {settings.node_id}: {service.fatal}", file=sys.stderr, flush=True)
        return 2
    log.info("node %s stopped", settings.node_id)
    return 0


async def start_grpc(service: NodeService):
    """[grpc] listen: sepp's gRPC API (node/api/sepp_grpc.py) on this loop, started; None when
    off; an exit code when it cannot start (2: the grpc extra is missing, 1: cannot listen)."""
    settings = service.settings
    if settings.grpc_listen is None:
        return None
    try:
        from .api.sepp_grpc import GrpcServer
    except ImportError as e:
        print(f"raftq node {settings.node_id}: [grpc] listen is set but the gRPC API cannot be loaded ({e}): "
              "install the grpc extra (pip install 'raftq[server,grpc]')", file=sys.stderr, flush=True)
        return 2
    server = GrpcServer(service)
    try:
        await server.start()
    except OSError as e:
        print(f"raftq node {settings.node_id}: gRPC: {e}; is another process using that port?",
              file=sys.stderr, flush=True)
        await server.stop(0)
        return 1
    log.info("node %s serving sepp's gRPC API on %s%s", settings.node_id, server.address,
             " (TLS)" if server.certificates else "")
    return server


def log_tls(loaded, settings: Settings, what: str) -> None:
    from .base.tls import warnings_for
    log.info("TLS: %s %s", what, loaded.describe())
    for text in warnings_for(loaded, settings.url):
        log.warning("TLS: %s", text)


def reload_tls(site, settings: Settings, grpc_server=None) -> None:
    """SIGHUP: load the TLS files again. New connections get the new certificate (and client
    CA), established ones keep theirs; files that do not load leave everything as it was. The
    gRPC port (when on) takes the same files, once the HTTP site has loaded them."""
    from .base.tls import TlsSite
    if not isinstance(site, TlsSite):
        log.info("SIGHUP: this node has no TLS (node.tls_cert): nothing to reload")
        return
    try:
        loaded = site.reload()
    except ConfigError as e:
        log.error("TLS: reload failed, still serving the certificate loaded before (%s): %s",
                  site.loaded.cert.line(), e)
        return
    except Exception as e:                  # never let a reload take the node down
        log.exception("TLS: reload failed, still serving the certificate loaded before: %s", e)
        return
    log_tls(loaded, settings, "reloaded: new connections get")
    if grpc_server is not None:
        try:
            grpc_server.reload_tls()
        except Exception as e:              # never let a reload take the node down
            log.error("TLS: gRPC reload failed, its port still serves the files loaded before: %s", e)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="raftq node", description="Run one raftq node.",
        epilog=f"Exit status: 0 stopped; 1 cannot listen; 2 config error or limits that differ from the "
               f"cluster's; {EXIT_STORAGE} a write or sync of the data dir failed (EIO, ENOSPC: the node stops "
               "rather than retry; a restart recovers from what the disk holds).")
    parser.add_argument("--config", required=True, help="the node's TOML config file")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--accept-damaged-log", action="store_true",
                        help="take this node's log as the disk checks left it and vote with it at once (only when a "
                             "majority was damaged together and no trusted leader can repair it: entries the checks "
                             "cut may have been acknowledged)")
    parser.add_argument("--check", action="store_true",
                        help="check the config (and the TLS files it names) and exit: 0 when the node would start")
    args = parser.parse_args(argv)
    tls_loaded = None
    try:
        settings = load(args.config)
        if settings.tls is not None:
            from .base.tls import load as load_tls
            tls_loaded = load_tls(settings.tls)
    except ConfigError as e:
        print(f"raftq node: config error: {e}", file=sys.stderr)
        return 2
    # SIGHUP reloads the TLS files once the node listens (serve); until then it is ignored
    # instead of ending the process (its default).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if args.check:
        print(f"raftq node: {args.config} is a valid config for node {settings.node_id} at {settings.url}"
              + (f"; TLS {tls_loaded.describe()}" if tls_loaded else ""))
        return 0
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {settings.node_id} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("raftq.node.raft").setLevel(logging.WARNING)       # the Raft fork (node/raft)
    # No log line carries an API key (aiohttp quotes a malformed request's header lines).
    install_redaction(k["key"] for k in settings.api_keys or ())
    # The queue state is millions of long-lived containers (jobs, heap entries, dedup and
    # request-id records) with almost no reference cycles. CPython's default thresholds make
    # the cyclic GC walk them again and again, in pauses that stall the Raft tick thread;
    # collect the young often, the old rarely.
    gc.set_threshold(50_000, 50, 1000)
    return run_loop(serve(settings, tls_loaded, args.accept_damaged_log), settings.tuning["event_loop"])


def run_loop(main, kind: str):
    """Run `main` on uvloop (the default) or on asyncio's own loop. The leader's event loop
    parses and answers every HTTP request, and uvloop does that for ≈ 10 µs less CPU per
    request here (README "Performance"); a machine without it (Windows, or an install that left
    it out) runs on asyncio's loop, with the same behaviour."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's event loop (tuning.event_loop)")
        else:
            return uvloop.run(main)
    return asyncio.run(main)
