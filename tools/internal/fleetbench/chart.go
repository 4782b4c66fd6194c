package fleetbench

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

var keyColors = map[string]color.Color{
	floodKey: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	lightKey: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// keyPlot draws each key's claims per second of one run on a log scale
// (seconds without a claim of a key are left out of its line).
func keyPlot(r *Result, title string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the first claim"
	p.Y.Label.Text = "claims per second (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0.5, 20000
	p.Legend.Top = true
	if r == nil {
		return p, nil
	}
	for _, key := range []string{floodKey, lightKey} {
		series := r.perSecond[key]
		var pts plotter.XYs
		for s, n := range series {
			if n > 0 {
				pts = append(pts, plotter.XY{X: float64(s) + 0.5, Y: float64(n)})
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Color = keyColors[key]
		sc.GlyphStyle.Radius = vg.Points(1.6)
		p.Add(sc)
		p.Legend.Add(fmt.Sprintf("key %q", key), sc)
	}
	return p, nil
}

// KeyChart writes the claims per second of each key during the flood, with
// fairness on (left) and off (right), as one SVG.
func KeyChart(path string, on, off *Result) error {
	left, err := keyPlot(on, "fairness on")
	if err != nil {
		return err
	}
	right, err := keyPlot(off, "fairness off")
	if err != nil {
		return err
	}
	const w, h = 26 * vg.Centimeter, 10 * vg.Centimeter
	img := vgsvg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Centimeter, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3,
		PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
