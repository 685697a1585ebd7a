package pool

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// namedBlocks pins what the store holds for a caller the gate lets read
// the tenant, and each UnpinBlock lets go of its pin.
func TestNamedBlocksPinForCallersThatMayRead(t *testing.T) {
	st := store.New(store.Config{CapacityBytes: 1 << 20, PageBytes: 4 << 10}, time.Now, make([]byte, 1<<20), nil)
	value := bytes.Repeat([]byte("kv"), 5000)
	if _, err := st.PutBytes([]byte("acme"), []byte("llama"), []byte("k1"), value, 0, false); err != nil {
		t.Fatal(err)
	}
	secured := &gatekeeper{}
	node := auth.Identity{Role: auth.RoleNode, Name: "node-1"}
	acme := auth.Identity{Role: auth.RoleTenant, Tenant: "acme", Name: "acme"}
	globex := auth.Identity{Role: auth.RoleTenant, Tenant: "globex", Name: "globex"}
	name := transfer.BlockName{Tenant: []byte("acme"), Namespace: []byte("llama"), Key: []byte("k1")}
	for _, tc := range []struct {
		what   string
		gate   *gatekeeper
		caller auth.Identity
		name   transfer.BlockName
		want   error
	}{
		{"a node", secured, node, name, nil},
		{"the tenant itself", secured, acme, name, nil},
		{"another tenant", secured, globex, name, api.ErrPermissionDenied},
		{"anyone, on an open node", &gatekeeper{open: true}, auth.Identity{Role: auth.RoleAnonymous}, name, nil},
		{"anyone, with no gate", nil, auth.Identity{}, name, nil},
		{"a block the store lacks", secured, node, transfer.BlockName{Tenant: []byte("acme"), Namespace: []byte("llama"), Key: []byte("k2")}, api.ErrNotFound},
	} {
		t.Run(tc.what, func(t *testing.T) {
			src := &namedBlocks{store: st, gate: tc.gate, caller: tc.caller}
			pin, err := src.PinBlock(tc.name)
			if !errors.Is(err, tc.want) {
				t.Fatalf("PinBlock: %v, want %v", err, tc.want)
			}
			if err != nil {
				if n := st.Stats().Pins; n != 0 {
					t.Fatalf("a refused read left %d pins", n)
				}
				return
			}
			if !bytes.Equal(pin.Mem, value) || pin.CRC != api.Checksum(value) {
				t.Fatalf("pinned %d bytes, crc %#x; want the block's %d bytes and %#x", len(pin.Mem), pin.CRC, len(value), api.Checksum(value))
			}
			if n := st.Stats().Pins; n != 1 {
				t.Fatalf("%d pins while the block is sent, want 1", n)
			}
			src.UnpinBlock(pin)
			if n := st.Stats().Pins; n != 0 {
				t.Fatalf("%d pins after UnpinBlock, want 0", n)
			}
		})
	}
}
