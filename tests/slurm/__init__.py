"""Scenarios on a real local Slurm (munged, slurmctld, slurmd started by the fixture)."""
