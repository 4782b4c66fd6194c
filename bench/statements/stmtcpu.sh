#!/usr/bin/env bash
# The CPU of each statement a client sent, from a server log written with
# log_statement_stats = on and log_line_prefix = '%m [%p] %a ' (the
# process id and application_name the parse needs). Usage:
#
#   bench/statements/stmtcpu.sh LOG [APPLICATION_NAME [TASKS]]
#
# Prints, for the connections of APPLICATION_NAME (default harvest-worker),
# the CPU (user + system) their backends used between their first and
# last logged message, the part of it inside the logged messages, and the
# messages by kind and statement, most expensive first, each per task
# (TASKS, default 100000: the flood of harvest-bench fleet).
set -euo pipefail
log=${1:?usage: stmtcpu.sh LOG [APPLICATION_NAME [TASKS]]}
app=${2:-harvest-worker}
tasks=${3:-100000}
awk -v app="$app" -v tasks="$tasks" '
# An entry: "... [pid] app LOG:  KIND STATISTICS", a DETAIL whose first two
# lines hold this message'"'"'s and the backend'"'"'s running user and system
# seconds, then "... STATEMENT:  text".
/ LOG:  .* STATISTICS$/ {
	match($0, /\[[0-9]+\]/); pid = substr($0, RSTART + 1, RLENGTH - 2)
	rest = substr($0, RSTART + RLENGTH + 1)
	split(rest, w, " "); who = w[1]
	kind = rest; sub(/^[^ ]* LOG:  /, "", kind); sub(/ STATISTICS$/, "", kind)
	want = (who == app); next
}
want && /^\t!\t[0-9.]+ s user, [0-9.]+ s system, / { u = $2; s = $5; next }
want && /^\t!\t\[[0-9.]+ s user, [0-9.]+ s system total\]/ {
	tu = substr($2, 2); ts = $5
	tot = tu + ts
	if (!(pid in first)) first[pid] = tot - u - s
	last[pid] = tot; inside += u + s; next
}
want && / STATEMENT:  / {
	stmt = $0; sub(/^.* STATEMENT:  /, "", stmt); stmt = substr(stmt, 1, 70)
	k = sprintf("%-16s %s", kind, stmt); n[k]++; cpu[k] += u + s; want = 0; next
}
END {
	for (p in last) all += last[p] - first[p]
	printf "%s backends: %.1f us a task from first to last message, %.1f inside the messages\n", app, all / tasks * 1e6, inside / tasks * 1e6
	for (k in n) printf "%8.1f us a task  %7d x %9.1f us  %s\n", cpu[k] / tasks * 1e6, n[k], cpu[k] / n[k] * 1e6, k
}' "$log" | { read -r head; echo "$head"; sort -rn | head -15; }
