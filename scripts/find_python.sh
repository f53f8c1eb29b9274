#!/usr/bin/env bash
# The path of a Python interpreter of version $1 (e.g. 3.12): python$1 on PATH, else one that
# pyenv installed; exit 1 naming the version when there is none.
set -euo pipefail
v="$1"
for candidate in "$(command -v "python$v" 2>/dev/null || true)" \
                 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c "import sys" >/dev/null 2>&1; then
    echo "$candidate"
    exit 0
  fi
done
echo "no Python $v here (python$v on PATH or under pyenv)" >&2
exit 1
