# Shared by scripts/demo.sh and scripts/test.sh: find Python 3.11+ and Java 17+, create .venv, install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "error: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

check_java() {
  if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17 or newer is required by Spark; install a JDK (e.g. apt-get install openjdk-17-jre-headless)" >&2
    return 1
  fi
  local version
  version=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  if [ -z "$version" ] || [ "$version" -lt 17 ]; then
    echo "error: Java 17 or newer is required by Spark; found: $(java -version 2>&1 | head -1)" >&2
    return 1
  fi
}

# ensure_venv EXTRAS: create .venv if missing and install the project with the given extras.
ensure_venv() {
  local extras="$1"
  check_java
  if [ ! -x .venv/bin/python ]; then
    "$(find_python)" -m venv .venv
  fi
  local stamp=".venv/.installed-$extras"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
    touch "$stamp"
  fi
}
