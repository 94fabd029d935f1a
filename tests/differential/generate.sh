#!/usr/bin/env bash
# Regenerate NAME.expected from every cases file NAME.lisp (all *.lisp here but driver.lisp)
# with SBCL, or only from the files named on the command line.
# Usage: tests/differential/generate.sh [NAME.lisp ...]   (from anywhere)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

command -v sbcl >/dev/null || { echo "generate.sh: sbcl not found on PATH" >&2; exit 1; }

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  files=()
  for f in *.lisp; do [ "$f" = driver.lisp ] || files+=("$f"); done
fi

tmp="$(mktemp)"
trap 'rm -f "$tmp" "$tmp.err"' EXIT
total=0
for cases in "${files[@]}"; do
  cases="$(basename "$cases")"
  out="${cases%.lisp}.expected"
  # --script implies --no-sysinit --no-userinit --disable-debugger.
  sbcl --script driver.lisp "$cases" "$tmp" 2> "$tmp.err" || {
    cat "$tmp.err" >&2; echo "generate.sh: sbcl failed on $cases" >&2; exit 1; }

  # Sanity checks: one line per top-level form, nothing implementation-specific.
  forms="$(sed -n 's/^cases: \([0-9]*\)$/\1/p' "$tmp.err")"
  lines="$(wc -l < "$tmp")"
  if [ -z "$forms" ] || [ "$forms" -ne "$lines" ]; then
    echo "generate.sh: $cases: $lines result lines but ${forms:-?} cases" >&2; exit 1
  fi
  if grep -n -e '#<' -e '{1' -e 'sb-' -e 'quasiquote' "$tmp" >&2; then
    echo "generate.sh: $cases: implementation-specific output above; fix those cases" >&2; exit 1
  fi
  errors="$(grep -c '^error' "$tmp" || true)"
  mv "$tmp" "$out"
  chmod 644 "$out"
  total=$((total + lines))
  echo "$out: $lines cases ($errors error cases)" >&2
done
echo "generate.sh: $total cases in ${#files[@]} files" >&2
