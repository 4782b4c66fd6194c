package pgpool_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// direct are the packages that may still open pools or connections of
// their own, and which (nil: any): the test harness, this package, and the
// throwaway servers of tests and `harvest dev` (pgcluster, and devfleet's
// connections that administer its own server, creating and dropping
// databases; its workers' pools come from New).
var direct = map[string][]string{
	"internal/testsvc":   nil,
	"internal/pgpool":    nil,
	"internal/pgcluster": nil,
	"internal/devfleet":  {"Connect", "ConnectConfig"},
}

// Every pool and connection the product opens on a shard goes through
// New or Connect, so that none of them stays on a primary that turned
// read-only after a switchover. A pool opened with pgxpool or pgx
// directly in cmd/, internal/ or pkg/ fails this test.
func TestEveryPoolIsOpenedHere(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	var found []string
	for _, top := range []string{"cmd", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			allowed, listed := direct[filepath.ToSlash(rel)]
			if listed && allowed == nil {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			names := map[string]string{} // local name -> import path
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				name := p[strings.LastIndexByte(p, '/')+1:]
				if p == "github.com/jackc/pgx/v5" {
					name = "pgx"
				}
				if imp.Name != nil {
					name = imp.Name.Name
				}
				names[name] = p
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				switch names[pkg.Name] + "." + sel.Sel.Name {
				case "github.com/jackc/pgx/v5/pgxpool.New", "github.com/jackc/pgx/v5/pgxpool.NewWithConfig",
					"github.com/jackc/pgx/v5.Connect", "github.com/jackc/pgx/v5.ConnectConfig":
					if !slices.Contains(allowed, sel.Sel.Name) || names[pkg.Name] != "github.com/jackc/pgx/v5" {
						found = append(found, fset.Position(sel.Pos()).String()+": "+pkg.Name+"."+sel.Sel.Name)
					}
				}
				return true
			})
			return nil
		})
		require.NoError(t, err)
	}
	require.Empty(t, found, "open shard pools with pgpool.New and connections with pgpool.Connect")
}
