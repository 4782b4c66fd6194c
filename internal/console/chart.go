package console

import (
	"bytes"
	"fmt"
	"html/template"
	"strconv"
	"time"
)

// The share chart of a queue's page: which keys got the claims of the last
// few minutes. It is an inline SVG drawn on the server, so the page needs
// no script for it and loads nothing from elsewhere; colours are SVG
// presentation attributes because the page's CSP allows no style
// attribute.

// Shape of the chart on the queue's page.
const (
	shareBucket  = 10 * time.Second
	shareBuckets = 30
	shareMaxKeys = 8
)

// sharePalette is the colours of the listed keys in order; otherColour is
// the sum of the keys not listed, grey so that it reads as "the rest".
var sharePalette = []string{"#2a5bd7", "#e07b00", "#1e9e5a", "#c2185b", "#7b4fd0", "#00838f", "#b58900", "#6d4c41"}

const otherColour = "#9aa1ad"

// Geometry of the SVG, in user units.
const (
	chartColumn = 18
	chartGap    = 4
	chartHeight = 160
	chartLeft   = 34
	chartTop    = 8
	legendRow   = 18
)

type chartRect struct {
	X, Y, W, H int
	Fill       string
	Title      string
}

type chartBar struct {
	X      int
	Empty  bool
	Title  string
	Blocks []chartRect
}

type chartLegend struct {
	Key    string
	Label  string
	Colour string
	Share  string // 0..1, three decimals, for data-share
	Pct    string
	Y      int
}

type chartData struct {
	Width, Height int
	PlotBottom    int
	PlotRight     int
	Title         string
	Columns       []chartBar
	Legend        []chartLegend
	Empty         bool
	EmptyY        int
	Ticks         []chartTick
}

type chartTick struct {
	X     int
	Label string
}

// The chart's template: every value the data holds goes through
// html/template's escaping (keys may hold any character).
var shareChartTemplate = template.Must(template.New("chart").Parse(`<svg id="share-chart" xmlns="http://www.w3.org/2000/svg" role="img" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}">` +
	`<title>{{.Title}}</title>` +
	`<text x="0" y="{{.Columns0Y}}" font-size="10" fill="#5b6475">100%</text>` +
	`<line x1="{{.Left}}" y1="{{.PlotBottom}}" x2="{{.PlotRight}}" y2="{{.PlotBottom}}" stroke="#8a93a6" stroke-width="1"/>` +
	`{{range .Columns}}<g class="bucket">` +
	`{{if .Empty}}<rect x="{{.X}}" y="{{$.Top}}" width="{{$.ColW}}" height="{{$.PlotH}}" fill="none" stroke="#d9dde5" stroke-width="1"><title>{{.Title}}</title></rect>` +
	`{{else}}{{range .Blocks}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}"><title>{{.Title}}</title></rect>{{end}}{{end}}` +
	`</g>{{end}}` +
	`{{range .Ticks}}<text x="{{.X}}" y="{{$.TickY}}" font-size="10" fill="#5b6475" text-anchor="middle">{{.Label}}</text>{{end}}` +
	`{{if .Empty}}<text x="{{.Left}}" y="{{.EmptyY}}" font-size="12" fill="#5b6475">No claims in the last five minutes.</text>{{end}}` +
	`<g class="legend">{{range .Legend}}<g class="legend-entry" data-key="{{.Key}}" data-share="{{.Share}}">` +
	`<rect x="{{$.Left}}" y="{{.Y}}" width="12" height="12" fill="{{.Colour}}"/>` +
	`<text x="{{$.LegendText}}" y="{{.TextY}}" font-size="12" fill="#1d2330">{{.Label}} — {{.Pct}}</text>` +
	`<title>{{.Label}}: {{.Pct}} of the claims of the window</title></g>{{end}}</g>` +
	`</svg>`))

// chartView adds the fixed geometry to the data for the template.
type chartView struct {
	chartData
}

// Left is the x of the plot's left edge (room for the 100% label).
func (chartView) Left() int { return chartLeft }

// Top is the y of the top of a full column.
func (chartView) Top() int { return chartTop }

// ColW is the width of a column.
func (chartView) ColW() int { return chartColumn }

// PlotH is the height of a full (100%) column.
func (chartView) PlotH() int { return chartHeight }

// Columns0Y is the baseline of the 100% label, level with the top.
func (chartView) Columns0Y() int { return chartTop + 9 }

// LegendText is the x of a legend entry's text, right of its swatch.
func (chartView) LegendText() int { return chartLeft + 18 }

// TickY is the baseline of the time labels under the plot.
func (v chartView) TickY() int { return v.PlotBottom + 14 }

// TextY places a legend entry's text on the baseline of its swatch.
func (l chartLegend) TextY() int { return l.Y + 10 }

// shareChart draws the claims of s as an inline SVG: one stacked column per
// bucket whose parts are each key's share of the bucket's claims (a bucket
// with claims is a full column; one without is a faint outline), and a
// legend with each key's share of the whole window. The result is built
// only from escaped template output.
func shareChart(s Shares) template.HTML {
	buckets := len(s.Total)
	for _, c := range s.Counts {
		buckets = max(buckets, len(c))
	}
	if buckets == 0 {
		buckets = shareBuckets
	}
	bucket := s.Bucket
	if bucket <= 0 {
		bucket = shareBucket
	}
	keys := s.Keys
	counts := func(k, b int) int {
		if k < len(s.Counts) && b < len(s.Counts[k]) && s.Counts[k][b] > 0 {
			return s.Counts[k][b]
		}
		return 0
	}
	colours := make([]string, len(keys))
	next := 0
	for k, key := range keys {
		if key == OtherKey {
			colours[k] = otherColour
			continue
		}
		colours[k] = sharePalette[next%len(sharePalette)]
		next++
	}
	labels := make([]string, len(keys))
	for k, key := range keys {
		labels[k] = key
		if key == "" {
			labels[k] = "(default key)"
		}
	}

	plotRight := chartLeft + buckets*(chartColumn+chartGap)
	d := chartData{
		PlotBottom: chartTop + chartHeight,
		PlotRight:  plotRight,
		Width:      max(plotRight+8, 320),
	}
	windowTotal := 0
	keyTotal := make([]int, len(keys))
	for b := range buckets {
		x := chartLeft + b*(chartColumn+chartGap)
		// The sum of the keys, so that a column adds up to 100% even when
		// Total disagrees with them (a shard answering between reads).
		sum := 0
		for k := range keys {
			sum += counts(k, b)
		}
		from := s.End.Add(-time.Duration(buckets-b) * bucket)
		col := chartBar{X: x, Empty: sum == 0,
			Title: fmt.Sprintf("%s–%s UTC: %d claims", from.UTC().Format("15:04:05"), from.Add(bucket).UTC().Format("15:04:05"), sum)}
		if sum > 0 {
			// Heights by cumulative share, so rounding never leaves a
			// gap or overflows the column.
			acc, prevY := 0, chartTop+chartHeight
			for k := range keys {
				n := counts(k, b)
				if n == 0 {
					continue
				}
				acc += n
				y := chartTop + chartHeight - int(float64(chartHeight)*float64(acc)/float64(sum)+0.5)
				col.Blocks = append(col.Blocks, chartRect{X: x, Y: y, W: chartColumn, H: prevY - y, Fill: colours[k],
					Title: fmt.Sprintf("%s: %d of %d claims (%s) at %s UTC", labels[k], n, sum, percent(float64(n)/float64(sum)), from.UTC().Format("15:04:05"))})
				prevY = y
				keyTotal[k] += n
			}
			windowTotal += sum
		}
		d.Columns = append(d.Columns, col)
	}
	// A time label every minute (six buckets of ten seconds).
	every := max(int(time.Minute/bucket), 1)
	for b := 0; b <= buckets; b += every {
		ago := time.Duration(buckets-b) * bucket
		label := "now"
		if ago > 0 {
			label = "-" + strconv.Itoa(int(ago/time.Second)) + "s"
		}
		d.Ticks = append(d.Ticks, chartTick{X: chartLeft + b*(chartColumn+chartGap) - chartGap/2, Label: label})
	}
	d.Empty = windowTotal == 0
	d.EmptyY = chartTop + chartHeight/2
	legendTop := d.PlotBottom + 28
	for k, key := range keys {
		share := 0.0
		if windowTotal > 0 {
			share = float64(keyTotal[k]) / float64(windowTotal)
		}
		d.Legend = append(d.Legend, chartLegend{Key: key, Label: labels[k], Colour: colours[k],
			Share: strconv.FormatFloat(share, 'f', 3, 64), Pct: percent(share), Y: legendTop + k*legendRow})
	}
	d.Height = legendTop + len(keys)*legendRow + 4
	d.Title = fmt.Sprintf("Share of claims per key, %d buckets of %s up to %s UTC", buckets, bucket, s.End.UTC().Format("15:04:05"))
	var buf bytes.Buffer
	if err := shareChartTemplate.Execute(&buf, chartView{d}); err != nil {
		// The template is fixed and its data plain values: it cannot fail
		// but for a programming error, which the unit test would catch.
		return template.HTML(template.HTMLEscapeString("chart unavailable: " + err.Error()))
	}
	return template.HTML(buf.String())
}

// percent formats a share (0..1) as a percentage with one decimal.
func percent(f float64) string {
	return strconv.FormatFloat(f*100, 'f', 1, 64) + "%"
}
