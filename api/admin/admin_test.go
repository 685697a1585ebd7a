package admin

import (
	"encoding/json"
	"testing"
)

// TestBlockListJSON pins cluster blocks' --json shape: keys in hex, and an
// empty list as [] rather than null; and that it reads back.
func TestBlockListJSON(t *testing.T) {
	for _, c := range []struct {
		in   BlockList
		want string
	}{
		{BlockList{Node: "n1", Total: 0, Blocks: []BlockRef{}}, `{"node":"n1","total":0,"blocks":[]}`},
		{BlockList{Node: "n1", Total: 7, Blocks: []BlockRef{{Tenant: "acme", Namespace: "m", Key: HexKey{0x00, 0xff, 'k'}}}},
			`{"node":"n1","total":7,"blocks":[{"tenant":"acme","namespace":"m","key":"00ff6b"}]}`},
	} {
		b, err := json.Marshal(c.in)
		if err != nil || string(b) != c.want {
			t.Fatalf("json.Marshal(%+v) = %s, %v; want %s", c.in, b, err, c.want)
		}
		var back BlockList
		if err := json.Unmarshal(b, &back); err != nil || len(back.Blocks) != len(c.in.Blocks) ||
			(len(back.Blocks) > 0 && string(back.Blocks[0].Key) != string(c.in.Blocks[0].Key)) {
			t.Fatalf("round trip of %s = %+v, %v", b, back, err)
		}
	}
	var k HexKey
	if err := k.UnmarshalText([]byte("0g")); err == nil {
		t.Fatal("HexKey accepted 0g")
	}
}
