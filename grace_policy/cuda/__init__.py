"""CUDA kernels and the node's GPUs (issue 26).

Whether the kernels a step loads can run on the GPUs it was given: what each
ELF file's fat binaries hold (:mod:`.fatbin`), the CUDA driver's rules for
picking a kernel image (:mod:`.arch`), the node's GPUs as NVML reports them
(:mod:`.nvml`), which of them the step got (:mod:`.stepgpus`), and the
judgement that turns these into issues (:mod:`.judge`). Nothing here is
imported by a step that has no GPU work to judge.
"""
