"""Bridges to other GNN libraries, each an optional extra: ``gsplit.interop.dgl`` (``pip install -e ".[dgl]"`` in a clone)
and ``gsplit.interop.pyg`` (``pip install -e ".[pyg]"``); ``gsplit.interop.graphs`` is the one converter
every gsplit function that takes a graph calls (a gsplit ``Graph``, a ``DGLGraph`` or a PyG ``Data``).

Nothing is imported here, and none of these modules imports dgl or torch_geometric at import time, so
``import gsplit`` never needs the other libraries.
"""
