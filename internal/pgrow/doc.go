// Package pgrow reads rows of a statement into structs by column name.
//
// A row of more than one column is scanned by name: a small struct with
// `db:"column"` tags, read with pgx.RowToStructByName, so that a column
// added, dropped or moved in the SQL cannot land in the wrong field (the
// read fails instead, naming the column). A loop over rows is
// pgx.CollectRows; a statement that answers one row is One here, the
// by-name counterpart of QueryRow(...).Scan. A single value may still be
// read with QueryRow(...).Scan(&v): it has no position to get wrong.
package pgrow
