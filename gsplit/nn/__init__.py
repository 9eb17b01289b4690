"""GNN layers on blocks, ready-made models, and the split-parallel forward/loss/gradient helpers."""

from gsplit.nn.dropout import vertex_dropout
from gsplit.nn.layers import GATConv, GraphConv, SAGEConv
from gsplit.nn.models import GAT, GCN, MODELS, SAGE, build_model
from gsplit.nn.split import allreduce_gradients, global_sum, sp_forward, split_cross_entropy

__all__ = ["SAGEConv", "GATConv", "GraphConv", "SAGE", "GAT", "GCN", "MODELS", "build_model",
           "sp_forward", "split_cross_entropy", "vertex_dropout", "allreduce_gradients", "global_sum"]
