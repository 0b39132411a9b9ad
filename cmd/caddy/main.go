// Command caddy is Caddy with its standard modules and the onejob
// idempotency gateway.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/onejob/onejob/caddymodule"
)

func main() {
	caddycmd.Main()
}
