#!/usr/bin/env bash
# Harvest's flood statements beside River's, one backend at a time: see
# README.md. Usage, from anywhere:
#
#   bench/statements/run.sh [rounds] [batch] [rows]
#
# rounds (3) alternations of the two loops, batch (50) tasks a claim,
# rows (100000) tasks in the flood (each loop takes half). The server is
# HARVEST_DATABASE_URL (default: the local one, user postgres); the two
# databases made here are dropped at the end.
set -euo pipefail

rounds=${1:-3}
batch=${2:-50}
rows=${3:-100000}
url=${HARVEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
tag=harvest_stmt_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')

# dburl NAME: the server's URL with its database replaced by NAME.
dburl() { echo "$url" | sed -E "s#/[^/?]*(\?|\$)#/$1\1#"; }
admin() { psql "$url" -qAt -v ON_ERROR_STOP=1 -c "SET client_min_messages = warning" -c "$1" >/dev/null; }

cleanup() {
	for db in "${tag}_h" "${tag}_r" "${tag}_hrun" "${tag}_rrun"; do
		admin "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT

go -C "$root" build -o "$tmp/harvest" ./cmd/harvest
# On a machine that never built bench/river the module is not in the
# cache yet, and `go list -m` then names no directory.
go -C "$root/bench/river" mod download github.com/riverqueue/river/riverdriver/riverpgxv5
riverdir=$(go -C "$root/bench/river" list -m -f '{{.Dir}}' github.com/riverqueue/river/riverdriver/riverpgxv5)
if [ -z "$riverdir" ] || [ ! -d "$riverdir/migration/main" ]; then
	echo "run.sh: River's migrations not found (module cache: $riverdir)" >&2
	exit 1
fi

# The two filled databases, copied for each loop.
admin "CREATE DATABASE ${tag}_h TEMPLATE template0"
HARVEST_SHARDS=$(dburl "${tag}_h") "$tmp/harvest" migrate >/dev/null
psql "$(dburl "${tag}_h")" -q -v ON_ERROR_STOP=1 -v rows="$rows" -f "$here/harvest_fill.sql" >/dev/null
admin "CREATE DATABASE ${tag}_r TEMPLATE template0"
for f in "$riverdir"/migration/main/*.up.sql; do
	# The migrations name their schema through a template comment that
	# River's migrator fills in; the default schema needs nothing there.
	sed 's#/\* TEMPLATE: schema \*/##g' "$f" | psql "$(dburl "${tag}_r")" -q -v ON_ERROR_STOP=1 >/dev/null
done
psql "$(dburl "${tag}_r")" -q -v ON_ERROR_STOP=1 -v rows="$rows" -f "$here/river_fill.sql" >/dev/null

loop() { # loop h|r FILE
	admin "DROP DATABASE IF EXISTS ${tag}_${1}run WITH (FORCE)"
	admin "CREATE DATABASE ${tag}_${1}run TEMPLATE ${tag}_$1"
	PGOPTIONS="-c harvest_bench.batch=$batch -c harvest_bench.rows=$rows -c track_functions=none" \
		psql "$(dburl "${tag}_${1}run")" -q -v ON_ERROR_STOP=1 -f "$2" 2>&1 | sed 's/^.*NOTICE: *//'
}
echo "batch $batch, $rows tasks filled, half of them claimed and completed per loop"
for _ in $(seq "$rounds"); do
	loop h "$here/harvest_loop.sql"
	loop r "$here/river_loop.sql"
done
