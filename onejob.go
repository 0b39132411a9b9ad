// Package onejob is the onejob idempotency gateway as a Caddy plugin.
// Importing it registers, as every Caddy plugin does, the
// http.handlers.idempotency handler and its idempotency directive, the
// admin API's idempotency endpoints (admin.api.idempotency), the ledger
// modules (idempotency.ledgers.file, .memory, .postgres and .redis), the
// replay cache (idempotency.caches.redis) and the `caddy idempotency`
// command. So a Caddy with onejob builds the usual way:
//
//	xcaddy build v2.11.9 --with github.com/onejob/onejob
//
// or, from a checkout, with no xcaddy to install: ./xcaddy.sh, which
// builds ./cmd/caddy (Caddy's standard modules and this package).
//
// The Caddy glue lives in package caddymodule, the request flow in package
// proxy, the ledgers under package ledger.
package onejob

import (
	// The modules, the directive and the command register themselves.
	_ "github.com/onejob/onejob/caddymodule"
)
