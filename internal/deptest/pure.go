package deptest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// CheckPure fails t for every non-test file in dir that breaks purity: an
// import outside the standard library and allowed, an import of a package
// that locks, does I/O or reaches the runtime (sync, os, net, log, unsafe,
// runtime, ...), a go statement, or a read of the clock (time.Now, Since,
// Sleep, timers). time's types stay allowed: pure code is passed times.
func CheckPure(t *testing.T, dir string, allowed ...string) {
	t.Helper()
	forbidden := map[string]bool{
		"sync": true, "sync/atomic": true, "os": true, "io/fs": true, "net": true,
		"net/http": true, "log": true, "log/slog": true, "unsafe": true, "runtime": true,
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
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
			if (!std && !slices.Contains(allowed, path)) || forbidden[path] {
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
