"""GNN layers on blocks, ready-made models, the split-parallel forward and loss."""

from gsplit.nn.deep import DeepGCN, DeepSAGE, ResPlusLayer
from gsplit.nn.dropout import relu_vertex_dropout, vertex_dropout
from gsplit.nn.forward import sp_forward
from gsplit.nn.layers import GATConv, GraphConv, SAGEConv
from gsplit.nn.loss import split_cross_entropy
from gsplit.nn.models import GAT, GCN, MODELS, SAGE, build_model

__all__ = ["SAGEConv", "GATConv", "GraphConv", "SAGE", "GAT", "GCN", "DeepSAGE", "DeepGCN", "ResPlusLayer", "MODELS",
           "build_model", "sp_forward", "split_cross_entropy", "vertex_dropout", "relu_vertex_dropout"]
