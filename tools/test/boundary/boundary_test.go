package boundary

import (
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/tools/go/packages"
)

const module = "github.com/harvest-run/harvest"

// repoRoot is the main module's directory, three levels up from this
// package (tools/test/boundary). The checks run there, so that they see
// the product's packages as its own go.mod resolves them, not as a
// dependency of the tools module.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok, "the test knows its own source file")
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(mod), "module "+module+"\n"), "%s is the main module's directory", root)
	return root
}

// internalIn reports the first named type of an internal package that t
// mentions, looking through pointers, slices, maps, channels, functions,
// the fields of struct literals and type arguments.
func internalIn(t types.Type, seen map[types.Type]bool) string {
	if seen[t] {
		return ""
	}
	seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		if obj := t.Obj(); obj.Pkg() != nil && isInternal(obj.Pkg().Path()) {
			return obj.Pkg().Path() + "." + obj.Name()
		}
		if args := t.TypeArgs(); args != nil {
			for i := range args.Len() {
				if s := internalIn(args.At(i), seen); s != "" {
					return s
				}
			}
		}
		return ""
	case *types.Alias:
		if obj := t.Obj(); obj.Pkg() != nil && isInternal(obj.Pkg().Path()) {
			return obj.Pkg().Path() + "." + obj.Name()
		}
		return internalIn(types.Unalias(t), seen)
	case *types.Pointer:
		return internalIn(t.Elem(), seen)
	case *types.Slice:
		return internalIn(t.Elem(), seen)
	case *types.Array:
		return internalIn(t.Elem(), seen)
	case *types.Chan:
		return internalIn(t.Elem(), seen)
	case *types.Map:
		if s := internalIn(t.Key(), seen); s != "" {
			return s
		}
		return internalIn(t.Elem(), seen)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for v := range tup.Variables() {
				if s := internalIn(v.Type(), seen); s != "" {
					return s
				}
			}
		}
		return ""
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() || f.Embedded() {
				if s := internalIn(f.Type(), seen); s != "" {
					return s
				}
			}
		}
		return ""
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				if s := internalIn(m.Type(), seen); s != "" {
					return s
				}
			}
		}
		for e := range t.EmbeddedTypes() {
			if s := internalIn(e, seen); s != "" {
				return s
			}
		}
		return ""
	}
	return ""
}

// isInternal reports a package of this module that others cannot import.
func isInternal(path string) bool {
	return strings.HasPrefix(path, module) && strings.Contains(path+"/", "/internal/")
}

// No exported identifier of a pkg/ package (its type, a field or method
// of an exported type, a function's parameters and results) names a type
// of an internal package, under its own name or through an alias.
func TestPublicPackagesNameNoInternalType(t *testing.T) {
	// The packages are loaded by a go list child process, whose reads the
	// test cache does not see: stat the sources here so that a change to
	// any of them runs the test again.
	root := repoRoot(t)
	require.NoError(t, filepath.WalkDir(filepath.Join(root, "pkg"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			_, err = os.Stat(path)
		}
		return err
	}))
	cfg := &packages.Config{Dir: root, Mode: packages.NeedName | packages.NeedTypes | packages.NeedImports | packages.NeedDeps}
	pkgs, err := packages.Load(cfg, module+"/pkg/...")
	require.NoError(t, err)
	require.NotEmpty(t, pkgs)
	checked := 0
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("%s: %v", p.PkgPath, e)
		}
		if strings.Contains(p.PkgPath, "/cmd/") {
			continue // commands export nothing
		}
		scope := p.Types.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			checked++
			where := p.PkgPath + "." + name
			if s := internalIn(obj.Type(), map[types.Type]bool{}); s != "" {
				t.Errorf("%s names %s", where, s)
			}
			// An exported type's definition (its exported fields and
			// methods), and its methods on the value and the pointer.
			if tn, ok := obj.(*types.TypeName); ok {
				if s := internalIn(tn.Type().Underlying(), map[types.Type]bool{}); s != "" {
					t.Errorf("%s names %s", where, s)
				}
				for _, recv := range []types.Type{tn.Type(), types.NewPointer(tn.Type())} {
					ms := types.NewMethodSet(recv)
					for sel := range ms.Methods() {
						if !sel.Obj().Exported() {
							continue
						}
						if s := internalIn(sel.Type(), map[types.Type]bool{}); s != "" {
							t.Errorf("%s.%s names %s", where, sel.Obj().Name(), s)
						}
					}
				}
			}
		}
	}
	require.Greater(t, checked, 100, "the exported identifiers were found")
}
