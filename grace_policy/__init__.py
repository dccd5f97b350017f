"""grace-policy: stop Slurm job steps that would crash on the node they land on.

Importing the package is cheap on purpose: it runs inside slurmstepd on every
step launch, so submodules are imported only where they are needed.
"""

__version__ = "0.1.0"
