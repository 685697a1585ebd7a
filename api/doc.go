// Package api is what an inference engine embeds to use kvpool: the Go
// Client, block keys and their validation, the value checksum, and the
// sentinel errors every layer shares with their single mapping to gRPC
// codes. Prefix-chain keys are computed by api/chain (including vLLM's
// sha256_cbor scheme); the generated gRPC stubs live in api/kvpool/v1 and
// the framed data-channel protocol in api/wire.
//
// A Client moves block bytes over the fastest path to its node, chosen
// once at Dial: the shared-memory segment when the node runs on the same
// host, the framed TCP data channel otherwise, plain gRPC when asked.
// Control calls (Locate, Fetch, Plan, ...) are gRPC; Admin has the
// operator's calls:
//
//	c, err := api.Dial(ctx, api.ClientConfig{Server: "127.0.0.1:7070"})
//	if err != nil { ... }
//	defer c.Close()
//	keys, err := chain.Keys(chain.Config{Scheme: chain.SHA256CBOR, BlockTokens: 16, Seed: "0"}, tokens)
//	k := api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[0]}
//	if err := c.Put(ctx, k, kv); err != nil { ... }
//	n, err := c.Get(ctx, k, buf) // buf[:n] holds the block
package api
