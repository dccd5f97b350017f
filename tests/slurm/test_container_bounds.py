"""A hostile container image on a real Slurm (issue 27 item 2): the bridge
makes the step's budget before ``container.plan`` opens the image, so an
image the reader cannot finish within its bounds is the step's
``check-limit`` (``Plan.limit``), never a hang of slurmstepd or a skip.

The image is made by hand (tests/image/hostile_sqsh.py): its root directory
repeats one name 2.6 M times. The reader stops after 131,072 entries read;
the reader before stopped only after reading the whole listing, with no
deadline, while the image was planned (7.8 s in slurmstepd here, then a
false ``exe-not-found``).
"""

from __future__ import annotations

import pytest
from image import hostile_sqsh

from .test_containers import PREFIX, Pyxis, pyxis  # noqa: F401  (the cluster with pyxis)

pytestmark = pytest.mark.slurm


def test_an_image_past_the_readers_bounds_is_the_steps_check_limit(pyxis: Pyxis  # noqa: F811
                                                                   ) -> None:
    pyxis.use()
    hostile_sqsh.repeated_name_dir(pyxis.slurm.cluster.shared / "names.sqsh", groups=10_000)
    before = len(pyxis.slurm.audit_lines())
    res = pyxis.srun(["--container-image=./names.sqsh", "tool"])
    assert "Traceback" not in res.stderr
    [rec] = pyxis.records(before)
    print(f"\nhostile image in slurmstepd: {rec['rules']} after {rec.get('elapsed_ms')} ms")
    assert rec["rules"] == ["check-limit"], rec
    assert "more than 131072 entries" in str(rec.get("error")), rec
    assert rec["skipped"] is None
