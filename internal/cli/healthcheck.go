package cli

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// runHealthcheck is `harvest healthcheck URL`: exit 0 when URL answers
// 2xx within the timeout. Container healthchecks use it, since the
// distroless image has no shell, curl or wget.
func runHealthcheck(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "healthcheck", "healthcheck [-timeout 3s] URL")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	url, rest := splitPositional(args)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if url == "" {
		return usageError{Msg: "usage: harvest healthcheck [-timeout 3s] URL"}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError{Msg: err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}
