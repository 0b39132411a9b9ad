#!/usr/bin/env bash
# Builds ./caddy: Caddy with its standard modules and the onejob idempotency
# module (from ./cmd/caddy), then runs it with the given arguments, if any:
#
#   ./xcaddy.sh run --config Caddyfile.example
#
# Nothing to install but Go: ./cmd/caddy imports the plugin (the root
# package) as xcaddy would. With xcaddy, the usual plugin build is
#
#   xcaddy build v2.11.9 --with github.com/onejob/onejob@v0.0.0=.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null || { echo "Go 1.26 or newer is required: https://go.dev/dl/" >&2; exit 1; }
go build -o caddy ./cmd/caddy
if [ $# -gt 0 ]; then
	exec ./caddy "$@"
fi
