package api

// RunList is a page of a tenant's runs, newest first: the answer of
// GET /v1/runs.
type RunList struct {
	Runs []Run `json:"runs"`
	// NextCursor fetches the next page when passed as ?cursor=; it is
	// absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}
