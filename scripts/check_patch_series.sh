#!/usr/bin/env bash
# Does datavine's TaskVine patch series apply to a cctools source? For each source given (an
# orig tarball, or an unpacked tree), the series (scripts/patches/cctools/*.patch) is applied
# in order to a scratch copy, and each patch is reported: applies, applies with fuzz or
# offset, or which hunks of which files it rejects (a patch that does not apply is left out
# and the next ones are still tried, so every patch that needs work is named; one that
# builds on a patch left out may fail for that reason alone).
#
#   scripts/check_patch_series.sh SOURCE...
#   scripts/build_taskvine.sh --check-series     # every version the Debian mirror offers
#
# Exit code 0 when the whole series applies to every source, 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH_DIR="$ROOT/scripts/patches/cctools"
[ $# -gt 0 ] || { echo "usage: $0 SOURCE (orig tarball or source tree)..." >&2; exit 2; }

check_one() {  # check_one SOURCE: 0 when every patch applies
  local source=$1 scratch tree p name out rc=0
  scratch=$(mktemp -d)
  if [ -d "$source" ]; then
    cp -a "$source" "$scratch/src"
  else
    mkdir "$scratch/src" && tar -C "$scratch/src" --strip-components=1 -xf "$source" \
      || { echo "$source: cannot unpack"; rm -rf "$scratch"; return 1; }
  fi
  tree="$scratch/src"
  echo "== $source"
  for p in "$PATCH_DIR"/*.patch; do
    name=$(basename "$p")
    # a dry run first: a patch that does not apply leaves the tree as it was
    if out=$(cd "$tree" && patch -p1 --forward --batch --dry-run < "$p" 2>&1); then
      (cd "$tree" && patch -p1 --forward --batch --silent --no-backup-if-mismatch < "$p")
      if grep -qE 'with fuzz|offset' <<<"$out"; then
        echo "  $name: applies ($(grep -cE 'with fuzz|offset' <<<"$out") hunk(s) moved)"
      else
        echo "  $name: applies"
      fi
    else
      rc=1
      echo "  $name: DOES NOT APPLY"
      grep -E '^patching file|FAILED|can.t find file|Reversed|malformed' <<<"$out" \
        | grep -B1 -E 'FAILED|can.t find|Reversed|malformed' | grep -v '^--$' \
        | sed 's/^/      /'
    fi
  done
  rm -rf "$scratch"
  return $rc
}

status=0
for source in "$@"; do
  check_one "$source" || status=1
done
exit $status
