// Package admissionchart draws the per-tenant admission limit of every algorithm
// against the system's load, for docs/admission.md. Regenerate the picture
// with:
//
//	go -C tools run ./cmd/admission-chart -out ../docs/admission-limits.svg
package admissionchart

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Options shape the chart.
type Options struct {
	MaxRuns int
	Tenants int
}

// Series is one line of the chart: a configuration and its label.
type Series struct {
	Label  string
	Config tenantcap.Config
}

// DefaultSeries are the configurations the documentation discusses.
func DefaultSeries() []Series {
	return []Series{
		{"No-Limit (max_runs only)", tenantcap.Config{Algorithm: api.AlgorithmNoLimit, TFM: 1}},
		{"Static, TFM 1", tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}},
		{"Static, TFM 3", tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 3}},
		{"Dynamic, TFM 1", tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 1}},
		{"Dynamic, TFM 3", tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 3}},
	}
}

var palette = []color.Color{
	color.RGBA{R: 0x44, G: 0x44, B: 0x44, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x7f, G: 0xb8, B: 0xe6, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0xff, G: 0x98, B: 0x96, A: 0xff},
}

// Limits returns one point per total load 0..MaxRuns: the most runs one
// tenant may hold at that load (for no_limit, what the system limit leaves
// it, which is all of max_runs when the tenant alone is running).
func Limits(cfg tenantcap.Config, o Options) plotter.XYs {
	pts := make(plotter.XYs, 0, o.MaxRuns+1)
	for total := 0; total <= o.MaxRuns; total++ {
		limit, limited := tenantcap.Limit(cfg, o.MaxRuns, o.Tenants, total)
		if !limited {
			limit = o.MaxRuns
		}
		pts = append(pts, plotter.XY{X: float64(total), Y: float64(limit)})
	}
	return pts
}

// WriteSVG draws the chart of series as SVG on w.
func WriteSVG(w io.Writer, o Options, series []Series) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Per-tenant limit against load (max_runs %d, %d tenants)", o.MaxRuns, o.Tenants)
	p.X.Label.Text = "unfinished runs in the system"
	p.Y.Label.Text = "most runs one tenant may hold"
	p.X.Min, p.X.Max = 0, float64(o.MaxRuns)
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	for i, s := range series {
		line, err := plotter.NewLine(Limits(s.Config, o))
		if err != nil {
			return err
		}
		line.Color = palette[i%len(palette)]
		line.Width = vg.Points(1.5)
		if s.Config.Algorithm == api.AlgorithmStatic {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(s.Label, line)
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(12)
	p.Legend.YOffs = -vg.Points(12)
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}
