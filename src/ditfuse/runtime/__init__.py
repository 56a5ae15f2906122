"""What every op shares at run time: where kernels run (``backend``), the record / replay of
repeat calls (``fastpath``) and the low-cost ``torch.library`` registration (``library``)."""
