#!/usr/bin/env bash
# llmwalk's two commands (see README.md): ./llmwalk.sh lab | test [pytest args] | setup.
# The work is done by llmwalk_setup.py, which needs only Python (and runs the same on Windows and macOS).
set -euo pipefail
cd "$(dirname "$0")"
exec "${PYTHON:-python3}" llmwalk_setup.py "$@"
