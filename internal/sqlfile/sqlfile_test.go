package sqlfile

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestMustReadsAndPanicsOnMissing(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{"sql/RunGet.sql": {Data: []byte("SELECT 1")}}
	require.Equal(t, "SELECT 1", Must(fsys, "RunGet"))
	require.PanicsWithValue(t,
		"sqlfile: missing embedded query RunPut: open sql/RunPut.sql: file does not exist",
		func() { Must(fsys, "RunPut") })
}
