package janitor

import (
	"context"
	"time"

	"github.com/harvest-run/harvest/pkg/shard"
)

// AnalyzeBehind runs the analyzer alone at its default thresholds, with
// the given age in place of DefaultAnalyzeAge (a test cannot wait a
// minute for the analyze it made to age), and returns the tables it
// analyzed.
func AnalyzeBehind(ctx context.Context, db shard.Beginner, age time.Duration) (int, error) {
	var rep Report
	j := analyzer{minRows: DefaultAnalyzeMinRows, share: DefaultAnalyzeShare, age: age, most: DefaultAnalyzeTables}
	err := j.runAfter(ctx, db, &lockedTick{rep: &rep})
	return rep.Analyzed, err
}
