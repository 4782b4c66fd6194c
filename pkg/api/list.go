package api

import "encoding/json"

// RunList is a page of a tenant's runs, newest first: the answer of
// GET /v1/runs.
//
// A listing leaves out each run's output, which is as large as a workflow
// makes it (an echo of a start's input is up to a megabyte): the key is
// absent from every listed run, and GET /v1/runs/{id} gives it. A page is
// also bounded in bytes besides its limit: it may end with fewer runs than
// asked and a NextCursor (docs/api.md).
type RunList struct {
	Runs []Run `json:"runs"`
	// NextCursor fetches the next page when passed as ?cursor=; it is
	// absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// listedRun is a Run as a listing shows it. Its Output is shallower than
// the embedded Run's, so it is the one encoding/json writes: always empty,
// and omitted.
type listedRun struct {
	Run
	Output json.RawMessage `json:"output,omitempty"`
}

// ListItem is what a listing writes of r: every field of the Run resource
// but output, whose key is absent.
func ListItem(r Run) any { return listedRun{Run: r} }

// MarshalJSON writes the page with each run as ListItem shows it.
func (l RunList) MarshalJSON() ([]byte, error) {
	items := make([]listedRun, len(l.Runs))
	for i, r := range l.Runs {
		items[i] = listedRun{Run: r}
	}
	return json.Marshal(struct {
		Runs       []listedRun `json:"runs"`
		NextCursor string      `json:"next_cursor,omitempty"`
	}{items, l.NextCursor})
}
