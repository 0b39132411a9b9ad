package fingerprint

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// CanonicalJSON returns the canonical form of a JSON document, or false when
// body is not one valid UTF-8 JSON value without duplicate object keys,
// unpaired surrogate escapes, or more than maxDepth levels of nesting.
//
// The canonical form: object members sorted by key (compared as unescaped
// strings), no insignificant white space, strings with the fewest escapes
// (quote, backslash and control characters), numbers and literals as
// written. It is parsed by hand, in one pass with a few allocations: it
// runs for every request, replays included.
//
// It is not RFC 8785 (JCS), on purpose. JCS rewrites every number as the
// shortest form of the IEEE 754 double nearest to it, so an amount or an
// id past 2^53 (9007199254740993) or with more decimals than a double
// holds would get the fingerprint of a different number: two requests that
// differ only there would be one intent, and the second would get the
// first's answer. Here numbers are compared as written, every digit kept;
// the price is that 1, 1.0 and 1e0 are different documents (a mismatch,
// never a wrong replay). Keys are ordered by their UTF-8 bytes, where JCS
// uses UTF-16 code units; the two orders differ only for keys holding
// characters above U+FFFF.
func CanonicalJSON(body []byte) ([]byte, bool) {
	if !utf8.Valid(body) || loneSurrogate(body) {
		return nil, false
	}
	p := canonParsers.Get().(*canonParser)
	defer p.release()
	p.in, p.out = body, make([]byte, 0, len(body))
	p.space()
	if !p.value(0) {
		return nil, false
	}
	p.space()
	if p.i != len(p.in) {
		return nil, false // trailing data
	}
	return p.out, true
}

// canonParsers keep parsers whose stacks have grown, for the next
// document: a parser on the stack would not stay there (its methods
// recurse), and growing its stacks anew allocated more than the
// canonical form itself.
var canonParsers = sync.Pool{New: func() any { return new(canonParser) }}

// release empties p and puts it back in canonParsers, unless a large
// document left it holding more than a usual one needs.
func (p *canonParser) release() {
	const keep = 64 << 10 // bytes
	if cap(p.keys)+cap(p.scratch)+cap(p.members)*int(unsafe.Sizeof(member{})) > keep {
		return
	}
	*p = canonParser{keys: p.keys[:0], members: p.members[:0], scratch: p.scratch[:0]}
	canonParsers.Put(p)
}

// maxDepth bounds the nesting of a document that is canonicalized (the
// limit of encoding/json's own scanner): deeper documents are hashed raw, so
// that a body of brackets cannot make the recursion below take hundreds of
// megabytes of stack.
const maxDepth = 10000

// canonParser writes the canonical form of in[i:] to out. Object members
// are written in the order read, then put in key order if they were not
// already; keys holds the members' unescaped keys, members their spans,
// both shared by nested objects as stacks.
type canonParser struct {
	in      []byte
	i       int
	out     []byte
	keys    []byte
	members []member
	scratch []byte
}

// member is an object member written to out[start:end] ("key":value),
// whose unescaped key is keys[keyStart:keyEnd].
type member struct {
	start, end       int
	keyStart, keyEnd int
}

func (p *canonParser) space() {
	for p.i < len(p.in) {
		switch p.in[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses one value; depth counts the containers around it.
func (p *canonParser) value(depth int) bool {
	if p.i >= len(p.in) {
		return false
	}
	switch c := p.in[p.i]; {
	case c == '{':
		return depth < maxDepth && p.object(depth+1)
	case c == '[':
		return depth < maxDepth && p.array(depth+1)
	case c == '"':
		start := len(p.out)
		p.out = append(p.out, '"')
		out, ok := p.str(p.out)
		if !ok {
			return false
		}
		p.out = escapeInPlace(out, start+1)
		p.out = append(p.out, '"')
		return true
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return p.literal("true") || p.literal("false") || p.literal("null")
	}
}

func (p *canonParser) literal(word string) bool {
	if !bytes.HasPrefix(p.in[p.i:], []byte(word)) {
		return false
	}
	p.i += len(word)
	p.out = append(p.out, word...)
	return true
}

// number copies a number that follows JSON's grammar, as written.
func (p *canonParser) number() bool {
	start := p.i
	if p.in[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.in) && p.in[p.i] == '0':
		p.i++
	case p.digits() == 0:
		return false
	}
	if p.i < len(p.in) && p.in[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return false
		}
	}
	if p.i < len(p.in) && (p.in[p.i] == 'e' || p.in[p.i] == 'E') {
		p.i++
		if p.i < len(p.in) && (p.in[p.i] == '+' || p.in[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return false
		}
	}
	p.out = append(p.out, p.in[start:p.i]...)
	return true
}

func (p *canonParser) digits() int {
	start := p.i
	for p.i < len(p.in) && p.in[p.i] >= '0' && p.in[p.i] <= '9' {
		p.i++
	}
	return p.i - start
}

// str appends the unescaped contents of the string at in[i:] (which starts
// with its quote) to dst. The input is valid UTF-8 without lone surrogate
// escapes (checked up front).
func (p *canonParser) str(dst []byte) ([]byte, bool) {
	p.i++ // the opening quote
	for p.i < len(p.in) {
		// Copy the run of characters that need no work.
		start := p.i
		for p.i < len(p.in) && p.in[p.i] != '"' && p.in[p.i] != '\\' && p.in[p.i] >= 0x20 {
			p.i++
		}
		dst = append(dst, p.in[start:p.i]...)
		if p.i == len(p.in) {
			return nil, false
		}
		switch c := p.in[p.i]; {
		case c == '"':
			p.i++
			return dst, true
		case c < 0x20:
			return nil, false // control characters must be escaped
		}
		// An escape.
		if p.i+1 >= len(p.in) {
			return nil, false
		}
		esc := p.in[p.i+1]
		p.i += 2
		switch esc {
		case '"', '\\', '/':
			dst = append(dst, esc)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, false
			}
			if utf16.IsSurrogate(r) {
				// A high half followed by a low one (loneSurrogate
				// refused every other case).
				if p.i+2 > len(p.in) || p.in[p.i] != '\\' || p.in[p.i+1] != 'u' {
					return nil, false
				}
				p.i += 2
				lo, ok := p.hex4()
				if !ok {
					return nil, false
				}
				r = utf16.DecodeRune(r, lo)
			}
			dst = utf8.AppendRune(dst, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

func (p *canonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.in) {
		return 0, false
	}
	var r rune
	for _, c := range p.in[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// escapeInPlace rewrites b[from:], an unescaped string, with the minimal
// escapes of appendJSONString. Most strings need none and are left as is.
func escapeInPlace(b []byte, from int) []byte {
	n := from
	for n < len(b) && b[n] != '"' && b[n] != '\\' && b[n] >= 0x20 {
		n++
	}
	if n == len(b) {
		return b
	}
	raw := string(b[n:]) // appending to b[:n] overwrites it
	return appendEscaped(b[:n], raw)
}

func (p *canonParser) array(depth int) bool {
	p.i++ // [
	p.out = append(p.out, '[')
	p.space()
	if p.i < len(p.in) && p.in[p.i] == ']' {
		p.i++
		p.out = append(p.out, ']')
		return true
	}
	for {
		p.space()
		if !p.value(depth) {
			return false
		}
		p.space()
		if p.i >= len(p.in) {
			return false
		}
		switch p.in[p.i] {
		case ',':
			p.i++
			p.out = append(p.out, ',')
		case ']':
			p.i++
			p.out = append(p.out, ']')
			return true
		default:
			return false
		}
	}
}

func (p *canonParser) object(depth int) bool {
	p.i++ // {
	p.out = append(p.out, '{')
	p.space()
	if p.i < len(p.in) && p.in[p.i] == '}' {
		p.i++
		p.out = append(p.out, '}')
		return true
	}
	first, keysFrom := len(p.members), len(p.keys)
	defer func() { p.members, p.keys = p.members[:first], p.keys[:keysFrom] }()
	for {
		p.space()
		if p.i >= len(p.in) || p.in[p.i] != '"' {
			return false // object keys are strings
		}
		m := member{start: len(p.out), keyStart: len(p.keys)}
		keys, ok := p.str(p.keys)
		if !ok {
			return false
		}
		p.keys = keys
		m.keyEnd = len(p.keys)
		p.out = append(p.out, '"')
		p.out = appendEscaped(p.out, p.keys[m.keyStart:m.keyEnd])
		p.out = append(p.out, '"')
		p.out = append(p.out, ':')
		p.space()
		if p.i >= len(p.in) || p.in[p.i] != ':' {
			return false
		}
		p.i++
		p.space()
		if !p.value(depth) {
			return false
		}
		m.end = len(p.out)
		p.members = append(p.members, m)
		p.space()
		if p.i >= len(p.in) {
			return false
		}
		if p.in[p.i] == '}' {
			p.i++
			break
		}
		if p.in[p.i] != ',' {
			return false
		}
		p.i++
		p.out = append(p.out, ',')
	}
	if !p.sortMembers(p.members[first:]) {
		return false
	}
	p.out = append(p.out, '}')
	return true
}

// sortMembers puts the members, written to out in the order read with
// commas between them, in key order; it reports false on a duplicate key.
func (p *canonParser) sortMembers(ms []member) bool {
	key := func(m member) []byte { return p.keys[m.keyStart:m.keyEnd] }
	sorted := true
	for i := 1; i < len(ms); i++ {
		switch c := bytes.Compare(key(ms[i-1]), key(ms[i])); {
		case c == 0:
			return false
		case c > 0:
			sorted = false
		}
	}
	if sorted {
		return true
	}
	// The members in key order go after the object's own on the members
	// stack, which holds nothing past them.
	p.members = append(p.members, ms...)
	order := p.members[len(p.members)-len(ms):]
	slices.SortFunc(order, func(a, b member) int { return bytes.Compare(key(a), key(b)) })
	for i := 1; i < len(order); i++ {
		if bytes.Equal(key(order[i-1]), key(order[i])) {
			return false
		}
	}
	from := ms[0].start
	p.scratch = append(p.scratch[:0], p.out[from:]...)
	p.out = p.out[:from]
	for i, m := range order {
		if i > 0 {
			p.out = append(p.out, ',')
		}
		p.out = append(p.out, p.scratch[m.start-from:m.end-from]...)
	}
	return true
}

// loneSurrogate reports whether body escapes a UTF-16 surrogate that is not
// half of a pair (\ud800 alone). The decoder turns each into U+FFFD, so
// distinct strings would compare equal: such a body is hashed raw.
func loneSurrogate(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		switch u := codeUnit(body, i); {
		case u < 0: // a one-character escape: skip the escaped character
			i++
		case u >= 0xd800 && u < 0xdc00: // high: a low must follow
			if lo := codeUnit(body, i+6); lo < 0xdc00 || lo >= 0xe000 {
				return true
			}
			i += 11
		case u >= 0xdc00 && u < 0xe000:
			return true
		default:
			i += 5
		}
	}
	return false
}

// codeUnit returns the code unit of the \uXXXX escape at b[i:], or -1.
func codeUnit(b []byte, i int) int {
	if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
		return -1
	}
	n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
	if err != nil {
		return -1
	}
	return int(n)
}

// appendJSONString writes s as a JSON string with the minimal escapes:
// quote, backslash and control characters.
func appendJSONString(out []byte, s string) []byte {
	out = append(out, '"')
	out = appendEscaped(out, s)
	return append(out, '"')
}

func appendEscaped[T string | []byte](out []byte, s T) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c < 0x20:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			out = append(out, c)
		}
	}
	return out
}
