"""The kernels' paths, one interface for every ranker: :mod:`~aheadrank.kernels.attention` (the attention of a few
query rows over stored keys and values), :mod:`~aheadrank.kernels.layer` (a BERT layer, or a stack of them, over a
few rows) and :mod:`~aheadrank.kernels.tk` (TK's kernel stage) each hold the reference
PyTorch path and the hand-written C kernel (:mod:`aheadrank.kernels.native`) behind one signature, the kernel running
where it applies and its family is on (``AHEADRANK_NATIVE``: ``all``, ``none``, or a list of families);
:mod:`~aheadrank.kernels.stored` is how a stored field is read (int8 with scales, widened a block of documents at a
time); :mod:`~aheadrank.kernels.compiled` is a ranker's scoring through ``torch.compile``. ``bench/speed.py --paths``
measures the paths side by side; ``docs/performance.md`` has the table."""
