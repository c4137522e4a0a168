"""Layer 7 (research; `recall` is its sibling, and neither imports the other): the instruments, what a study
measures with. Metrics of a selection, synthetic probes, prompts with planted facts for a real model, observation of
a real decode, statistics (intervals, paired tests), real text from the standard library, agent workloads, the lossy
peers (kvpress, HQQ, transformers' generate) and sweeps. Each is used by several notebooks; a notebook's own study
lives in `sparsekv.studies`.
"""
