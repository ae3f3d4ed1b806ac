"""numpy/heapq references: the trusted definition of each DDTree stage (plans/contracts.md).

One module per stage, each a plain function over numpy arrays returning the contract's named outputs.
They depend on numpy alone (ml_dtypes only where bf16 is decoded) so any engine can run them.
"""
