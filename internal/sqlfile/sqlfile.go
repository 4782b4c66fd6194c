package sqlfile

import (
	"fmt"
	"io/fs"
)

// Must returns the text of sql/<name>.sql in fsys. It panics when the file
// is missing, which can only be a build mistake; called in a package
// variable's initialiser, that panic comes at init (see the package doc).
func Must(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, "sql/"+name+".sql")
	if err != nil {
		panic(fmt.Sprintf("sqlfile: missing embedded query %s: %v", name, err))
	}
	return string(b)
}
