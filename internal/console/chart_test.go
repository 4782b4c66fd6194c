package console

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var legendRe = regexp.MustCompile(`data-key="([^"]*)" data-share="([0-9.]+)"`)

// legendShares reads the legend's data-share of every key.
func legendShares(t *testing.T, svg string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range legendRe.FindAllStringSubmatch(svg, -1) {
		out[m[1]] = m[2]
	}
	return out
}

func shares(keys []string, counts ...[]int) Shares {
	s := Shares{Bucket: shareBucket, End: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), Keys: keys, Counts: counts,
		Total: make([]int, shareBuckets)}
	for _, c := range counts {
		for b, n := range c {
			s.Total[b] += n
		}
	}
	return s
}

func buckets(f func(b int) int) []int {
	out := make([]int, shareBuckets)
	for b := range out {
		out[b] = f(b)
	}
	return out
}

func TestShareChartEmpty(t *testing.T) {
	t.Parallel()
	svg := string(shareChart(Shares{Bucket: shareBucket, End: time.Now()}))
	require.Contains(t, svg, `<svg id="share-chart"`)
	require.Contains(t, svg, "No claims in the last five minutes")
	require.Equal(t, shareBuckets, strings.Count(svg, `fill="none"`), "every bucket an outline")
	require.Empty(t, legendShares(t, svg))
	require.NotContains(t, svg, "style=")
}

func TestShareChartOneKeyIsWhole(t *testing.T) {
	t.Parallel()
	svg := string(shareChart(shares([]string{"vip"}, buckets(func(b int) int { return b % 3 }))))
	require.Equal(t, map[string]string{"vip": "1.000"}, legendShares(t, svg))
	require.Contains(t, svg, "100.0%")
	// Every bucket with claims is a full column (height 160); the ones
	// without (b%3 == 0) are outlines.
	require.Equal(t, 20, strings.Count(svg, `height="160" fill="#2a5bd7"`))
	require.Equal(t, 10, strings.Count(svg, `fill="none"`))
	require.NotContains(t, svg, "style=")
}

func TestShareChartTwoKeysHalfEach(t *testing.T) {
	t.Parallel()
	one := buckets(func(int) int { return 5 })
	svg := string(shareChart(shares([]string{"a", "b"}, one, one)))
	require.Equal(t, map[string]string{"a": "0.500", "b": "0.500"}, legendShares(t, svg))
	require.Equal(t, 2*shareBuckets, strings.Count(svg, `height="80"`))
	require.Contains(t, svg, `fill="#2a5bd7"`)
	require.Contains(t, svg, `fill="#e07b00"`)
}

// A flood key and a trickle key get distinct colours and very different
// areas; the sum of the other keys is grey.
func TestShareChartFloodAndTrickle(t *testing.T) {
	t.Parallel()
	svg := string(shareChart(shares([]string{"flood", "trickle", OtherKey},
		buckets(func(int) int { return 95 }), buckets(func(int) int { return 5 }), buckets(func(int) int { return 0 }))))
	got := legendShares(t, svg)
	require.Equal(t, "0.950", got["flood"])
	require.Equal(t, "0.050", got["trickle"])
	require.Equal(t, "0.000", got[OtherKey])
	require.Equal(t, shareBuckets, strings.Count(svg, `height="152" fill="#2a5bd7"`))
	require.Equal(t, shareBuckets, strings.Count(svg, `height="8" fill="#e07b00"`))
	require.Contains(t, svg, `fill="`+otherColour+`"`)
}

func TestShareChartEscapesKeys(t *testing.T) {
	t.Parallel()
	svg := string(shareChart(shares([]string{`<script>alert(1)</script>`, `"quoted" & co`},
		buckets(func(int) int { return 1 }), buckets(func(int) int { return 1 }))))
	require.NotContains(t, svg, "<script>")
	require.NotContains(t, svg, `"quoted"`)
	require.Contains(t, svg, "&lt;script&gt;")
	require.Contains(t, svg, "&amp; co")
}
