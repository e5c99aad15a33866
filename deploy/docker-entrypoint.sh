#!/bin/sh
# Entry point of the switchboard image: one image, ten binaries (nine services and the
# `switchboard` CLI), $SERVICE picks the service.
#
#   (no arguments)      exec "$SERVICE"          run the service (directory by default)
#   health              exec "$SERVICE" health   the probe: 0 when this instance serves, else 1
#                                                (console: its HTTP port answers, see below)
#   <command> [args…]   exec <command> [args…]   anything else, e.g. `switchboard audit verify`
set -eu

case "${SERVICE:-}" in
    directory | inbox-fanout | reply-correlator | task-lifecycle | audit | a2a-gateway | people | limits | files | console) ;;
    *)
        echo "switchboard image: SERVICE must be one of directory, inbox-fanout," \
            "reply-correlator, task-lifecycle, audit, a2a-gateway, people, limits, files, console" \
            "(got '${SERVICE:-}')" >&2
        exit 64
        ;;
esac

if [ "$#" -eq 0 ]; then
    exec "$SERVICE"
fi
if [ "$1" = "health" ]; then
    if [ "$SERVICE" = "console" ]; then
        # The console is an HTTP server with no micro service, so no instance id to PING
        # (`console health` would always fail): it is healthy when its port answers
        # GET /api/me with 200. It answers only the Host 127.0.0.1:<its own port>, so the port
        # comes from SWITCHBOARD_CONSOLE__LISTEN (default 127.0.0.1:8090). The image has no
        # curl or wget: bash's /dev/tcp, within 5 s.
        listen="${SWITCHBOARD_CONSOLE__LISTEN:-127.0.0.1:8090}"
        # shellcheck disable=SC2016 # $1 and $status are bash's, in the script below
        exec timeout 5 bash -c '
            if ! { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
                echo "console: unhealthy: nothing answers on 127.0.0.1:$1" >&2
                exit 1
            fi
            printf "GET /api/me HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n" "$1" >&3
            IFS= read -r status <&3 || status=""
            case "$status" in
                "HTTP/1."?" 200 "*) echo "console: healthy (http://127.0.0.1:$1 answers)"; exit 0 ;;
            esac
            echo "console: unhealthy: GET /api/me on port $1: ${status:-no answer}" >&2
            exit 1
        ' console-health "${listen##*:}"
    fi
    exec "$SERVICE" health
fi
exec "$@"
