"""Batch scripts: what a job script will run, read (never run) before its
first line.

The batch step's program is slurmd's copy of the script; the commands that
fail on a Grace node (a venv's python built on the login node, an x86_64
tool on PATH) run *inside* it and never become steps of their own. This
package parses the script with tree-sitter-bash (:mod:`.shparse`), follows
its main path with the environment it builds (:mod:`.walk`, :mod:`.words`,
:mod:`.envs`) and judges each command as the step it will be with
:func:`grace_policy.check.check_step` (:mod:`.judge`). Imported only for
batch steps and ``grace-policy check --batch``.
"""
