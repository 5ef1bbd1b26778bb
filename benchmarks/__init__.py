"""Benchmarks: loops_nb's hot paths against a plain reference, measured side by side in one run.

    uv run python -m benchmarks              # all of them
    uv run python -m benchmarks trainer      # one

Each prints a row: what, loops_nb's number, the reference's, their ratio and the aim. Tests never
assert on timings; docs/benchmarks.md records the numbers and the machine they ran on.
"""
