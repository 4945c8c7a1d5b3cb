#!/usr/bin/env bash
# The release as users get it. `--setup` builds the sdist and the wheel (the wheel from the
# sdist, as `python -m build` does), checks their metadata (`twine check --strict`), checks
# that the sdist's wheel equals one built straight from the tree, and installs the wheel with
# its `eval` extra into a fresh virtual environment for the oldest and the newest CPython that
# lola supports. `--check` then runs, in each environment and from a folder outside the
# repository (nothing of the source tree on the path): `lola --help`, the README's first
# Python example, one `lola niah` sample (its results.json must record the installed version),
# the third-party policy of examples/unfamiliar-policy installed with pip and used by name, and,
# under the CPython other than the contributor's, the test suite against the installed wheel
# (less the property tests, which ran twice under the contributor's).
#
# Usage (from the repository root, in the contributor's .venv, which has build and twine):
#   bash .ci/release_check.sh --setup && bash .ci/release_check.sh --check
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work="$repo/build/release"

# The oldest CPython lola declares (requires-python) and the newest on the machine (pyenv's
# builds; Debian's python3 otherwise).
oldest=$(python -c "import re, tomllib; print(re.search(r'>=\s*(3\.\d+)', tomllib.load(open('pyproject.toml', 'rb'))['project']['requires-python']).group(1))")
python_for() {  # python_for 3.11 -> the path of an interpreter of that minor version
  local v=$1 found
  if found=$(command -v "python$v") && "$found" -c "" 2>/dev/null; then "$found" -c "import sys; print(sys.executable)"; return; fi
  if command -v pyenv > /dev/null; then
    found=$(pyenv versions --bare | grep -E "^${v//./\\.}\.[0-9]+$" | sort -V | tail -1)
    [ -n "$found" ] && { echo "$(pyenv root)/versions/$found/bin/python$v"; return; }
  fi
  echo "no CPython $v on this machine (requires-python in pyproject.toml names it)" >&2
  return 1
}
newest=$( { command -v pyenv > /dev/null && pyenv versions --bare; python3 -c "import sys; print('%d.%d.%d' % sys.version_info[:3])"; } \
  | grep -E '^3\.[0-9]+\.[0-9]+$' | sort -V | tail -1 | cut -d. -f1,2)
pythons=("$oldest")
[ "$newest" != "$oldest" ] && pythons+=("$newest")

setup() {
  rm -rf "$work" && mkdir -p "$work/dist" "$work/direct"
  python -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
  python -m build --wheel --outdir "$work/direct" . > "$work/build-direct.log" 2>&1 || { cat "$work/build-direct.log" >&2; exit 1; }
  twine check --strict "$work"/dist/*
  python - "$work"/dist/*.whl "$work"/direct/*.whl <<'EOF'
import sys, zipfile
a, b = (zipfile.ZipFile(p) for p in sys.argv[1:3])
names_a, names_b = sorted(a.namelist()), sorted(b.namelist())
if names_a != names_b:
    sys.exit(f"the sdist's wheel and the tree's differ in files: {sorted(set(names_a) ^ set(names_b))}")
changed = [n for n in names_a if a.read(n) != b.read(n)]
if changed:
    sys.exit(f"the sdist's wheel and the tree's differ in content: {changed}")
print(f"the sdist builds the same wheel as the tree ({len(names_a)} files)")
EOF
  local wheel
  wheel=$(ls "$work"/dist/*.whl)
  for v in "${pythons[@]}"; do
    local py env="$work/py$v"
    py=$(python_for "$v")
    "$py" -m venv "$env"
    # torch first, as the README installs it: the machine's CPU wheel where pip has one for
    # this Python, else the package index's.
    "$env/bin/pip" install -q torch==2.13.0 > "$work/pip$v.log" 2>&1 || { cat "$work/pip$v.log" >&2; exit 1; }
    "$env/bin/pip" install -q "$wheel[eval]" pytest pytest-xdist hypothesis numpy >> "$work/pip$v.log" 2>&1 || { cat "$work/pip$v.log" >&2; exit 1; }
    echo "installed $(basename "$wheel") into CPython $("$env/bin/python" -c 'import platform; print(platform.python_version())')"
  done
}

check() {
  local run here_version
  here_version=$(python -c "import sys; print('%d.%d' % sys.version_info[:2])")
  for v in "${pythons[@]}"; do
    local env="$work/py$v"
    run=$(mktemp -d)
    # A folder outside the repository, no PYTHONPATH: lola is the installed wheel or nothing.
    (
      cd "$run"
      unset PYTHONPATH
      export PATH="$env/bin:$PATH"
      echo "== CPython $v: $(python -c 'import lola, os; print(lola.__version__, os.path.dirname(lola.__file__))')"
      python -c "import lola, sys; sys.exit('lola imported from the source tree' if lola.__file__.startswith('$repo/src/') else 0)"
      lola --help > /dev/null
      awk '/^```python$/{f=1;next} /^```$/{if(f)exit} f' "$repo/README.md" > first_example.py
      python first_example.py > first_example.out 2> first_example.err || { cat first_example.err >&2; exit 1; }
      echo "README's first example: $(cat first_example.out)"
      grep -q "7" first_example.out || { echo "the README's first example did not answer the pass-key" >&2; exit 1; }
      lola niah --samples 1 --lengths 1024 --out niah > niah.log 2>&1 || { cat niah.log >&2; exit 1; }
      python - <<'EOF'
import json
from importlib.metadata import version
v = json.load(open("niah/results.json"))["versions"]
assert v["lola"] == version("lola-attention"), v
assert v["commit"] is None, v  # an installed wheel records its release, not a commit
print("lola niah --samples 1:", v)
EOF
      pip install -q "$repo/examples/unfamiliar-policy" > plugin.log 2>&1 || { cat plugin.log >&2; exit 1; }
      awk '/^```python$/{f=1;next} /^```$/{if(f)exit} f' "$repo/examples/unfamiliar-policy/README.md" > plugin_example.py
      python plugin_example.py > plugin_example.out 2> plugin_example.err || { cat plugin_example.err >&2; exit 1; }
      echo "the plug-in's example: $(head -1 plugin_example.out)"
      grep -q "^Unfamiliar(eps=1e-06)" plugin_example.out
      # Under another CPython than the contributor's (whose suite ran from the source tree): the
      # test suite against the installed wheel (tests/ copied with the files they read, no src/
      # beside them), less the real model's tests and the docs' examples (the contributor's run),
      # and less the property tests: their equivalences are arithmetic, which the interpreter does
      # not change, and they ran twice above (the README's run and the derandomised profile); every
      # example test still imports and runs each module under this CPython.
      if [ "$v" != "$here_version" ]; then
        cp -r "$repo/tests" "$repo/docs" "$repo/pyproject.toml" "$repo/README.md" "$repo/CHANGELOG.md" .
        python -m pytest -q -p no:cacheprovider tests -m "not model and not hypothesis" --ignore=tests/docs 2>&1 | tail -25
      fi
    )
    rm -rf "$run"
  done
}

case "${1:-}" in
  --setup) setup ;;
  --check) check ;;
  *) echo "usage: $0 --setup|--check" >&2; exit 2 ;;
esac
