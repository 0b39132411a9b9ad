package caddymodule

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalGuest reads `<subdirective> <name> ...` (ledger, cache) with
// the block after it: the guest module <namespace>.<name> parses its own
// arguments and block with its UnmarshalCaddyfile, which it must have, as
// reverse_proxy's transports do. It returns the module's JSON, its name
// under inlineKey; T is the interface the namespace's modules implement.
func unmarshalGuest[T any](d *caddyfile.Dispenser, namespace, inlineKey string) (json.RawMessage, error) {
	what := d.Val()
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	id := namespace + "." + name
	if _, err := caddy.GetModule(id); err != nil {
		return nil, d.Errf("unknown %s %q (want %s)", what, name, guestNames(namespace))
	}
	unm, err := caddyfile.UnmarshalModule(d, id)
	if err != nil {
		return nil, err
	}
	if _, ok := unm.(T); !ok {
		return nil, d.Errf("module %s (%T) is not a %s module", id, unm, what)
	}
	return caddyconfig.JSONModuleObject(unm, inlineKey, name, nil), nil
}

// guestNames lists the names of a namespace's modules: "a, b or c".
func guestNames(namespace string) string {
	var names []string
	for _, m := range caddy.GetModules(namespace) {
		names = append(names, m.ID.Name())
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// setting is one setting of a guest module in a Caddyfile: its
// subdirective, the JSON field it fills (a string, or else parse reads the
// value into its field), whether it must be given, whether it is given by
// name in the block only, and the rule its value is held to (the one
// Provision applies, when the value can be judged before the config
// loads), if any.
type setting struct {
	name     string
	dst      *string
	parse    func(d *caddyfile.Dispenser, v string) error
	required bool
	named    bool
	check    func(string) error
}

// unmarshalSettings walks a guest module's Caddyfile segment: the module's
// name, then its settings, in order as arguments, or by name in a block,
// each at most once:
//
//	<name> [<value>...] {
//		<setting> <value>
//	}
//
// usage is the syntax errors show. A value given as "" is an error: a
// setting left out takes its default.
func unmarshalSettings(d *caddyfile.Dispenser, usage string, settings ...setting) error {
	d.Next() // the module's name
	given := make(map[string]bool, len(settings))
	set := func(s setting, v string) error {
		switch {
		case v == "" && s.required:
			return d.Errf("%s must not be empty (usage: %s)", s.name, usage)
		case v == "":
			return d.Errf("%s must not be empty; leave it out for the default (usage: %s)", s.name, usage)
		}
		if s.check != nil {
			if err := s.check(v); err != nil {
				return d.WrapErr(err)
			}
		}
		if s.parse != nil {
			if err := s.parse(d, v); err != nil {
				return err
			}
		} else {
			*s.dst = v
		}
		given[s.name] = true
		return nil
	}
	args := d.RemainingArgs()
	if n := slices.IndexFunc(settings, func(s setting) bool { return s.named }); len(args) > len(settings) || n >= 0 && len(args) > n {
		return d.Errf("usage: %s", usage)
	}
	for i, a := range args {
		if err := set(settings[i], a); err != nil {
			return err
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		i := slices.IndexFunc(settings, func(s setting) bool { return s.name == name })
		switch {
		case i < 0:
			return d.Errf("unknown subdirective %q (usage: %s)", name, usage)
		case given[name]:
			return d.Errf("%s is given twice", name)
		}
		args := d.RemainingArgs()
		if len(args) != 1 {
			return d.ArgErr()
		}
		if err := set(settings[i], args[0]); err != nil {
			return err
		}
	}
	for _, s := range settings {
		if s.required && !given[s.name] {
			return d.Errf("usage: %s", usage)
		}
	}
	return nil
}
