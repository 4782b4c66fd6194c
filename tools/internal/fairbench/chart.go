package fairbench

import (
	"fmt"
	"os"
	"strings"
)

// WriteChart draws, for each result, the first tenant's share of the
// worker time per 10 s bucket (and of the claims, in the legend), with
// the even split marked: one panel per scenario and mode setting.
func WriteChart(path string, scs []Scenario, rs []Result) error {
	const pw, ph, pad = 300, 160, 40
	w := pad + len(rs)*(pw+pad)
	h := ph + 3*pad
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	for i, r := range rs {
		var sc Scenario
		for _, s := range scs {
			if s.Name == r.Scenario {
				sc = s
			}
		}
		first := sc.Tenants[0].Name
		x0, y0 := pad+i*(pw+pad), pad
		mode := "two-level"
		if sc.Runtime {
			mode = "charge=runtime"
		}
		state := "off"
		if r.ModeOn {
			state = "on"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s, %s %s</text>`+"\n", x0, y0-10, r.Scenario, mode, state)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, pw, ph)
		mid := y0 + ph/2
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#bbb" stroke-dasharray="4 3"/>`+"\n", x0, mid, x0+pw, mid)
		pts := r.Series[first]
		var path []string
		for j, v := range pts {
			x := x0 + (j*pw)/max(len(pts)-1, 1)
			y := y0 + ph - int(v*float64(ph))
			path = append(path, fmt.Sprintf("%d,%d", x, y))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#c0392b" stroke-width="2"/>`+"\n", strings.Join(path, " "))
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s: %.0f%% of worker time, %.0f%% of claims</text>`+"\n",
			x0, y0+ph+18, first, 100*r.TimeShare[first], 100*r.ClaimShare[first])
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#666">line: %s's share of worker time per 10 s; dashes: 50%%</text>`+"\n",
			x0, y0+ph+34, first)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
