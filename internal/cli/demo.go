package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

const demoUsage = `demo flood [flags]

Shows fair claiming: tenant --flood-tenant starts a flood of sleep runs at
once while tenant --trickle-tenant starts a few, one at a time. Both go
through the gateway at HARVEST_GATEWAY_URL with the tokens in
HARVEST_TENANT_<N>_TOKEN (as harvest dev --env-file writes them). It prints
how long each trickle run waited to be claimed while the flood drains, and
the flood's progress, then a summary, and exits.

Flags:`

func runDemo(ctx context.Context, e env, args []string) error {
	if len(args) > 0 && (args[0] == "share" || args[0] == "priority") {
		return runDemoShare(ctx, e, args[0], args[1:])
	}
	if len(args) == 0 || args[0] != "flood" {
		w := e.stderr
		help := len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help")
		if help {
			w = e.stdout
		}
		fmt.Fprintln(w, "usage: harvest "+demoUsage)
		fmt.Fprintln(w, "\nusage: harvest "+demoShareUsage)
		if help {
			return nil
		}
		return usageError{Msg: "name a demo: flood, share or priority"}
	}
	fs := newFlags(e, "demo flood", demoUsage)
	floodN := fs.Int("flood", 2000, "runs in the flood")
	trickleN := fs.Int("trickle", 20, "runs in the trickle")
	every := fs.Duration("every", 400*time.Millisecond, "time between two trickle starts")
	ms := fs.Int("ms", 20, "how long each run sleeps, in milliseconds")
	floodT := fs.Int("flood-tenant", 1, "N of the flooding tenant (HARVEST_TENANT_N_TOKEN)")
	trickleT := fs.Int("trickle-tenant", 2, "N of the trickling tenant")
	queue := fs.String("queue", "default", "queue of every run")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *floodN < 1 || *trickleN < 1 || *ms < 0 || *every <= 0 {
		return usageError{Msg: "--flood and --trickle must be at least 1, --ms not negative, --every positive"}
	}
	if *floodT == *trickleT {
		return usageError{Msg: "--flood-tenant and --trickle-tenant must differ"}
	}
	gw := os.Getenv("HARVEST_GATEWAY_URL")
	if gw == "" {
		return usageError{Msg: "HARVEST_GATEWAY_URL is not set (source the file of harvest dev --env-file)"}
	}
	tenant := func(n int) (name string, c *client.Client, err error) {
		tok := os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_TOKEN", n))
		if tok == "" {
			return "", nil, usageError{Msg: fmt.Sprintf("HARVEST_TENANT_%d_TOKEN is not set (source the file of harvest dev --env-file)", n)}
		}
		name = os.Getenv(fmt.Sprintf("HARVEST_TENANT_%d_NAME", n))
		if name == "" {
			name = fmt.Sprintf("tenant %d", n)
		}
		c, err = client.New(client.Options{URL: gw, Token: tok})
		return name, c, err
	}
	fname, fc, err := tenant(*floodT)
	if err != nil {
		return err
	}
	tname, tc, err := tenant(*trickleT)
	if err != nil {
		return err
	}
	input := map[string]int{"ms": *ms}

	// The flood: every run at once, in batches.
	base, err := fc.Usage(ctx)
	if err != nil {
		return apiFailure(err)
	}
	fmt.Fprintf(e.stdout, "%s floods queue %q with %d runs of %dms; %s starts %d, one every %s.\n",
		fname, *queue, *floodN, *ms, tname, *trickleN, *every)
	var floodIDs []string
	for left := *floodN; left > 0; {
		n := min(left, api.MaxBatchItems)
		reqs := make([]api.StartRequest, n)
		for i := range reqs {
			if reqs[i], err = (client.StartOptions{}).Request("sleep", *queue, input); err != nil {
				return err
			}
		}
		res, err := fc.StartBatch(ctx, reqs)
		if err != nil {
			return apiFailure(err)
		}
		for _, r := range res {
			if r.Error != nil {
				return fmt.Errorf("flood start refused: %d %s: %s", r.Error.Status, r.Error.Code, r.Error.Message)
			}
			floodIDs = append(floodIDs, r.Run.ID)
		}
		left -= n
	}

	// The bar is decoration for a person watching: it redraws in place,
	// which would litter a file or a pipe, so it goes to stderr and only
	// when that is a terminal. The results stay on stdout either way.
	barOut, barShown := progressOutput(e.stderr)
	bar := progressbar.NewOptions(*floodN,
		progressbar.OptionSetWriter(barOut),
		progressbar.OptionSetDescription(fname+" flood"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
	)
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		if barShown {
			_ = bar.Clear()
		}
		fmt.Fprintf(e.stdout, format+"\n", args...)
		if barShown {
			_ = bar.RenderBlank()
		}
	}

	// The trickle: one start at a time, each one's wait reported when it
	// is claimed.
	var (
		waitsMu sync.Mutex
		waits   []time.Duration
		wg      sync.WaitGroup
		tErr    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(*every)
		defer tick.Stop()
		var runs sync.WaitGroup
		defer runs.Wait()
		for i := range *trickleN {
			st, err := tc.Start(ctx, "sleep", *queue, input, client.StartOptions{})
			if err != nil {
				tErr = apiFailure(err)
				return
			}
			runs.Add(1)
			go func() {
				defer runs.Done()
				run, err := tc.Wait(ctx, st.Run.ID, 60*time.Second)
				if err != nil || run.ClaimedAt == nil {
					say("%s run %2d: not claimed (%v)", tname, i+1, err)
					return
				}
				w := run.ClaimedAt.Sub(run.CreatedAt.Time)
				waitsMu.Lock()
				waits = append(waits, w)
				waitsMu.Unlock()
				say("%s run %2d waited %7s to be claimed", tname, i+1, w.Round(time.Millisecond))
			}()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// The flood's progress, from the tenant's unfinished runs.
	var lastFloodWait time.Duration
	for {
		u, err := fc.Usage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return apiFailure(err)
		}
		done := min(max(*floodN-(u.Running-base.Running), 0), *floodN)
		if done > 0 {
			if r, err := fc.Get(ctx, floodIDs[done-1]); err == nil && r.ClaimedAt != nil {
				lastFloodWait = r.ClaimedAt.Sub(r.CreatedAt.Time)
			}
		}
		outMu.Lock()
		bar.Describe(fmt.Sprintf("%s flood (last wait %s)", fname, lastFloodWait.Round(10*time.Millisecond)))
		_ = bar.Set(done)
		outMu.Unlock()
		if done >= *floodN {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
		if ctx.Err() != nil {
			break
		}
	}
	_ = bar.Finish()
	if barShown {
		fmt.Fprintln(barOut)
	}
	wg.Wait()
	if tErr != nil {
		return tErr
	}
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	slices.Sort(waits)
	if len(waits) > 0 {
		fmt.Fprintf(e.stdout, "%s: %d runs, wait median %s, max %s; %s's flood of %d: last run waited %s.\n",
			tname, len(waits), waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond),
			fname, *floodN, lastFloodWait.Round(10*time.Millisecond))
	}
	return nil
}

// progressOutput is where a progress bar goes: w when it is a terminal,
// else nowhere (shown false).
func progressOutput(w io.Writer) (out io.Writer, shown bool) {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return f, true
	}
	return io.Discard, false
}
