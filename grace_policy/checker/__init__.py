"""The node checker (``checker=node``): one interpreter per node that forks
a child per miss. Its entry is :func:`grace_policy.nodecheck.main` (what
spank/grace_node.c starts from slurmd); its parts, one job each:

* :mod:`.wire`: the frames slurmstepd sends and the records it reads back
  (grace_policy/contract.py's layout, as spank/grace_wire.c's);
* :mod:`.creds`: becoming what slurmstepd is at user_init;
* :mod:`.mntns`: the job's mount namespace (its private /tmp), entered first;
* :mod:`.confine`: what the judging process may no longer do (also
  slurmstepd's helper's, through ``slurm_bridge.confine``);
* :mod:`.server`: the socket, the spare child and the children that judge;
* :mod:`.stale`: whether the install the server loaded has changed;
* :mod:`.syslog`: the one thing it says when it cannot start.
"""
