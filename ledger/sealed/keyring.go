package sealed

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// KeySize is the length of a key: AES-256.
const KeySize = 32

// maxIDLen bounds a key id, which every sealed value carries.
const maxIDLen = 64

// Key is one key of a Keyring: its id, stored with every value it seals,
// and its 32 bytes.
type Key struct {
	ID     string
	Secret []byte
}

// ParseKey returns the key id whose secret is the standard base64 (with
// or without padding) of 32 bytes.
func ParseKey(id, secret string) (Key, error) {
	if err := checkID(id); err != nil {
		return Key{}, err
	}
	s := strings.TrimRight(strings.TrimSpace(secret), "=")
	b, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil {
		return Key{}, fmt.Errorf("key %q is not base64: %v", id, err)
	}
	if len(b) != KeySize {
		return Key{}, fmt.Errorf("key %q is %d bytes, want %d (openssl rand -base64 32)", id, len(b), KeySize)
	}
	return Key{ID: id, Secret: b}, nil
}

// checkID refuses a key id that is empty, longer than 64 bytes, or holds
// anything but ASCII letters, digits, '-', '_' and '.'.
func checkID(id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("key id %q: want 1 to %d characters", id, maxIDLen)
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("key id %q: want letters, digits, '-', '_' or '.'", id)
		}
	}
	return nil
}

// Keyring seals with its first key and opens with any of its keys, chosen
// by the id a sealed value carries: to rotate, put the new key first and
// keep the old ones for as long as answers sealed with them are retained.
type Keyring struct {
	sealID string
	aeads  map[string]cipher.AEAD
}

// NewKeyring returns the keyring of keys, the first of which seals. Ids
// must be distinct.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	k := &Keyring{sealID: keys[0].ID, aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, key := range keys {
		if err := checkID(key.ID); err != nil {
			return nil, err
		}
		if _, dup := k.aeads[key.ID]; dup {
			return nil, fmt.Errorf("key id %q is given twice", key.ID)
		}
		if len(key.Secret) != KeySize {
			return nil, fmt.Errorf("key %q is %d bytes, want %d", key.ID, len(key.Secret), KeySize)
		}
		block, err := aes.NewCipher(key.Secret)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		k.aeads[key.ID] = aead
	}
	return k, nil
}

// SealID is the id of the key that seals.
func (k *Keyring) SealID() string { return k.sealID }

// ErrUnknownKey: a value was sealed with a key the keyring does not hold.
var ErrUnknownKey = errors.New("sealed: the key that sealed this answer is not configured")

// ErrOpen: a sealed value does not open (altered, or moved from another
// job or part).
var ErrOpen = errors.New("sealed: the stored answer does not open: altered, or sealed for another job")

// seal returns nonce | ciphertext | tag of plain under the sealing key,
// bound to aad.
func (k *Keyring) seal(plain, aad []byte) []byte {
	aead := k.aeads[k.sealID]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return aead.Seal(out, out, plain, aad)
}

// open reverses seal for the key id.
func (k *Keyring) open(id string, sealed, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w (key id %q)", ErrUnknownKey, id)
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, ErrOpen
	}
	n := aead.NonceSize()
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], aad)
	if err != nil {
		return nil, ErrOpen
	}
	return plain, nil
}
