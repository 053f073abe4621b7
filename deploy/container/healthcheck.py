"""The image's HEALTHCHECK: GET PATH (default /readyz) on this node's own HTTP address, read from
the mounted config; exit 0 on 200, 1 otherwise (with the reason on stderr, which `docker inspect`
shows under State.Health).

The address is the node's listening one, not its advertised `url`: the `url` is where clients
outside reach the node (a published host port, a load balancer) and need not lead back into this
container. A wildcard bind is asked on loopback. With TLS the check is a loopback call to the
node itself, so the certificate (issued for the advertised name) is not verified here; with
`tls_client_ca` it presents the node's own certificate, as the nodes do to each other.
"""
import ssl
import sys
import urllib.error
import urllib.request

from raftq.node.base.settings import load

CONFIG = "/etc/raftq/node.toml"


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "/readyz"
    s = load(CONFIG)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(s.http_host, s.http_host)
    host = f"[{host}]" if ":" in host else host
    tls = s.tls is not None
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if s.tls.client_ca is not None:
            # mTLS: the node's own certificate is one its client CA accepts (peers present it too).
            ctx.load_cert_chain(s.tls.cert, s.tls.key)
    url = f"{'https' if tls else 'http'}://{host}:{s.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=4, context=ctx) as r:
            return 0 if r.status == 200 else 1
    except urllib.error.HTTPError as e:
        print(f"{url}: {e.code} {e.read(200).decode(errors='replace')}", file=sys.stderr)
    except OSError as e:
        print(f"{url}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
