"""Real-world batch scripts nobody wrote for this project: the examples in
Slurm's own documentation and source tree (Debian 12's slurm-wlm source
package, fetched with ``apt-get source --download-only`` pinned by version
and sha256, cached under ``~/.cache/grace-policy-tests/batch-corpus``,
never committed).

The scripts are taken as the documentation shows them: every ``<pre>``
block of ``doc/html/*.shtml`` and every ``.nf`` block of the man pages that
starts with ``#!/bin/``, up to the next shell prompt, plus the shell scripts
Slurm ships in ``contribs/`` and ``etc/``.
"""

from __future__ import annotations

import html
import re
import tarfile
from pathlib import Path

from corpus import CorpusUnavailable, _cached_tree, _run, sha256_file
from vm.images import _mirror

SOURCE = "slurm-wlm"
VERSION = "22.05.8-4+deb12u3"
ORIG = "slurm-wlm_22.05.8.orig.tar.gz"
ORIG_SHA256 = "8c8f6a26a5d51e6c63773f2e02653eb724540ee8b360125c8d7732314ce737d6"
#: Shell scripts of the source tree that are run like job scripts.
SHIPPED = ("contribs/sgather/sgather", "contribs/seff/smail", "etc/MailProg.example",
           "etc/prolog.example", "contribs/cray/cnselect", "contribs/cray/capmc")


def _apt_source(work: Path) -> Path:
    state = work / "apt"
    for d in ("lists/partial", "cache/archives/partial"):
        (state / d).mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text("deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                       f"{_mirror()} bookworm main\n")
    apt = ["apt-get", "-q", f"-oDir::State::Lists={state / 'lists'}",
           f"-oDir::Cache={state / 'cache'}", "-oDir::State::status=/dev/null",
           f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/nonexistent",
           "-oAcquire::Retries=1", "-oAPT::Sandbox::User=root"]
    _run([*apt, "update"])
    dl = work / "src"
    dl.mkdir()
    _run([*apt, "source", "--download-only", f"{SOURCE}={VERSION}"], cwd=dl, timeout=600)
    orig = dl / ORIG
    if not orig.is_file():
        raise CorpusUnavailable(f"{SOURCE}={VERSION}: {ORIG} not downloaded (bump the pin?)")
    got = sha256_file(orig)
    if got != ORIG_SHA256:
        raise CorpusUnavailable(f"{ORIG} has sha256 {got}, pinned {ORIG_SHA256}")
    return orig


def _doc_scripts(text: str, manpage: bool) -> list[str]:
    if manpage:
        blocks = [text]
    else:
        blocks = [html.unescape(re.sub(r"<[^>]+>", "", pre))
                  for pre in re.findall(r"<pre[^>]*>(.*?)</pre>", text, re.S)]
    out = []
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("#!/bin/"):
                continue
            script: list[str] = []
            for nxt in lines[i:]:
                if nxt.startswith("$ ") or (script and nxt.startswith("#!")):
                    break
                if manpage:
                    if nxt.startswith((".fi", ".IP", ".TP", ".SH", ".PP", ".RE")):
                        break
                    if nxt.startswith("."):
                        continue
                    for a, b in (("\\-", "-"), ("\\(dq", '"'), ("\\fB", ""), ("\\fR", ""),
                                 ("\\fI", ""), ("\\\\", "\\")):
                        nxt = nxt.replace(a, b)
                script.append(nxt)
            out.append("\n".join(script) + "\n")
    return out


def fetch_scripts() -> Path:
    """The corpus directory: one file per script, named after its source."""

    def build(work: Path) -> Path:
        orig = _apt_source(work)
        scripts = work / "scripts"
        scripts.mkdir()
        n = 0
        with tarfile.open(orig) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/", 1)
                if len(parts) != 2 or not member.isfile():
                    continue
                rel = parts[1]
                html_doc = rel.startswith("doc/html/") and rel.endswith(".shtml")
                man = rel.startswith("doc/man/man1/")
                if not (html_doc or man or rel in SHIPPED):
                    continue
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                text = handle.read().decode("utf-8", "replace")
                found = [text] if rel in SHIPPED else _doc_scripts(text, man)
                for script in found:
                    n += 1
                    name = rel.replace("/", "_")
                    (scripts / f"{n:03d}-{name}.sh").write_text(script)
        if n == 0:
            raise CorpusUnavailable(f"no scripts found in {ORIG}")
        return scripts

    return _cached_tree("batch-corpus", {"source": SOURCE, "version": VERSION,
                                          "sha256": ORIG_SHA256, "layout": 1}, build)
