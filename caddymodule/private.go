package caddymodule

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/onejob/onejob/ledger/sealed"
)

// EncryptionConfig seals the stored answers of a handler's ledger (and of
// its replay cache) at rest: each answer's headers and body are encrypted
// with AES-256-GCM before they reach the ledger, and opened on every read.
// Statuses, sizes and the jobs' other fields (hashes, states, attempts,
// times) stay readable, so the admin API, the jobs page and the sweeper
// need no key. Answers stored in clear before encryption was turned on
// are still replayed.
//
// Encryption belongs to the handler, not to the ledger module, because
// the handler is where the ledger, its cache and the owner secret meet:
// the answers are sealed before the cache sees them, and handlers of
// several sites may share one ledger. Handlers that share a ledger should
// share its keys; the admin API seals an operator's answer with the keys
// of the first handler that configured any for that ledger.
type EncryptionConfig struct {
	// The keys, each with an id that every sealed answer carries. The
	// first one seals new answers; every one opens the answers that name
	// it. To rotate, put a new key first and keep the old ones until the
	// answers sealed with them are past retention.
	Keys []EncryptionKey `json:"keys,omitempty"`
}

// EncryptionKey is one of the keys of a handler's encryption.
type EncryptionKey struct {
	// Names the key in every answer it seals: 1 to 64 letters, digits,
	// '-', '_' or '.'; never reuse an id for another key.
	ID string `json:"id,omitempty"`
	// The standard base64 of 32 random bytes (openssl rand -base64 32).
	// Placeholders are expanded, so that the key can stay out of the
	// config: {env.ONEJOB_KEY}, {file./run/secrets/onejob_key}.
	Key string `json:"key,omitempty"`
}

// keyring expands and parses the keys.
func (c *EncryptionConfig) keyring() (*sealed.Keyring, error) {
	if len(c.Keys) == 0 {
		return nil, errors.New("encryption: needs at least one key")
	}
	repl := caddy.NewReplacer()
	keys := make([]sealed.Key, len(c.Keys))
	for i, k := range c.Keys {
		secret := repl.ReplaceAll(k.Key, "")
		if secret == "" {
			return nil, fmt.Errorf("encryption: key %q is empty (is its placeholder set?)", k.ID)
		}
		var err error
		if keys[i], err = sealed.ParseKey(k.ID, secret); err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
	}
	ring, err := sealed.NewKeyring(keys...)
	if err != nil {
		return nil, fmt.Errorf("encryption: %w", err)
	}
	return ring, nil
}

// parseEncryption reads the block of "encryption { key <id> <key> ... }".
// A key given literally is checked here, with its file and line; one given
// by a placeholder is checked at provisioning.
func (h *Handler) parseEncryption(d *caddyfile.Dispenser, args []string) error {
	if len(args) != 0 {
		return d.Errf("usage: encryption { key <id> <base64 key> ... }")
	}
	c := &EncryptionConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "key" {
			return d.Errf("encryption: unknown %q, want key <id> <base64 key>", d.Val())
		}
		kargs := d.RemainingArgs()
		if len(kargs) != 2 {
			return d.Errf("usage: key <id> <base64 key>")
		}
		id, key := kargs[0], kargs[1]
		for _, k := range c.Keys {
			if k.ID == id {
				return d.Errf("encryption: key id %q is given twice", id)
			}
		}
		if !hasPlaceholder(key) {
			if _, err := sealed.ParseKey(id, key); err != nil {
				return d.Errf("encryption: %v", err)
			}
		} else if _, err := sealed.ParseKey(id, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="); err != nil {
			return d.Errf("encryption: %v", err) // the id alone
		}
		c.Keys = append(c.Keys, EncryptionKey{ID: id, Key: key})
	}
	if len(c.Keys) == 0 {
		return d.Errf("encryption: needs at least one key <id> <base64 key>")
	}
	h.Encryption = c
	return nil
}

// hasPlaceholder reports whether s holds a {placeholder}.
func hasPlaceholder(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '{' {
			for j := i + 1; j < len(s); j++ {
				if s[j] == '}' {
					return true
				}
			}
		}
	}
	return false
}
