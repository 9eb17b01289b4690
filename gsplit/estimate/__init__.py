"""Predict training time on hosts we do not have: a cost model of split- and data-parallel iterations.

``count_work`` counts every rank's exact work in one process, ``predict`` turns it into seconds on a device
profile (:mod:`gsplit.estimate.profiles`) and a link (:mod:`gsplit.estimate.links`), ``gsplit estimate`` does
both for users (:mod:`gsplit.cli.estimate`, ``gsplit estimate``). The model and its assumptions: :mod:`gsplit.estimate.model`;
full-graph training across hosts (``gsplit estimate --hosts``): :mod:`gsplit.estimate.hosts`.
"""

from gsplit.estimate.links import LINKS, Collective, LinkProfile, get_link
from gsplit.estimate.model import (DeviceProfile, IterationTime, LayerCosts, ModelShape, Prediction, layer_features,
                                   predict, simulate_iteration)
from gsplit.estimate.profiles import get_device
from gsplit.estimate.work import IterationWork, LayerWork, SplitPlan, count_work, dp_work, split_plan

__all__ = ["count_work", "split_plan", "dp_work", "IterationWork", "LayerWork", "SplitPlan", "predict",
           "simulate_iteration", "Prediction", "IterationTime", "ModelShape", "DeviceProfile", "LayerCosts",
           "layer_features", "LinkProfile", "Collective", "LINKS", "get_link", "get_device"]
