package caddymodule

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/internal/jsonpointer"
	"github.com/onejob/onejob/proxy"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// After the authentication directives, so the owner is known, and
	// before invoke/handle/route, so every handler of the site is behind it.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.Before, "invoke")
}

// parseCaddyfile reads the directive, then the provider blocks it saved,
// with the adapter's helper (reverse_proxy reads its handle_response
// blocks the same way).
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	if err := m.unmarshal(h.Dispenser); err != nil {
		return nil, err
	}
	if err := m.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	return m, nil
}

// adapting is what the Caddyfile parser keeps from UnmarshalCaddyfile's
// walk for FinalizeUnmarshalCaddyfile.
type adapting struct {
	directive caddyfile.Token            // the directive's name
	seen      map[string]caddyfile.Token // each subdirective's first line
	providers []caddyfile.Segment        // the provider blocks, whole
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	idempotency [<matcher>] {
//		scope <name>
//		ledger <backend> <args...> [{ <settings> }]
//		cache <backend> <args...> [{ <settings> }]
//		owner <value>
//		owner_secret <secret>
//		key_header <name>
//		methods <method...>
//		require_key
//		implicit_key <window>
//		fingerprint raw | json | graphql
//		fingerprint json {
//			include <json-pointer...>
//			exclude <json-pointer...>
//		}
//		fingerprint_headers <name...>
//		never_store <header...>
//		encryption {
//			key <id> <base64 key>
//		}
//		status_path <path>
//		max_request_body <size>
//		max_response_body <size>
//		retention <duration>
//		attempt_timeout <duration>
//		attempt_deadline <duration>
//		in_flight wait [<duration>] | reject
//		max_wait <duration>
//		failover_on <status|connect_error|contract...>
//		hedge_after <duration>
//		reconcile_every <duration>
//		contract {
//			status <code|2xx...>
//			content_type <media-type>
//			json_schema <file> [at <json-pointer>]
//			graphql_schema <file>
//		}
//		probe <method> <path> [<body-file>] {
//			every <duration>
//		}
//		provider <name> {
//			<handler directives, e.g. reverse_proxy ...>
//			deduplicates [<header>]
//			lookup <method> <uri> {
//				absent <status...>
//			}
//		}
//	}
//
// The ledger and the cache are guest modules, each parsing its own
// arguments and block (see their UnmarshalCaddyfile): ledger file
// [<path>] | memory | postgres <dsn> [<schema>] | redis <url> [<prefix>],
// and cache redis <url> [<prefix>]. Provider blocks are subroutes, which
// only the Caddyfile adapter builds (FinalizeUnmarshalCaddyfile): on its
// own, UnmarshalCaddyfile refuses them; everything else can be
// unmarshaled on its own.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if err := h.unmarshal(d); err != nil {
		return err
	}
	if len(h.adapting.providers) > 0 {
		// Where the parser stood after the first provider block: its
		// closing brace.
		seg := h.adapting.providers[0]
		return wrapAt(seg[len(seg)-1], errors.New("provider blocks need the Caddyfile adapter"))
	}
	return h.finishCaddyfile()
}

// FinalizeUnmarshalCaddyfile parses the provider blocks UnmarshalCaddyfile
// saved, each as a subroute of handler directives (with the helper the
// Caddyfile adapter passes to a directive), then holds the config's values
// to each other, as Provision does.
func (h *Handler) FinalizeUnmarshalCaddyfile(helper httpcaddyfile.Helper) error {
	if h.adapting == nil {
		return nil
	}
	for _, seg := range h.adapting.providers {
		if err := h.parseProvider(seg, helper); err != nil {
			return err
		}
	}
	h.adapting.providers = nil
	return h.finishCaddyfile()
}

// unmarshal walks the directive's block. A provider block's first line is
// judged here; the block itself is saved for FinalizeUnmarshalCaddyfile.
func (h *Handler) unmarshal(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	h.adapting = &adapting{directive: d.Token(), seen: map[string]caddyfile.Token{}}
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := h.adapting.seen
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if _, dup := seen[name]; dup && name != "provider" { // one block per provider; all else once
			return d.Errf("duplicate subdirective %q", name)
		} else if !dup {
			seen[name] = d.Token()
		}
		var err error
		switch name {
		case "provider":
			err = h.saveProvider(d)
		case "ledger":
			h.LedgerRaw, err = unmarshalGuest[LedgerModule](d, ledgerNamespace, "backend")
		case "cache":
			h.CacheRaw, err = unmarshalGuest[CacheModule](d, cacheNamespace, "backend")
		default:
			err = h.unmarshalOption(d, name, d.RemainingArgs())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// finishCaddyfile applies the rules Provision applies, the values
// together, once every line is read: an error points at the subdirective
// it names, else at the directive.
func (h *Handler) finishCaddyfile() error {
	a := h.adapting
	h.adapting = nil
	if _, err := h.checkGiven(func(name string) bool { _, ok := a.seen[name]; return ok }); err != nil {
		var fe *fieldError
		tok, found := a.directive, false
		if errors.As(err, &fe) {
			// The line of the field it names; of the later of two.
			for _, name := range []string{fe.name, fe.with} {
				if t, ok := a.seen[name]; ok && (!found || t.Line > tok.Line) {
					tok, found = t, true
				}
			}
		}
		return wrapAt(tok, err)
	}
	return nil
}

// parseSelection reads the block of "fingerprint json { include|exclude
// <json-pointer...> }", if there is one.
func (h *Handler) parseSelection(d *caddyfile.Dispenser) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if h.Fingerprint != "json" {
			return d.Errf("fingerprint %s takes no block: include and exclude select members of JSON bodies", h.Fingerprint)
		}
		which := d.Val()
		if which != "include" && which != "exclude" {
			return d.Errf("fingerprint json: unknown %q, want include or exclude", which)
		}
		pointers := d.RemainingArgs()
		if len(pointers) == 0 {
			return d.Errf("fingerprint json: %s needs at least one JSON pointer", which)
		}
		for _, p := range pointers {
			if _, err := jsonpointer.Parse(p); err != nil {
				return d.Errf("fingerprint json: %s: %v", which, err)
			}
		}
		if which == "include" {
			h.FingerprintInclude = append(h.FingerprintInclude, pointers...)
		} else {
			h.FingerprintExclude = append(h.FingerprintExclude, pointers...)
		}
		if len(h.FingerprintInclude) > 0 && len(h.FingerprintExclude) > 0 {
			return d.Errf("fingerprint json: include and exclude together: name the members that count, or those that do not")
		}
	}
	return nil
}

// unmarshalOption reads one subdirective of the handler's own config
// (not a provider, ledger or cache) and its arguments.
func (h *Handler) unmarshalOption(d *caddyfile.Dispenser, name string, args []string) error {
	var err error
	switch name {
	case "scope":
		h.Scope, err = one(d, args)
	case "owner":
		h.Owner, err = one(d, args)
	case "owner_secret":
		if h.OwnerSecret, err = one(d, args); err == nil {
			err = at(d, checkOwnerSecret(h.OwnerSecret))
		}
	case "key_header":
		h.KeyHeader, err = one(d, args)
	case "methods":
		if len(args) == 0 {
			return d.ArgErr()
		}
		for _, m := range args {
			h.Methods = append(h.Methods, strings.ToUpper(m))
		}
	case "require_key":
		if len(args) != 0 {
			return d.ArgErr()
		}
		h.RequireKey = true
	case "implicit_key":
		h.ImplicitKey, err = duration(d, name, args)
	case "fingerprint":
		if h.Fingerprint, err = one(d, args); err != nil {
			return err
		}
		if _, perr := fingerprint.ParseBodyMode(h.Fingerprint); perr != nil || h.Fingerprint == "" {
			return d.Errf("fingerprint must be raw, json or graphql, not %q", h.Fingerprint)
		}
		return h.parseSelection(d)
	case "fingerprint_headers":
		if len(args) == 0 {
			return d.ArgErr()
		}
		h.FingerprintHeaders = args
	case "max_request_body", "max_response_body":
		dst := map[string]*int64{"max_request_body": &h.MaxRequestBody, "max_response_body": &h.MaxResponseBody}[name]
		*dst, err = size(d, name, args)
	case "retention", "attempt_timeout", "attempt_deadline", "max_wait", "hedge_after", "reconcile_every":
		dst := map[string]*caddy.Duration{"retention": &h.Retention, "attempt_timeout": &h.AttemptTimeout,
			"attempt_deadline": &h.AttemptDeadline, "max_wait": &h.MaxWait, "hedge_after": &h.HedgeAfter,
			"reconcile_every": &h.ReconcileEvery}[name]
		*dst, err = duration(d, name, args)
	case "never_store":
		if len(args) == 0 {
			return d.ArgErr()
		}
		h.NeverStore = args
	case "encryption":
		err = h.parseEncryption(d, args)
	case "in_flight":
		err = h.parseInFlight(d, args)
	case "status_path":
		h.StatusPath, err = one(d, args)
	case "contract":
		if len(args) != 0 {
			return d.ArgErr()
		}
		err = h.parseContract(d)
	case "probe":
		err = h.parseProbe(d, args)
	case "failover_on":
		if len(args) == 0 {
			return d.ArgErr()
		}
		h.FailoverOn = args
	default:
		return d.Errf("unknown subdirective %q", name)
	}
	return err
}

func one(d *caddyfile.Dispenser, args []string) (string, error) {
	if len(args) != 1 {
		return "", d.ArgErr()
	}
	return args[0], nil
}

// at adds the current token's file and line to err, if there is one.
func at(d *caddyfile.Dispenser, err error) error {
	if err == nil {
		return nil
	}
	return d.WrapErr(err)
}

// size reads the size of subdirective name: checkSize's rule, and more
// than 0 (a Caddyfile asks for the default by leaving the line out).
func size(d *caddyfile.Dispenser, name string, args []string) (int64, error) {
	s, err := one(d, args)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(s)
	switch {
	case err != nil:
		return 0, d.Errf("%s: invalid size %q", name, s)
	case n == 0:
		return 0, d.Errf("%s: invalid size %q: it must be more than 0; leave the line out for the default", name, s)
	case n > maxSize:
		return 0, d.Errf("%s: invalid size %q: more than 1TiB", name, s)
	}
	return int64(n), nil
}

// duration reads the duration of subdirective name: checkDuration's rule,
// and more than 0 (a Caddyfile asks for the default by leaving the line
// out).
func duration(d *caddyfile.Dispenser, name string, args []string) (caddy.Duration, error) {
	s, err := one(d, args)
	if err != nil {
		return 0, err
	}
	v, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q", name, s)
	}
	if err := checkDuration(name, caddy.Duration(v)); err != nil {
		return 0, d.Errf("invalid duration %q: %v", s, err)
	}
	if v == 0 {
		return 0, d.Errf("%s: invalid duration %q: it must be more than 0", name, s)
	}
	return caddy.Duration(v), nil
}

func (h *Handler) parseContract(d *caddyfile.Dispenser) error {
	start := d.Token()
	c := &ContractConfig{}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("contract: duplicate %q", name)
		}
		seen[name] = true
		args := d.RemainingArgs()
		var err error
		switch name {
		case "json_schema":
			err = parseJSONSchema(d, c, args)
		case "status":
			if len(args) == 0 {
				return d.ArgErr()
			}
			// The rule Provision applies, through the same compiler.
			if _, err := contract.Compile(contract.Spec{Statuses: args}); err != nil {
				return d.Err(err.Error())
			}
			c.Status = args
		default:
			dst, ok := map[string]*string{
				"content_type":   &c.ContentType,
				"graphql_schema": &c.GraphQLSchema,
			}[name]
			if !ok {
				return d.Errf("contract: unknown rule %q (want status, content_type, json_schema or graphql_schema)", name)
			}
			if *dst, err = one(d, args); err != nil {
				return err
			}
			if *dst == "" {
				return d.Errf("contract: %s must not be empty", name)
			}
			if name == "content_type" {
				_, err = contract.Compile(contract.Spec{ContentType: c.ContentType})
				err = at(d, err)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := c.check(); err != nil {
		return wrapAt(start, err)
	}
	h.Contract = c
	return nil
}

// parseJSONSchema reads "json_schema <file> [at <json-pointer>]".
func parseJSONSchema(d *caddyfile.Dispenser, c *ContractConfig, args []string) error {
	switch {
	case len(args) == 1:
	case len(args) == 3 && args[1] == "at":
		if _, err := jsonpointer.Parse(args[2]); err != nil {
			return d.Errf("contract: json_schema at: %v", err)
		}
		c.JSONSchemaAt = args[2]
	default:
		return d.Errf("usage: json_schema <file> [at <json-pointer>]")
	}
	if args[0] == "" {
		return d.Errf("contract: json_schema must not be empty")
	}
	c.JSONSchema = args[0]
	return nil
}

func (h *Handler) parseProbe(d *caddyfile.Dispenser, args []string) error {
	if len(args) < 2 || len(args) > 3 {
		return d.Errf("usage: probe <method> <path> [<body-file>] { every <duration> }")
	}
	p := &ProbeConfig{Method: strings.ToUpper(args[0]), Path: args[1]}
	if err := p.check(); err != nil {
		return d.Err(err.Error())
	}
	if len(args) == 3 {
		if p.BodyFile = args[2]; p.BodyFile == "" {
			return d.Errf("probe: the body file must not be empty; leave it out for no body")
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "every":
			v, err := duration(d, "probe: every", d.RemainingArgs())
			if err != nil {
				return err
			}
			p.Every = v
		default:
			return d.Errf("probe: unknown option %q (want every)", d.Val())
		}
	}
	h.Probe = p
	return nil
}

// saveProvider takes a `provider <name> { <directives> }` block off the
// dispenser, whole, for FinalizeUnmarshalCaddyfile. What its first line
// gets wrong is refused here, with or without the adapter.
func (h *Handler) saveProvider(d *caddyfile.Dispenser) error {
	seg := d.NextSegment()
	if len(seg) < 2 || seg[1].Text == "{" {
		return d.Errf("usage: provider <name> { <handler directives> }")
	}
	name := seg[1].Text
	if len(seg) == 2 && d.Val() == "}" { // an empty block
		return wrapAt(seg[0], (&Provider{Name: name}).check(h.savedProviders()))
	}
	if len(seg) < 3 || seg[2].Text != "{" {
		return wrapAt(seg[0], fmt.Errorf("provider %s: expected a block of handler directives after the name", name))
	}
	h.adapting.providers = append(h.adapting.providers, seg)
	return nil
}

// savedProviders are the providers parsed so far and those saved to be
// parsed, by name alone: those a provider's name is held to.
func (h *Handler) savedProviders() []*Provider {
	earlier := slices.Clone(h.Providers)
	for _, seg := range h.adapting.providers {
		earlier = append(earlier, &Provider{Name: seg[1].Text})
	}
	return earlier
}

// parseProvider parses a saved provider block as a subroute of handler
// directives, ordered as in a site, once the provider's own lines
// (deduplicates, lookup) are taken out of it.
func (h *Handler) parseProvider(seg caddyfile.Segment, helper httpcaddyfile.Helper) error {
	name := seg[1].Text
	if err := checkProviderName(name, h.Providers); err != nil {
		return wrapAt(seg[0], err)
	}
	p := &Provider{Name: name}
	rest, own := providerLines(seg[2:], "deduplicates", "lookup")
	for _, line := range own {
		var err error
		if line[0].Text == "deduplicates" {
			err = p.parseDeduplicates(line)
		} else if p.Lookup != nil {
			err = wrapAt(line[0], fmt.Errorf("provider %s: lookup is given twice", name))
		} else {
			p.Lookup, err = parseLookup(line, name)
		}
		if err != nil {
			return err
		}
	}
	tokens := append(caddyfile.Segment{seg[0]}, rest...)
	sub, err := httpcaddyfile.ParseSegmentAsSubroute(helper.WithDispenser(caddyfile.NewDispenser(tokens)))
	if err != nil {
		return err
	}
	sr, ok := sub.(*caddyhttp.Subroute)
	if !ok {
		return fmt.Errorf("provider %s (line %d): unexpected handler %T", name, seg[0].Line, sub)
	}
	// The rule Provision applies to JSON, applied here too for the error's
	// file and line.
	if err := refuseResends(sr.Routes); err != nil {
		return wrapAt(resendToken(seg, err), fmt.Errorf("provider %s: %w", name, err))
	}
	p.Routes = sr.Routes
	if err := p.check(h.Providers); err != nil {
		return wrapAt(seg[0], err)
	}
	h.Providers = append(h.Providers, p)
	return nil
}

// parseDeduplicates reads a provider's deduplicates line:
//
//	deduplicates [<header>]
func (p *Provider) parseDeduplicates(line caddyfile.Segment) error {
	switch args := line[1:]; {
	case len(args) > 1:
		return wrapAt(line[0], fmt.Errorf("provider %s: usage: deduplicates [<header>]", p.Name))
	case len(args) == 0:
		p.Deduplicates = proxy.DefaultKeyHeader
	default:
		if err := checkHeaderName(args[0].Text); err != nil {
			return wrapAt(args[0], fmt.Errorf("provider %s: deduplicates: %w", p.Name, err))
		}
		p.Deduplicates = args[0].Text
	}
	return nil
}

// parseLookup reads a provider's lookup line and its block:
//
//	lookup <method> <uri> {
//		absent <status...>
//	}
func parseLookup(line caddyfile.Segment, provider string) (*LookupConfig, error) {
	d := caddyfile.NewDispenser(line)
	d.Next()
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Errf("provider %s: usage: lookup <method> <uri> { absent <status...> }", provider)
	}
	c := &LookupConfig{Method: args[0], URI: args[1]}
	for d.NextBlock(0) {
		if d.Val() != "absent" {
			return nil, d.Errf("provider %s: lookup: unknown option %q (want absent)", provider, d.Val())
		}
		codes := d.RemainingArgs()
		if len(codes) == 0 {
			return nil, d.Errf("provider %s: lookup: absent needs one status or more", provider)
		}
		for _, code := range codes {
			n, err := strconv.Atoi(code)
			if err != nil {
				return nil, d.Errf("provider %s: lookup: absent %q is not a status", provider, code)
			}
			c.Absent = append(c.Absent, n)
		}
	}
	if err := c.check(); err != nil {
		return nil, wrapAt(line[0], fmt.Errorf("provider %s: %w", provider, err))
	}
	return c, nil
}

// providerLines takes a provider's own lines (those starting with one of
// names, directly inside its block, each with the block it opens) out of
// block, the tokens from its opening brace to its closing one, before the
// rest is parsed as handler directives. It returns the rest and each
// line's tokens, in order.
//
// It counts braces itself rather than slice the block with the
// dispenser's NextBlock and NextSegment and join the other segments
// again: NextBlock steps over a closing brace that has another token after
// it on its line, so the joined segments would not always be the tokens
// written, and a block the adapter refuses in a handle or route block
// (an extra brace) would be accepted in a provider. Taken out here, the
// rest is the user's tokens, and the adapter judges them as it judges any
// subroute.
func providerLines(block caddyfile.Segment, names ...string) (rest caddyfile.Segment, own []caddyfile.Segment) {
	depth := 0
	for i := 0; i < len(block); i++ {
		tok := block[i]
		startsLine := i > 0 && (block[i-1].Line != tok.Line || block[i-1].File != tok.File)
		if depth == 1 && startsLine && slices.Contains(names, tok.Text) {
			// The line's tokens up to the provider's closing brace, with
			// the block the line opens, if it opens one.
			j, nest := i+1, 0
			for ; j < len(block); j++ {
				t := block[j]
				if nest == 0 && (t.Line != tok.Line || t.File != tok.File || t.Text == "}") {
					break
				}
				switch t.Text {
				case "{":
					nest++
				case "}":
					nest--
				}
			}
			own = append(own, block[i:j])
			i = j - 1
			continue
		}
		switch tok.Text {
		case "{":
			depth++
		case "}":
			depth--
		}
		rest = append(rest, tok)
	}
	return rest, own
}

// resendToken is where a refused reverse_proxy option is written in a
// provider's segment: the option's own line, else the provider's.
func resendToken(seg caddyfile.Segment, err error) caddyfile.Token {
	var re *resendError
	if errors.As(err, &re) {
		for _, tok := range seg[2:] {
			if tok.Text == re.Subdirective {
				return tok
			}
		}
	}
	return seg[0]
}

// wrapAt adds the token's file and line to err, as the dispenser does.
func wrapAt(tok caddyfile.Token, err error) error {
	d := caddyfile.NewDispenser(caddyfile.Segment{tok})
	d.Next()
	return d.WrapErr(err)
}

func (h *Handler) parseInFlight(d *caddyfile.Dispenser, args []string) error {
	if len(args) == 0 {
		return d.ArgErr()
	}
	reject, err := inFlightReject(args[0])
	switch {
	case err != nil || args[0] == "":
		return d.Errf("in_flight must be wait [<duration>] or reject, not %q", args[0])
	case reject && len(args) != 1, len(args) > 2:
		return d.ArgErr()
	case len(args) == 2:
		if h.InFlightWait, err = duration(d, "in_flight wait", args[1:]); err != nil {
			return err
		}
	}
	h.InFlight = args[0]
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
