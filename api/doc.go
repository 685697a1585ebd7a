// Package api is what an inference engine embeds to use kvpool: block keys
// and their validation, prefix-chain key hashing (including vLLM's
// sha256_cbor scheme), the value checksum, the sentinel errors every layer
// shares with their single mapping to gRPC codes, and the Go Client.
//
// The generated gRPC stubs live in api/kvpool/v1; the framed data-channel
// protocol lives in api/wire.
//
// A Client picks the fastest path to a node on its own: the shared-memory
// segment when the node runs on the same host, the framed TCP data channel
// otherwise, and plain gRPC for control calls:
//
//	c, err := api.Dial(ctx, api.ClientConfig{Server: "127.0.0.1:7070"})
//	if err != nil { ... }
//	defer c.Close()
//	k := api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: chain[0]}
//	if err := c.Put(ctx, k, kv); err != nil { ... }
//	n, err := c.Get(ctx, k, buf) // buf[:n] holds the block
package api
