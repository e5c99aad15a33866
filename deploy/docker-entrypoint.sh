#!/bin/sh
# Entry point of the switchboard image: one image, seven binaries, $SERVICE picks the service.
#
#   (no arguments)      exec "$SERVICE"          run the service (directory by default)
#   health              exec "$SERVICE" health   the probe: 0 when this instance serves, else 1
#   <command> [args…]   exec <command> [args…]   anything else, e.g. `switchboard audit verify`
set -eu

case "${SERVICE:-}" in
    directory | inbox-fanout | reply-correlator | task-lifecycle | audit | a2a-gateway) ;;
    *)
        echo "switchboard image: SERVICE must be one of directory, inbox-fanout," \
            "reply-correlator, task-lifecycle, audit, a2a-gateway (got '${SERVICE:-}')" >&2
        exit 64
        ;;
esac

if [ "$#" -eq 0 ]; then
    exec "$SERVICE"
fi
if [ "$1" = "health" ]; then
    exec "$SERVICE" health
fi
exec "$@"
