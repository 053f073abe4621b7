#!/bin/sh
# Rolling restart of a raftq cluster: one node at a time, followers first, the leader last, each
# node back at /readyz (a leader is known and it has caught up) before the next one goes down.
#
#   deploy/rolling-restart.sh 10.0.0.1 10.0.0.2 10.0.0.3
#
# Environment:
#   PORT     the nodes' HTTP port (7001)
#   SCHEME   http or https (http); for https, CURL_OPTS="--cacert /etc/raftq/ca.pem" when the
#            nodes' certificates are from your own CA
#   CURL_OPTS more curl options (a client certificate: --cert FILE --key FILE; a key for a
#            cluster with API keys is not needed: /readyz is open and /v1/cluster is read with
#            RAFTQ_API_KEY when set)
#   RESTART  command that restarts the node on host $1 and returns once it has been started
#            again (default: ssh "$1" sudo systemctl restart raftq)
#   TIMEOUT  seconds to wait for a restarted node to be ready (300)
#
# Before each restart every node must be ready; one that is not (a follower still catching up
# after a restart, a healed partition or a leader change) is waited for, up to TIMEOUT. Stops
# (exit 1) without touching the next node if one stays not ready or a restarted node does not
# come back in time: restarting another node then could cost the cluster its majority.
set -eu

PORT=${PORT:-7001}
SCHEME=${SCHEME:-http}
CURL_OPTS=${CURL_OPTS:-}
TIMEOUT=${TIMEOUT:-300}
# shellcheck disable=SC2016  # $1 is expanded later, by sh -c, to the host
RESTART=${RESTART:-'ssh "$1" sudo systemctl restart raftq'}

[ $# -ge 1 ] || { echo "usage: $0 HOST..." >&2; exit 2; }

ready() {   # ready HOST: /readyz answers 200
    # shellcheck disable=SC2086  # CURL_OPTS is a list of options
    [ "$(curl -s $CURL_OPTS -o /dev/null -m 3 -w '%{http_code}' "$SCHEME://$1:$PORT/readyz")" = 200 ]
}

leader_host() {   # the host part of the leader's URL, as any node sees it
    for h in "$@"; do
        # shellcheck disable=SC2086
        url=$(curl -s $CURL_OPTS ${RAFTQ_API_KEY:+-H "Authorization: Bearer $RAFTQ_API_KEY"} -m 3 \
            "$SCHEME://$h:$PORT/v1/cluster?digest=false" | python3 -c \
            'import json, sys; d = json.load(sys.stdin); print((d.get("leader") or {}).get("url", ""))' \
            2>/dev/null) || continue
        [ -n "$url" ] && { echo "$url" | sed -e 's#^[a-z]*://##' -e 's#:[0-9]*/*$##' -e 's#^\[\(.*\)\]$#\1#'; return 0; }
    done
    return 1
}

leader=$(leader_host "$@") || { echo "no node knows a leader; not restarting anything" >&2; exit 1; }
order=""
for h in "$@"; do [ "$h" = "$leader" ] || order="$order $h"; done
for h in "$@"; do [ "$h" = "$leader" ] && order="$order $h"; done
echo "leader: $leader; order:$order"

wait_ready() {   # wait_ready HOST: until /readyz answers 200, at most TIMEOUT seconds; sets $waited
    waited=0
    until ready "$1"; do
        [ "$waited" -lt "$TIMEOUT" ] || return 1
        sleep 1
        waited=$((waited + 1))
    done
}

for h in $order; do
    for other in "$@"; do
        wait_ready "$other" || { echo "$other is not ready after ${TIMEOUT}s; stopping before $h" >&2; exit 1; }
        [ "$waited" -eq 0 ] || echo "$other ready after ${waited}s"
    done
    echo "restarting $h"
    sh -c "$RESTART" restart "$h"
    wait_ready "$h" || { echo "$h not ready after ${TIMEOUT}s; stopping" >&2; exit 1; }
    echo "$h ready after ${waited}s"
done
echo "all restarted; leader now: $(leader_host "$@" || echo unknown)"
