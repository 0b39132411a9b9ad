// Command caddy is Caddy with its standard modules and the onejob
// idempotency gateway, imported as a plugin (package onejob), as xcaddy
// would build it, and the demo modules Caddyfile.example uses (the demo
// model, package demomodel, and the demo payments API, package
// demopayments), which the plugin never has.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/onejob/onejob"
	_ "github.com/onejob/onejob/cmd/caddy/demomodel"
	_ "github.com/onejob/onejob/cmd/caddy/demopayments"
)

func main() {
	caddycmd.Main()
}
