#!/usr/bin/env bash
# Fails when docs/guarantees.md names a test that does not exist: every row
# of the failure table must stay backed by a real test.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=0
while read -r pkg test; do
  dir=$pkg
  [ "$pkg" = inboxmq ] && dir=. # the root package, the façade
  if ! grep -qs "^func ${test}(" "$dir"/*_test.go; then
    echo "docs/guarantees.md names ${pkg} ${test}, which does not exist" >&2
    missing=1
  fi
done < <(grep -oE '`[a-z/-]+` Test[A-Za-z0-9_]+' docs/guarantees.md | tr -d '`' | sort -u)
[ "$missing" = 0 ] && echo "docs/guarantees.md: every named test exists"
exit "$missing"
