"""The kernels' paths, one interface for every ranker: the reference (the rankers' PyTorch code), the compiled
path (:mod:`aheadrank.kernels.compiled`: the same code through ``torch.compile``), and the hand-written C kernels
(:mod:`aheadrank.kernels.native`), selected per family by ``AHEADRANK_NATIVE`` (``all``, ``none``, or a list of families).
``bench/speed.py --paths`` measures them side by side; ``docs/performance.md`` has the table."""
