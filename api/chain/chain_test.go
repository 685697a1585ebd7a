package chain

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvpool/kvpool/api"
)

// chainVectors is api/testdata/chain_vectors.json, the test vectors the
// Python client's tests check too; its comment says where they come from.
type chainVectors struct {
	Comment []string `json:"comment"`
	Vectors []struct {
		Name        string   `json:"name"`
		Scheme      string   `json:"scheme"`
		Seed        string   `json:"seed"`
		BlockTokens int      `json:"block_tokens"`
		Tokens      []uint32 `json:"tokens"`
		Extra       []any    `json:"extra"`
		Keys        []string `json:"keys"`
	} `json:"vectors"`
	Roots []struct {
		Scheme string `json:"scheme"`
		Seed   string `json:"seed"`
		Root   string `json:"root"`
	} `json:"roots"`
}

func loadChainVectors(t *testing.T) chainVectors {
	t.Helper()
	b, err := os.ReadFile("../testdata/chain_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	var v chainVectors
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// vectorExtra turns a JSON extra value into what Config.Extra returns:
// strings, ints, nil, []any (tuples) and {"bytes": hex} as []byte.
func vectorExtra(v any) (any, error) {
	switch x := v.(type) {
	case nil, string:
		return x, nil
	case json.Number:
		n, err := x.Int64()
		return int(n), err
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			var err error
			if out[i], err = vectorExtra(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	case map[string]any:
		if h, ok := x["bytes"].(string); ok && len(x) == 1 {
			return hex.DecodeString(h)
		}
	}
	return nil, fmt.Errorf("bad extra value %v", v)
}

func TestChainVectors(t *testing.T) {
	vs := loadChainVectors(t)
	if len(vs.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vs.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			scheme, err := ParseScheme(v.Scheme)
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{Scheme: scheme, BlockTokens: v.BlockTokens, Seed: v.Seed}
			if v.Extra != nil {
				if len(v.Extra) != len(v.Keys) {
					t.Fatalf("%d extras for %d keys", len(v.Extra), len(v.Keys))
				}
				extra := make([][]any, len(v.Extra))
				for i, e := range v.Extra {
					x, err := vectorExtra(e)
					if err != nil {
						t.Fatal(err)
					}
					if x != nil {
						extra[i] = x.([]any)
					}
				}
				cfg.Extra = func(i int) []any { return extra[i] }
			}
			keys, err := Keys(cfg, v.Tokens)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != len(v.Keys) {
				t.Fatalf("got %d keys, want %d", len(keys), len(v.Keys))
			}
			for i, k := range keys {
				if got := hex.EncodeToString(k); got != v.Keys[i] {
					t.Errorf("key %d = %s, want %s", i, got, v.Keys[i])
				}
			}
		})
	}
}

func TestChainRoots(t *testing.T) {
	vs := loadChainVectors(t)
	if len(vs.Roots) == 0 {
		t.Fatal("no roots")
	}
	for _, r := range vs.Roots {
		scheme, err := ParseScheme(r.Scheme)
		if err != nil {
			t.Fatal(err)
		}
		root, err := chainRoot(Config{Scheme: scheme, Seed: r.Seed})
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(root); got != r.Root {
			t.Errorf("%s root(%q) = %s, want %s", r.Scheme, r.Seed, got, r.Root)
		}
	}
}

func TestChainKeysNameTheirPrefix(t *testing.T) {
	for _, scheme := range []Scheme{SHA256, SHA256CBOR} {
		t.Run(scheme.String(), func(t *testing.T) {
			cfg := Config{Scheme: scheme, BlockTokens: 4, Seed: "s"}
			a, _ := Keys(cfg, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
			b, _ := Keys(cfg, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99})
			c, _ := Keys(cfg, []uint32{0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
			other, _ := Keys(Config{Scheme: scheme, BlockTokens: 4, Seed: "t"}, []uint32{1, 2, 3, 4})
			if len(a) != 3 {
				t.Fatalf("got %d keys, want 3", len(a))
			}
			if string(a[0]) != string(b[0]) || string(a[1]) != string(b[1]) || string(a[2]) == string(b[2]) {
				t.Error("a change in block 2 must change key 2 and nothing before it")
			}
			for i := range a {
				if string(a[i]) == string(c[i]) {
					t.Errorf("a change in block 0 must change key %d", i)
				}
			}
			if string(other[0]) == string(a[0]) {
				t.Error("a different seed must give different keys")
			}
			ea, _ := Keys(Config{Scheme: scheme, BlockTokens: 4, Seed: "s", Extra: func(int) []any { return []any{"lora"} }}, []uint32{1, 2, 3, 4})
			if string(ea[0]) == string(a[0]) {
				t.Error("extra keys must change the key")
			}
		})
	}
}

// A chain continued after a known key is the same chain: an engine's
// event for blocks stored under a parent gives the keys Keys gives for
// the whole prompt.
func TestKeysAfterContinuesAChain(t *testing.T) {
	for _, scheme := range []Scheme{SHA256, SHA256CBOR} {
		cfg := Config{Scheme: scheme, BlockTokens: 4, Seed: "s"}
		tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
		whole, err := Keys(cfg, tokens)
		if err != nil {
			t.Fatal(err)
		}
		tail, err := KeysAfter(cfg, whole[0], tokens[4:])
		if err != nil {
			t.Fatal(err)
		}
		if len(tail) != 2 || string(tail[0]) != string(whole[1]) || string(tail[1]) != string(whole[2]) {
			t.Errorf("%v: the chain after block 0 differs from the whole chain's", scheme)
		}
	}
	if _, err := KeysAfter(Config{BlockTokens: 4}, []byte("k"), []uint32{1, 2, 3, 4}); err == nil {
		t.Error("continued a chain with no scheme")
	}
}

func TestChainKeysRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Scheme: SHA256, BlockTokens: 0},
		{Scheme: schemeInvalid, BlockTokens: 16},
		{Scheme: SHA256CBOR, BlockTokens: 1, Extra: func(int) []any { return []any{1.5} }},
	} {
		if _, err := Keys(cfg, []uint32{1, 2}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Keys(%+v) = %v, want api.ErrInvalidArgument", cfg, err)
		}
	}
}

func BenchmarkChainKeys(b *testing.B) {
	tokens := make([]uint32, 16*128)
	for i := range tokens {
		tokens[i] = uint32(i * 7919 % 128256)
	}
	for _, scheme := range []Scheme{SHA256, SHA256CBOR} {
		b.Run(scheme.String(), func(b *testing.B) {
			b.SetBytes(int64(len(tokens) * 4))
			for b.Loop() {
				if _, err := Keys(Config{Scheme: scheme, BlockTokens: 16, Seed: "0"}, tokens); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestReadTokens(t *testing.T) {
	got, err := ReadTokens(strings.NewReader("1 2,3\n4\t5\r\n"))
	if err != nil || len(got) != 5 || got[4] != 5 {
		t.Fatalf("ReadTokens = %v, %v", got, err)
	}
	for _, bad := range []string{"1 -2", "x", "4294967296"} {
		if _, err := ReadTokens(strings.NewReader(bad)); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("ReadTokens(%q): %v, want ErrInvalidArgument", bad, err)
		}
	}
}
