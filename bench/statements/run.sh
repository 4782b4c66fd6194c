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
#
# STATEMENTS_SYNC=on commits as the fleet does (synchronous_commit on;
# default off, so that a loop's time is its backend's CPU), and
# STATEMENTS_CLIENTS=n runs n loops of each system at once on one
# database, each taking its share. When the server runs on this machine
# each loop also reports the CPU all its postgres processes used per task.
set -euo pipefail

rounds=${1:-3}
batch=${2:-50}
rows=${3:-100000}
sync=${STATEMENTS_SYNC:-off}
clients=${STATEMENTS_CLIENTS:-1}
case "$sync" in on | off) ;; *) echo "run.sh: STATEMENTS_SYNC must be on or off, not $sync" >&2; exit 2 ;; esac
case "$clients" in '' | *[!0-9]* | 0) echo "run.sh: STATEMENTS_CLIENTS must be a whole number above 0, not $clients" >&2; exit 2 ;; esac
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

# pgcpu: the CPU time (clock ticks) the local server's processes have used,
# the postmaster's reaped children (backends that ended) included; 0 when
# no postgres process is visible here.
pgcpu() {
	# (A process may end between the glob and its read.)
	{ cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk '/ \(postgres\) / {
		sub(/^.*\) /, ""); t += $12 + $13 + $14 + $15 } END { print t + 0 }'
}

loop() { # loop h|r FILE
	admin "DROP DATABASE IF EXISTS ${tag}_${1}run WITH (FORCE)"
	admin "CREATE DATABASE ${tag}_${1}run TEMPLATE ${tag}_$1"
	local c0 c1 t0 t1 pids=() pid n=0
	c0=$(pgcpu)
	t0=$(date +%s%N)
	for _ in $(seq "$clients"); do
		PGOPTIONS="-c harvest_bench.batch=$batch -c harvest_bench.rows=$((rows / clients)) -c track_functions=none -c synchronous_commit=$sync" \
			psql "$(dburl "${tag}_${1}run")" -q -v ON_ERROR_STOP=1 -f "$2" 2>&1 | sed 's/^.*NOTICE: *//' &
		pids+=("$!")
	done
	# Each loop's own status (pipefail: psql's), so a failed loop stops
	# the script as it did when the loops ran one at a time.
	for pid in "${pids[@]}"; do
		wait "$pid"
	done
	t1=$(date +%s%N)
	# The loops' backends must have ended and been reaped by the postmaster
	# before the second reading: one caught between its exit and the reap
	# is in neither the live processes' times nor the postmaster's
	# children's, and its whole CPU would be missed.
	# (Read from the process titles, so as to open no connection of its own;
	# the bracket keeps grep's own command line from matching its pattern.)
	while cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' | grep -q "${tag}_${1}ru[n]"; do
		n=$((n + 1))
		if [ "$n" -gt 200 ]; then
			echo "run.sh: the loops' backends of ${tag}_${1}run did not end within 10 s" >&2
			exit 1
		fi
		sleep 0.05
	done
	sleep 0.2
	c1=$(pgcpu)
	if [ "$c0" -gt 0 ]; then
		echo "  $([ "$1" = h ] && echo harvest || echo river) x$clients: the server's CPU $(((c1 - c0) * 1000000 / $(getconf CLK_TCK) / (rows / 2))) us a task, wall $(((t1 - t0) / 1000 / (rows / 2))) us a task"
	fi
}
echo "batch $batch, $rows tasks filled, half of them claimed and completed per run of a loop," \
	"by $clients loop(s) at once, synchronous_commit $sync"
for _ in $(seq "$rounds"); do
	loop h "$here/harvest_loop.sql"
	loop r "$here/river_loop.sql"
done
