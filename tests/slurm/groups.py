"""Which tests/slurm files belong together, for the release matrix and for
``make test``'s parts (tests/parts.py). Constants only: tests/parts.py reads
this module without pytest's plugins or the test package around it.

The container files need pyxis/enroot/runc's build and run deps, which the
cached release roots do not hold, and a root entered by pivot_root (enroot
makes a user namespace and pyxis moves tasks into the container's mount
namespace: neither works in a chroot), so the matrix runs them in the newest
release only (test_containers_in_the_newest_release), after installing them.
Apptainer (the root's own package), pyxis' batch step and enroot's mounts
run there too, and job_container/tmpfs: the job's namespace, entered with
setns, resets a process's root to the namespace's, which from a chroot is
the host's (the 24.11 run's steps could not find their own directories).
(It failed there under load once: the pivoted root's namespace had a
higher id than a job's made on the other CPU, so slurmstepd could not bind
the job's namespace; roots.Root._pivot_argv now makes it the lowest.)

On the host they are a part of their own: the 22.05 scenarios were the
second-longest part of a warm run (10.7 min, mostly waiting on Slurm), and
the container files are half of it.
"""

CONTAINERS = ("tests/slurm/test_containers.py", "tests/slurm/test_container_python.py",
              "tests/slurm/test_apptainer_slurm.py", "tests/slurm/test_after_pull.py",
              "tests/slurm/test_pyxis_batch.py", "tests/slurm/test_enroot_mounts.py",
              "tests/slurm/test_oci_path.py", "tests/slurm/test_registry.py",
              "tests/slurm/test_job_container.py", "tests/slurm/test_named_containers.py",
              "tests/slurm/test_container_cache.py", "tests/slurm/test_container_bounds.py")
