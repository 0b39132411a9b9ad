// Package fingerprint computes what identifies a request's intent beside
// its owner and key: a SHA-256 over a versioned encoding of the method,
// the URI, the configured headers and the body, the body taken as
// canonical JSON (or the members a Selection names), a normalized
// GraphQL-over-HTTP request, or raw bytes.
//
// A job records its fingerprint with the encoding's version and scheme,
// so a retry is fingerprinted as its job was (Fingerprinter.ForJob) even
// after the configuration changed. The encodings never change within a
// version: the golden tests hold them.
package fingerprint
