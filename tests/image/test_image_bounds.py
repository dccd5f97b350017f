"""The squashfs reader's own bounds (issue 27 item 2) and the identity of
what it read (item 6), against images made by hand (tests/image/hostile_sqsh.py).

Each hostile image is judged in a fresh interpreter, as a step is: the
image is opened under the step's budget (``decide`` with the image's path,
what the bridge does through ``container.plan``), so the peak RSS it cost is
that process' own (``VmHWM``: ``getrusage``'s ``ru_maxrss`` inherits the
forking parent's peak through exec). The outcome must be ``check-limit``
and the peak RSS growth stay under :data:`RSS_BOUND`; the time it took and the growth are
printed (``-s``), never asserted. A subprocess timeout guards against a hang
(the old reader ran such listings for minutes): a guard, not a timing assert.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grace_policy import fsprobe
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.container import ContainerStep
from grace_policy.container.plan import plan
from grace_policy.decide import StepRequest, decide, step_budget
from grace_policy.image import squashfs
from grace_policy.image.open import open_image
from grace_policy.node import detect
from grace_policy.policy import Limits, Policy

from . import hostile_sqsh as hs
from .budgets import roomy

ROOT = Path(__file__).resolve().parents[2]
#: Growth of the judging process' peak RSS a hostile image may cause.
RSS_BOUND = 256 << 20
#: Far more than any of these takes: what ends them must be the reader's
#: own bounds, not the deadline (which the old reader did not look at while
#: the image was opened).
LIMITS = Limits(deadline_ms=60_000, max_files=100_000, max_bytes=1 << 30)

_CHILD = r"""
import json, resource, sys, time
from grace_policy.decide import StepRequest, decide
from grace_policy.node import detect
from grace_policy.policy import Limits, Policy
import grace_policy.check, grace_policy.image.open, grace_policy.image.squashfs  # noqa: F401


def hwm():
    # This process' own peak RSS (KiB). ru_maxrss is not: exec carries the
    # forking parent's peak into it, so a big pytest would hide any growth.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


path, argv0, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3])
policy = Policy(limits=Limits(deadline_ms=deadline, max_files=100_000, max_bytes=1 << 30))
node = detect()
before = hwm()
started = time.monotonic()
v = decide(policy, StepRequest(partition=None, argv=[argv0], env={"PATH": "/usr/bin:/bin"},
                               cwd="/", node=node, image=path))
elapsed = time.monotonic() - started
print(json.dumps({"rules": list(v.rule_ids), "error": v.error, "skipped": v.skipped,
                  "ms": round(elapsed * 1000, 1), "rss_kib": hwm() - before,
                  "peak_kib": hwm(),
                  "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def judge(image: Path, argv0: str) -> dict[str, object]:
    """The verdict of ``argv0`` in ``image``, judged in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(image), argv0,
                           str(LIMITS.deadline_ms)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{image.name}: {out['rules']} in {out['ms']} ms, peak RSS growth "
          f"{int(out['rss_kib']) // 1024} MiB (peak {int(out['peak_kib']) // 1024} MiB): "
          f"{out['error']}")
    return out


def bounded(out: dict[str, object]) -> None:
    assert out["rules"] == ["check-limit"], out
    assert int(out["rss_kib"]) * 1024 < RSS_BOUND, out


def test_one_name_repeated_in_a_huge_directory(tmp_path: Path) -> None:
    # 2.6 M entries of one name ("a"), 23 MiB of listing in ~190 KiB of
    # image. The old reader kept distinct names under its cap (one), so the
    # listing ran to its end while the image was opened, with no budget.
    img = hs.repeated_name_dir(tmp_path / "names.sqsh", groups=10_000)
    out = judge(img, "/x")
    bounded(out)
    assert "entries" in str(out["error"]) or "deadline" in str(out["error"]), out


def test_a_chain_of_stored_metadata_blocks(tmp_path: Path) -> None:
    # The same listing in 2,000 metadata blocks stored uncompressed (16 MiB
    # of image): the old reader neither ticked nor counted a stored block.
    img = hs.repeated_name_dir(tmp_path / "stored.sqsh", groups=7_000, stored=True)
    bounded(judge(img, "/x"))


def test_a_file_with_a_block_list_of_16_million_entries(tmp_path: Path) -> None:
    # /big: 16.7 M sparse blocks, a 64 MiB block list of zeros in ~250 KiB of
    # image. The old reader unpacked the whole list into a tuple when the
    # file was stat'ed and its offsets into a list when it was opened.
    img = hs.long_block_list(tmp_path / "blocks.sqsh", (1 << 24) - 16)
    out = judge(img, "/big")
    bounded(out)
    assert "block list" in str(out["error"]), out


def test_a_metadata_cache_flood(tmp_path: Path) -> None:
    # 300 MiB of listing (one 256-byte name repeated) in ~6 MiB of image:
    # the old reader cached every metadata block it decompressed, up to
    # 65,536 of 8 KiB (512 MiB), before clearing them.
    img = hs.repeated_name_dir(tmp_path / "flood.sqsh", name=b"n" * 256, groups=4_600)
    bounded(judge(img, "/x"))


def test_stored_metadata_counts_towards_the_inflate_cap(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    # 4 MiB of stored listing, 16,000 entries (under the entry cap): with the
    # cap on bytes produced lowered to 1 MiB, the stored chain must reach it.
    img = hs.repeated_name_dir(tmp_path / "cap.sqsh", name=b"s" * 256, groups=62,
                               stored=True)
    monkeypatch.setattr(squashfs, "MAX_INFLATE", 1 << 20)
    fd = os.open(img, os.O_RDONLY)
    view = squashfs.SquashView(fd, str(img), os.fstat(fd), budget=roomy())
    with pytest.raises(BudgetExceeded, match="1048576 bytes"):
        view.listdir("/")
    view.close()


def test_the_metadata_cache_is_bounded_in_bytes(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A listing of 60 MiB read through (the entry cap raised for this
    # test): what stays cached is at most MAX_META_CACHE.
    img = hs.repeated_name_dir(tmp_path / "cache.sqsh", name=b"c" * 256, groups=900)
    monkeypatch.setattr(squashfs, "MAX_DIR_ENTRIES", 1 << 30)
    fd = os.open(img, os.O_RDONLY)
    view = squashfs.SquashView(fd, str(img), os.fstat(fd), budget=roomy())
    assert view.listdir("/") == ["c" * 256]
    cached = sum(len(data) for data, _ in view._meta.values())
    view.close()
    assert cached <= 4 << 20, cached


def test_a_limit_while_the_image_is_planned_is_the_steps_check_limit(tmp_path: Path) -> None:
    # The bridge's order: the step's budget first, then container.plan reads
    # the image under it, then decide goes on with it (or reports its end).
    img = hs.repeated_name_dir(tmp_path / "plan.sqsh", groups=1_000)
    policy = Policy(on_error="deny", limits=LIMITS)
    budget = step_budget(policy)
    todo = plan(ContainerStep("pyxis", str(img), True, "pyxis step", ["/x"], {}, "/"),
                budget=budget)
    assert todo.image is None and todo.skipped is None and todo.limit, todo
    v = decide(policy,
               StepRequest(partition=None, argv=list(todo.argv), env=todo.env, cwd=todo.cwd,
                           node=detect(), image=todo.image, budget=budget, limit=todo.limit))
    assert v.rule_ids == ("check-limit",) and v.action == "reject", v
    assert "entries" in (v.error or ""), v.error


def test_the_budget_is_charged_from_the_first_byte(tmp_path: Path) -> None:
    img = hs.repeated_name_dir(tmp_path / "small.sqsh", groups=2)
    budget = Budget(deadline_ms=60_000, max_files=10, max_bytes=1 << 20)
    image = open_image(str(img), budget=budget)
    # The image is one file; its bytes are those read: the head, the
    # superblock and the metadata blocks of the root's listing.
    assert budget.files_left == 9 and 0 < budget.bytes_read <= img.stat().st_size + 64
    assert image.view.budget is budget  # type: ignore[attr-defined]
    image.view.close()  # type: ignore[attr-defined]
    spent = Budget(deadline_ms=60_000, max_files=10, max_bytes=100)
    with pytest.raises(BudgetExceeded, match="100 bytes"):
        open_image(str(img), budget=spent)


# -- identity (R9): what the verdict cache records is the file read -----------

def test_the_record_describes_the_file_read_not_what_the_name_became(tmp_path: Path
                                                                     ) -> None:
    path = tmp_path / "img.sqsh"
    hs.repeated_name_dir(path, groups=1)
    read = os.stat(path)
    image = open_image(str(path), budget=roomy())
    # Between the open and the record, another image is renamed over the name.
    other = hs.repeated_name_dir(tmp_path / "other.sqsh", name=b"b", groups=1)
    os.replace(other, path)
    swapped = os.stat(path)
    assert swapped.st_ino != read.st_ino
    probes: list[tuple[str, str, str]] = []
    decide(Policy(limits=LIMITS), StepRequest(partition=None, argv=["/a"], env={}, cwd="/",
                                              node=detect(), image=image), probes=probes)
    recorded = [answer for op, name, answer in probes if name == str(path)]
    # The file read (its ctime moved: the rename unlinked it), not the other.
    assert len(recorded) == 1, probes
    assert recorded[0].startswith(f"f{read.st_dev}:{read.st_ino}:{read.st_size}:"), recorded
    assert not recorded[0].startswith(f"f{swapped.st_dev}:{swapped.st_ino}:"), recorded
    # So the C side's replay (a stat of the name) never matches: the entry
    # cannot stand for the file now there.
    assert fsprobe.answer("s", str(path)) != recorded[0]
    assert image.identity.startswith(f"{read.st_dev}:{read.st_ino}:")
    image.view.close()  # type: ignore[attr-defined]


def test_a_directory_swapped_while_it_is_listed_is_never_replayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's listings (a library or site directory) are recorded by the
    # directory's identity: the one listed, or CHANGED when the name moved
    # to another directory during the listing.
    site, other = tmp_path / "site", tmp_path / "other"
    site.mkdir()
    other.mkdir()
    (other / "foreign.so").touch()
    real_listdir = os.listdir

    def swapping(path: str) -> list[str]:
        os.rename(site, tmp_path / "away")
        os.rename(other, site)  # the listing sees the other directory
        return real_listdir(path)

    files = fsprobe.Files.recorded()
    monkeypatch.setattr(os, "listdir", swapping)
    names = files.listdir(str(site))
    monkeypatch.setattr(os, "listdir", real_listdir)
    probes = files.records()
    assert names == ["foreign.so"]
    assert probes == [("D", str(site), fsprobe.CHANGED)], probes
    # Without a swap the answer is the directory's, and it replays.
    files = fsprobe.Files.recorded()
    files.listdir(str(site))
    (record,) = files.records()
    assert record[2] != fsprobe.CHANGED and fsprobe.still_true([record])
