#!/usr/bin/env bash
# Writes the man page of one of tide's programs from its --help with help2man, plus the
# hand-written sections of dist/man/NAME.h2m; for tidectl also a COMMANDS section made of
# every command's own --help (its options without the global ones). The build runs it
# when help2man is installed; dist/man/NAME.1 holds the pages it made, installed where
# help2man is missing (tests/test_dist.sh checks that the two agree).
#   usage: gen-man.sh HELP2MAN PROGRAM NAME VERSION DESCRIPTION H2M OUT
set -euo pipefail
HELP2MAN=$1 PROG=$2 NAME=$3 VERSION=$4 DESC=$5 H2M=$6 OUT=$7
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# roff text from plain text: backslashes escaped, no line read as a request
roff() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

includes=(-i "$H2M")
if [ "$NAME" = tidectl ]; then
  help=$("$PROG" --help)
  globals=$(sed -n '/^global options:/,/^$/p' <<<"$help" | grep -oE '^  --[a-z-]+' | tr -d ' ')
  {
    echo "[COMMANDS]"
    echo "Each command takes the global options above and its own:"
    sed -n '/^commands:/,/^$/p' <<<"$help" | awk 'NR > 1 && NF {print $1}' |
      while read -r cmd; do
        chelp=$("$PROG" "$cmd" --help)
        usage=$(grep -m1 '^usage: ' <<<"$chelp" | sed 's/^usage: //')
        echo ".SS \"$cmd\""
        echo ".B $(roff <<<"$usage")"
        echo ".PP"
        head -n 1 <<<"$chelp" | roff
        sed -n '/^options:/,$p' <<<"$chelp" | tail -n +2 | while IFS= read -r line; do
          flag=$(sed -E 's/^  (-h, )?(--[a-z0-9-]+( V)?).*/\2/' <<<"$line")
          name=${flag%% V}
          grep -qxF -- "$name" <<<"$globals" && continue
          case "$name" in --help | --version | -h*) continue ;; esac
          text=$(sed -E 's/^  \S+( V)? +//' <<<"$line")
          echo ".TP"
          echo "\\fB$(sed 's/-/\\-/g' <<<"$name")\\fR${flag#"$name"}"
          roff <<<"$text"
        done
      done
  } >"$TMP/commands.h2m"
  includes+=(-i "$TMP/commands.h2m")
fi
"$HELP2MAN" -N -s 1 -m "tide manual" -S "tide $VERSION" --version-string="$VERSION" \
  -n "$DESC" "${includes[@]}" -o "$TMP/page.1" "$PROG"
mv "$TMP/page.1" "$OUT"
