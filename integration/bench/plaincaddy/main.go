// Command plaincaddy is Caddy with its standard modules only, built from
// the same Caddy version as the gateway: the baseline of the benchmarks.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func main() {
	caddycmd.Main()
}
