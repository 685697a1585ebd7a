package api

import (
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	long := strings.Repeat("a", MaxNameBytes+1)
	tests := []struct {
		name string
		k    BlockKey
		ok   bool
	}{
		{"plain", BlockKey{"acme", "llama3-8b.bf16_tp0", []byte{0}}, true},
		{"max key", BlockKey{"a", "b", make([]byte, MaxKeyBytes)}, true},
		{"max names", BlockKey{long[:MaxNameBytes], long[:MaxNameBytes], []byte("k")}, true},
		{"empty key", BlockKey{"a", "b", nil}, false},
		{"long key", BlockKey{"a", "b", make([]byte, MaxKeyBytes+1)}, false},
		{"empty tenant", BlockKey{"", "b", []byte("k")}, false},
		{"long tenant", BlockKey{long, "b", []byte("k")}, false},
		{"slash", BlockKey{"a/b", "b", []byte("k")}, false},
		{"nul", BlockKey{"a", "b\x00", []byte("k")}, false},
		{"colon", BlockKey{"a", "b:c", []byte("k")}, false},
	}
	for _, tt := range tests {
		err := tt.k.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	// All problems are reported, not just the first.
	err := BlockKey{"a b", "", nil}.Validate()
	for _, want := range []string{"tenant", "namespace", "key is empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"", "a", "acme-1.b_c", "a/b", "é", strings.Repeat("x", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateName("tenant", s)
		want := len(s) >= 1 && len(s) <= MaxNameBytes
		for _, c := range []byte(s) {
			want = want && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-')
		}
		if (err == nil) != want {
			t.Fatalf("ValidateName(%q) = %v, want ok=%v", s, err, want)
		}
	})
}

func TestCodeTableRoundTrips(t *testing.T) {
	for _, e := range codeTable {
		err := Errorf(e.err, "context %d", 1)
		if Code(err) != e.code {
			t.Errorf("Code(%v) = %v, want %v", err, Code(err), e.code)
		}
		back := FromStatus(ToStatus(err))
		if !errors.Is(back, e.err) {
			t.Errorf("FromStatus(ToStatus(%v)) = %v, does not wrap the sentinel", err, back)
		}
		if back.Error() != err.Error() {
			t.Errorf("message changed: %q -> %q", err.Error(), back.Error())
		}
	}
	if Code(errors.New("surprise")).String() != "Internal" {
		t.Error("unknown errors must map to Internal")
	}
}
