// Command caddy is Caddy with its standard modules and the onejob
// idempotency gateway, imported as a plugin (package onejob), as xcaddy
// would build it.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/onejob/onejob"
)

func main() {
	caddycmd.Main()
}
