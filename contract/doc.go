// Package contract checks a provider's answer against a route's output
// contract: the statuses it applies to, a content type, a JSON Schema (of
// the body, or of one member of it, such as a model's message), and a
// GraphQL schema that the answer must fit for the client's own operation.
// A streamed model answer (text/event-stream) is assembled into the
// document it stands for before it is checked (AssembleStream).
//
// A broken rule is a *Breach: the gateway never stores it as a result, and
// failover treats it as failover_on says. The package knows nothing of
// storage, of attempts or of Caddy.
package contract
