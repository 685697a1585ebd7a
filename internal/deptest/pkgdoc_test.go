package deptest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEveryPackageHasOneDoc: every package of the module says what it is
// in exactly one package comment (a second one drifts out of date; none
// leaves a newcomer guessing). Generated code is exempt.
func TestEveryPackageHasOneDoc(t *testing.T) {
	out, err := exec.Command(GoTool(), "list", "-f", "{{.ImportPath}} {{.Dir}}", "github.com/kvpool/kvpool/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, _ := strings.Cut(line, " ")
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		hasCode := slices.ContainsFunc(files, func(f string) bool { return !strings.HasSuffix(f, "_test.go") })
		var docs []string
		generated := hasCode
		for _, f := range files {
			if hasCode == strings.HasSuffix(f, "_test.go") {
				continue // a package's comment is on its code; a test-only package's on its tests
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if !ast.IsGenerated(file) {
				generated = false
			}
			if file.Doc != nil {
				docs = append(docs, filepath.Base(f))
			}
		}
		switch {
		case hasCode && generated:
		case len(docs) != 1:
			t.Errorf("%s has %d package comments (%s); want one", pkg, len(docs), strings.Join(docs, ", "))
		}
	}
}
