package pool

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// FuzzDataChannel sends arbitrary bytes to a node's data channel handler:
// it must never panic, never leave a reservation open after the connection
// ends, and keep its books balanced.
func FuzzDataChannel(f *testing.F) {
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k")}
	v := []byte("hello kv")
	f.Add(putFrame(k, uint64(len(v)), v, api.Checksum(v), wire.FlagChecksum))
	f.Add(append(putFrame(k, uint64(len(v)), v, 0, 0), wire.AppendRequest(nil, &wire.Request{Op: wire.OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})...))
	f.Add(putFrame(k, 3, v, 0, 0))
	f.Add(wire.AppendRequest(nil, &wire.Request{Op: wire.OpRemove, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}))
	f.Add(wire.AppendRequest(nil, &wire.Request{Op: wire.OpSink, ValueLen: 4}))
	f.Add(wire.AppendRequest(nil, &wire.Request{Op: wire.OpView, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}))

	cfg := TestConfig("fuzz", 1<<20)
	cfg.DisableShm = true
	cfg.MaxBlockBytes = 64 << 10
	n, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	defer n.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			n.data.serve(context.Background(), server, newSession())
			server.Close()
		}()
		go io.Copy(io.Discard, client)
		client.Write(in)
		client.Close()
		<-done
		if st := n.Store().Stats(); st.Reservations != 0 {
			t.Fatalf("%d reservations left open", st.Reservations)
		}
		if err := n.Store().Check(); err != nil {
			t.Fatal(err)
		}
	})
}
