"""python -m llmwalk.exercises: check every solution in solutions.py and print one line per exercise."""
import sys

from . import EXERCISES, check, solutions

failed = 0
notebook, exercise = (max(len(x) for x in column) for column in zip(*((ex.notebook, n) for n, ex in EXERCISES.items())))
for name, ex in EXERCISES.items():
    result = check(name, getattr(solutions, name))
    failed += not result.passed
    print(f"{ex.notebook:{notebook}}  {name:{exercise}}  {'pass' if result.passed else 'FAIL'}  ~{ex.minutes} min"
          + ("" if result.passed else f"\n{result}"))
sys.exit(1 if failed else 0)
