package cost

import (
	"os"
	"strings"
	"testing"
)

func TestParseDocument(t *testing.T) {
	yamlDoc := `models:
  - name: tiny
    layers: 2
    kv_heads: 1
    head_dim: 64
    dtype_bytes: 2
curves:
  - model: tiny
    accelerator: h200
    points: [{tokens: 1024, tokens_per_s: 50000}]
`
	doc, err := ParseDocument("tiny.yaml", []byte(yamlDoc))
	if err != nil {
		t.Fatal(err)
	}
	p := NewProfiles()
	if err := p.Add(doc); err != nil {
		t.Fatal(err)
	}
	m, err := p.Model("tiny")
	if err != nil || m.KVBytesPerToken() != 2*2*1*64*2 {
		t.Fatalf("model tiny: %+v %v", m, err)
	}
	if _, err := p.Curve("tiny", "h200"); err != nil {
		t.Fatal(err)
	}

	anchor, err := os.ReadFile("testdata/gpu-anchor-h200.json")
	if err != nil {
		t.Skip(err)
	}
	doc, err = ParseDocument("anchor", anchor)
	if err != nil || len(doc.Curves) == 0 || len(doc.Models) != 0 {
		t.Fatalf("anchor document: %d curves, %d models, %v", len(doc.Curves), len(doc.Models), err)
	}

	for name, bad := range map[string]string{
		"unknown key": "modelz: []\n",
		"not yaml":    "{[",
	} {
		if _, err := ParseDocument("bad.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if err := p.Add(Document{Models: []Model{{Name: ""}}}); err == nil {
		t.Error("Add accepted a model without a name")
	}
}
