"""``make bench``: how much the plugin adds to a step launch, measured.

Not tests: nothing here asserts a time. See docs/PERFORMANCE.md for the last
table and bench/run.py for how each figure is taken.
"""
