package sim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The simulator is pure: no goroutines, no locks, no clock, no I/O but the
// reader a trace comes from, and of kvpool only the cost model and the
// eviction policies.
func TestDeps(t *testing.T) {
	forbidden := map[string]bool{
		"sync": true, "sync/atomic": true, "os": true, "io/fs": true, "net": true,
		"net/http": true, "log": true, "log/slog": true, "unsafe": true, "runtime": true,
	}
	// time is imported for the eviction policies' time.Time arguments;
	// nothing may read the clock.
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true}
	allowed := map[string]bool{"github.com/kvpool/kvpool/transfer/cost": true, "github.com/kvpool/kvpool/eviction": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			std := !strings.Contains(strings.SplitN(path, "/", 2)[0], ".")
			if (!std && !allowed[path]) || forbidden[path] {
				t.Errorf("%s imports %q", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && clock[n.Sel.Name] {
					t.Errorf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
}
