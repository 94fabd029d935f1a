#!/usr/bin/env bash
# Regenerate expected.txt from cases.lisp with SBCL.
# Usage: tests/differential/generate.sh   (from anywhere)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

command -v sbcl >/dev/null || { echo "generate.sh: sbcl not found on PATH" >&2; exit 1; }

tmp="$(mktemp)"
trap 'rm -f "$tmp" "$tmp.err"' EXIT

# --script implies --no-sysinit --no-userinit --disable-debugger.
sbcl --script driver.lisp cases.lisp "$tmp" 2> "$tmp.err" || {
  cat "$tmp.err" >&2; echo "generate.sh: sbcl failed" >&2; exit 1; }
cat "$tmp.err" >&2

# Sanity checks: one line per top-level form, nothing implementation-specific.
forms="$(sed -n 's/^cases: \([0-9]*\)$/\1/p' "$tmp.err")"
lines="$(wc -l < "$tmp")"
if [ -z "$forms" ] || [ "$forms" -ne "$lines" ]; then
  echo "generate.sh: $lines result lines but ${forms:-?} cases" >&2; exit 1
fi
if grep -n -e '#<' -e '{1' -e 'sb-' -e 'quasiquote' "$tmp" >&2; then
  echo "generate.sh: implementation-specific output above; fix those cases" >&2; exit 1
fi
errors="$(grep -c '^error' "$tmp" || true)"
mv "$tmp" expected.txt
chmod 644 expected.txt
echo "expected.txt: $lines cases ($errors error cases)" >&2
