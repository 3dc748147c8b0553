#!/bin/sh
# Checks that every quote of example code in a Markdown file matches its
# source. A quote is an HTML comment naming the file and the marker name,
# followed by a fenced code block:
#
#   <!-- snippet: examples/01_word_lm/model.hpp word_lm_step -->
#   ```cpp
#   ...the lines between `// example-begin word_lm_step` and `// example-end`,
#   with their common indentation removed...
#   ```
#
#   check_snippets.sh <repository root> <markdown file, relative to the root>
set -eu
root=$1 doc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
count=0
# List the quotes: "<source> <name> <first line of the block>".
awk '/^<!-- snippet: / { src = $3; name = $4; want = 1; next }
     want && /^```/ { print src, name, NR + 1; want = 0 }' "$root/$doc" > "$tmp/quotes"
while read -r src name line; do
  count=$((count + 1))
  # The quote: from `line` to the closing fence.
  awk -v first="$line" 'NR >= first { if (/^```/) exit; print }' "$root/$doc" > "$tmp/quote"
  # The source region, de-indented by its smallest indentation.
  if [ ! -f "$root/$src" ]; then
    echo "$doc: quote '$name' names $src, which does not exist"
    status=1
    continue
  fi
  awk -v name="$name" '
    $0 ~ "// example-begin " name "$" { inside = 1; next }
    inside && /\/\/ example-end/ { inside = 0; found = 1; exit }
    inside { lines[++n] = $0 }
    END {
      if (!found) { exit 2 }
      min = -1
      for (i = 1; i <= n; ++i) if (lines[i] ~ /[^ ]/) { match(lines[i], /^ */); if (min < 0 || RLENGTH < min) min = RLENGTH }
      if (min < 0) min = 0
      for (i = 1; i <= n; ++i) print substr(lines[i], min + 1)
    }' "$root/$src" > "$tmp/source" || {
    echo "$doc: quote '$name': no '// example-begin $name' ... '// example-end' region in $src"
    status=1
    continue
  }
  if ! diff -u "$tmp/source" "$tmp/quote" > "$tmp/diff"; then
    echo "$doc: quote '$name' (line $line) differs from $src:"
    cat "$tmp/diff"
    status=1
  fi
done < "$tmp/quotes"
if [ "$count" -eq 0 ]; then
  echo "$doc: no quotes found"
  exit 1
fi
[ "$status" -eq 0 ] && echo "$doc: $count quotes match their sources"
exit "$status"
