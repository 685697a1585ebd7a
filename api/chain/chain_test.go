package chain

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/kvpool/kvpool/api"
)

// The vectors below were computed with Python's cbor2 5.4.6 and hashlib,
// following vLLM's hash_block_tokens and init_none_hash exactly:
//
//	def sha256_cbor(x): return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
//	parent = sha256_cbor(seed)                      # NONE_HASH, seed = PYTHONHASHSEED
//	parent = sha256_cbor((parent, tuple(block), extra))  # per full block
//
// The tokens include values whose CBOR heads take 1, 2, 3 and 5 bytes.
var vllmTokens = []uint32{
	1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
	100000, 128255, 7, 300, 65536, 70000, 23, 24, 255, 256, 65535, 0, 1, 2, 3, 4,
	9, 9, 9, // a partial block: no key
}

func TestChainSHA256CBORMatchesVLLM(t *testing.T) {
	tests := []struct {
		name  string
		seed  string
		extra []([]any)
		want  []string
	}{
		{
			name:  "seed 0, no extra keys",
			seed:  "0",
			extra: [][]any{nil, nil},
			want: []string{
				"202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea",
				"893bad6e19316ccd7ff4dc2737be044e117993994c1d8506e564434b59876138",
			},
		},
		{
			name: "seed 42, lora, salt, multimodal, negative int and bytes",
			seed: "42",
			extra: [][]any{
				{"my-lora", "salt-1"},
				{"my-lora", []any{"img-hash", 3}, -2, []byte{1, 2}},
			},
			want: []string{
				"b13a41edc3cb9e41119ad53a0342878669d95434232c6970b9b2fb28b17cffe7",
				"72be2a89756e76f7f24be807a2884e1d9a37805197ba6e5b5fcef426f757ed5e",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := Keys(Config{
				Scheme:      SHA256CBOR,
				BlockTokens: 16,
				Seed:        tt.seed,
				Extra:       func(i int) []any { return tt.extra[i] },
			}, vllmTokens)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != len(tt.want) {
				t.Fatalf("got %d keys, want %d", len(keys), len(tt.want))
			}
			for i, k := range keys {
				if got := hex.EncodeToString(k); got != tt.want[i] {
					t.Errorf("key %d = %s, want %s", i, got, tt.want[i])
				}
			}
		})
	}
}

func TestChainRootMatchesVLLMNoneHash(t *testing.T) {
	root, err := chainRoot(Config{Scheme: SHA256CBOR, Seed: "0"})
	if err != nil {
		t.Fatal(err)
	}
	const want = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
	if got := hex.EncodeToString(root); got != want {
		t.Fatalf("NONE_HASH(\"0\") = %s, want %s", got, want)
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

// TestChainSHA256Vector pins kvpool's own scheme so it never changes by
// accident: stored keys depend on it. The vector was reproduced in Python:
//
//	p = sha256(b"kvpool/chain/v1" + b"0")
//	p = sha256(p + pack("<I", 16) + pack("<16I", *block) + pack("<I", 0))
func TestChainSHA256Vector(t *testing.T) {
	keys, err := Keys(Config{Scheme: SHA256, BlockTokens: 16, Seed: "0"}, vllmTokens)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{hex.EncodeToString(keys[0]), hex.EncodeToString(keys[1])}
	want := []string{chainSHA256Vector0, chainSHA256Vector1}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("key %d = %s, want %s", i, got[i], want[i])
		}
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

const (
	chainSHA256Vector0 = "926526b3a230256e5e3fb4fcf006d8f0e4e72ffc89a8774a8fea2146646731b4"
	chainSHA256Vector1 = "366e7a3d72fd721621af4ab4b29c215f58782004af66a583adb98f1185926478"
)

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
