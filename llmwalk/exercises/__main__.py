"""python -m llmwalk.exercises: check every solution in solutions.py and print one line per exercise."""
import sys

from . import EXERCISES, check, solutions

failed = 0
for name, ex in EXERCISES.items():
    result = check(name, getattr(solutions, name))
    failed += not result.passed
    print(f"{ex.notebook:18} {name:18} {'pass' if result.passed else 'FAIL'}  ~{ex.minutes} min"
          + ("" if result.passed else f"\n{result}"))
sys.exit(1 if failed else 0)
