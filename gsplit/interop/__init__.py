"""Bridges to other GNN libraries, each an optional extra: ``gsplit.interop.pyg`` (``pip install "gsplit[pyg]"``).

Nothing is imported here, so ``import gsplit`` never needs the other libraries; import the submodule
you use.
"""
