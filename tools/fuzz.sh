#!/usr/bin/env bash
# Runs every fuzz target (func FuzzXxx(*testing.F) in a _test.go file under
# ./internal and ./cmd) for FUZZTIME each, one after the other, as
#
#   go test -run='^$' -fuzz='^FuzzXxx$' -fuzztime=$FUZZTIME ./pkg/
#
# would, except that each package's instrumented test binary is built once
# for all its targets, two packages at a time before the first target runs
# (linking one takes up to a minute: ./cmd/kproxy's is most of Kubernetes),
# and run in the package's directory with go test's corpus cache
# ($GOCACHE/fuzz/<import path>).
#
# It stops at the first failure. A crasher Go found is written to the
# package's testdata/fuzz/FuzzXxx/ and stays there: go test runs it as a
# seed from then on (commit it with the fix).
#
#   FUZZTIME          how long each target runs (default 5s; make fuzz: 60s),
#                     replaying its corpus (seeds, testdata/fuzz, the cache)
#                     included
#   FUZZMINIMIZETIME  how long Go minimizes each new input (default 10x: ten
#                     runs; Go's own default, 60s, spends most of a short run
#                     minimizing what widens coverage)
#   tools/fuzz.sh REGEXP  runs only the targets whose name matches REGEXP
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-10x}
only=${1:-.}
root=$PWD
module=$("$GO" list -m)
cache="$("$GO" env GOCACHE)/fuzz"

# "dir name" per target, in a stable order (grouped by package).
mapfile -t targets < <(grep -rEo --include='*_test.go' --exclude-dir=testdata \
	'^func Fuzz[A-Za-z0-9_]*\(\w+ \*testing\.F\)' internal cmd |
	sed -E 's#^(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#' |
	awk -v only="$only" '$2 ~ only' | sort -u)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no target matches $only" >&2
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kproxy-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log
start=$SECONDS

# Build each package's instrumented test binary, two at a time. -s -w: no
# symbol table or DWARF (tracebacks keep their file:line), a third less
# to link.
mapfile -t dirs < <(printf '%s\n' "${targets[@]}" | cut -d' ' -f1 | uniq)
echo "fuzz: building ${#dirs[@]} packages for fuzzing"
printf '%s\n' "${dirs[@]}" | GO=$GO tmp=$tmp xargs -P 2 -I{} sh -c \
	'b=$(echo {} | tr / _); "$GO" test -c -fuzz=. -ldflags="-s -w" -o "$tmp/$b.test" ./{}/ >"$tmp/$b.build" 2>&1' || true
for dir in "${dirs[@]}"; do
	b=${dir//\//_}
	if [ ! -x "$tmp/$b.test" ]; then
		echo "fuzz: ./$dir does not build:"
		cat "$tmp/$b.build"
		exit 1
	fi
done
echo "fuzz: built in $((SECONDS - start))s"

n=${#targets[@]}
i=0
for t in "${targets[@]}"; do
	i=$((i + 1))
	dir=${t% *} name=${t#* }
	bin=$tmp/${dir//\//_}.test
	printf 'fuzz %d/%d %s ./%s: ' "$i" "$n" "$name" "$dir"
	t0=$SECONDS
	if (cd "$root/$dir" && "$bin" -test.run='^$' -test.fuzz="^${name}\$" -test.fuzztime="$FUZZTIME" \
		-test.fuzzminimizetime="$FUZZMINIMIZETIME" -test.fuzzcachedir="$cache/$module/$dir" -test.paniconexit0) >"$log" 2>&1; then
		execs=$(grep -Eo 'execs: [0-9]+' "$log" | tail -n1 | cut -d' ' -f2 || true)
		if [ -n "$execs" ]; then
			echo "ok ($((SECONDS - t0))s, $execs execs)"
		else
			# FUZZTIME ran out while replaying the corpus.
			baseline=$(grep -Eo 'baseline coverage: [0-9]+/[0-9]+' "$log" | tail -n1 | cut -d' ' -f3 || true)
			echo "ok ($((SECONDS - t0))s, corpus replayed: ${baseline:-?} inputs)"
		fi
		continue
	fi
	# Go before 1.27 can fail a run that found nothing with a bare
	# "context deadline exceeded" when FUZZTIME ends while a worker is
	# mid-input (go.dev/issue/75804): no crasher, nothing to reproduce.
	if ! grep -q 'Failing input written' "$log" && [ "$(grep -c -- '--- FAIL' "$log")" = 1 ] &&
		grep -A1 -- "^--- FAIL: $name " "$log" | tail -n1 | grep -qx '    context deadline exceeded'; then
		execs=$(grep -Eo 'execs: [0-9]+' "$log" | tail -n1 | cut -d' ' -f2 || true)
		echo "ok ($((SECONDS - t0))s, ${execs:-0} execs; Go's end-of-fuzztime race reported \"context deadline exceeded\", go.dev/issue/75804)"
		continue
	fi
	echo "FAIL ($((SECONDS - t0))s)"
	cat "$log"
	crasher=$(grep -Eo 'Failing input written to testdata/fuzz/[^ ]+' "$log" | tail -n1 | sed 's/^Failing input written to //' || true)
	echo
	if [ -n "$crasher" ]; then
		echo "fuzz: $name found a crasher: ./$dir/$crasher"
		echo "fuzz: it stays there as a regression seed (go test runs it); reproduce it with"
		echo "      $GO test -run='^$name/${crasher##*/}\$' ./$dir/"
	else
		echo "fuzz: $name failed on its corpus (a seed, testdata/fuzz or the cache): see above"
	fi
	exit 1
done
echo "fuzz: $n targets passed in $((SECONDS - start))s ($FUZZTIME each)"
