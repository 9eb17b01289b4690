"""``gsplit train --task link``: trains on a seeded edge split, reports MRR and Hits@K, and refuses what it
does not support (or what makes no sense) in one line."""

from __future__ import annotations

import json

import pytest

from gsplit.cli import main

DATA = ["--dataset", "synthetic", "-D", "num_nodes=600", "-D", "feature_dim=6"]
SMALL = ["--fanouts", "4,3", "--hidden", "8", "--batch-size", "64", "--epochs", "2", "--device", "cpu",
         "--eval-negatives", "20", "--hits-k", "10"]


def test_link_training_from_the_command_line(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    tb = tmp_path / "tb"
    argv = ["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "2", "--neg-ratio", "2", "--predictor", "mlp",
            "--log", str(log)] + (["--tensorboard", str(tb)] if _has_tensorboard() else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "validation and" in out and "held out of the message-passing graph" in out
    assert "final test: MRR" in out and "Hits@10" in out
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["type"] for r in records] == ["run", "epoch", "epoch", "summary"]
    summary = records[-1]
    assert summary["task"] == "link" and summary["world_size"] == 2 and summary["exclude"] == "reverse_id"
    for key in ("final_val_mrr", "final_test_mrr"):
        assert 1 / 21 <= summary[key] <= 1, key   # a rank among 20 negatives is at most 21
    for key in ("final_val_hits@10", "final_test_hits@10"):
        assert 0 <= summary[key] <= 1, key
    # the model learns: the second epoch's loss is below the first's
    assert records[2]["loss"] < records[1]["loss"]
    assert summary["val_edges"] > 0 and summary["test_edges"] > summary["val_edges"]
    if _has_tensorboard():  # the epochs' loss and times, and the final MRR / Hits@K
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        tags = set()
        for events in tb.glob("events.out.tfevents.*"):
            acc = EventAccumulator(str(events))
            acc.Reload()
            tags |= set(acc.Tags()["scalars"])
        assert {"loss", "time/epoch", "final_mrr/test", "final_hits@10/val"} <= tags, tags


def _has_tensorboard() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


@pytest.mark.parametrize("extra, message", [
    (["--neg-ratio", "0"], "--neg-ratio 0: pass at least 1"),
    (["--full-graph"], "--full-graph is not supported with --task link yet"),
    (["--system", "full"], "--system full is not supported with --task link"),
    (["--precision", "bf16"], "--precision is not supported with --task link yet"),
    (["--edge-split", "0.6,0.5"], "leave none for training"),
    (["--edge-split", "half"], "pass two fractions VAL,TEST"),
])
def test_link_refuses_in_one_line(extra, message, capsys):
    assert main(["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gsplit: error:") and message in err[0], err


@pytest.mark.parametrize("fanouts, layers", [([], "3"), (["--layers", "2"], "2"), (["--fanouts", "3", "--layers", "2"], "2")])
def test_link_takes_the_node_tasks_fanout_defaults(fanouts, layers, tmp_path, capsys):
    """Without --fanouts link training uses 15,10,5 as node classification does; --layers N repeats one fanout
    (a link run without --fanouts once failed with AttributeError on the H200)."""
    small = [a for a in SMALL if a not in ("--fanouts", "4,3")]
    log = tmp_path / "log.jsonl"
    argv = ["train", "--task", "link", *DATA, *small, *fanouts, "--num-ranks", "1", "--epochs", "1",
            "--max-iters", "1", "--log", str(log)]
    if fanouts == ["--layers", "2"]:  # mini-batch --layers needs a fanout to repeat: one line, as for node tasks
        assert main(argv) == 2 and "--layers 2 needs --fanouts" in capsys.readouterr().err
        return
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads(log.read_text().splitlines()[0])["config"]
    assert len(config["fanouts"]) == int(layers), config["fanouts"]


def test_link_refuses_graphs_it_cannot_split(tmp_path, capsys):
    loops = tmp_path / "loops.txt"
    loops.write_text("0 0\n1 1\n2 2\n")
    chain = tmp_path / "chain.txt"
    chain.write_text("".join(f"{i} {i + 1}\n" for i in range(40)))
    cases = [
        (["--dataset", f"edgelist:{loops}"], "no edges"),
        (["--dataset", f"edgelist:{chain}", "-D", "symmetric=false"], "graph is directed"),
        (["--dataset", "ogbl-collab"], "OGB link datasets"),
    ]
    for data, message in cases:
        assert main(["train", "--task", "link", *data, *SMALL, "--num-ranks", "1"]) == 2, data
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (data, err)


def test_edge_split_holds_out_both_directions():
    import torch

    import gsplit
    from gsplit.link.edge_split import split_edges

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=1)
    s = split_edges(ds.graph, 0.1, 0.2, seed=4)
    assert s.undirected and torch.equal(split_edges(ds.graph, 0.1, 0.2, seed=4).test[1], s.test[1])
    n = ds.graph.num_nodes
    train = set((s.graph.edge_dst() * n + s.graph.indices).tolist())
    held = [(u, v) for part in (s.val, s.test) for u, v in zip(*(t.tolist() for t in part))]
    assert held and not any(v * n + u in train or u * n + v in train for u, v in held)
    undirected = int((ds.graph.indices < ds.graph.edge_dst()).sum())
    assert s.test[0].numel() == round(0.2 * undirected) and s.val[0].numel() == round(0.1 * undirected)
    assert s.graph.num_edges == ds.graph.num_edges - 2 * len(held)


def test_link_trainer_is_the_same_on_one_and_two_ranks():
    """The same global mini-batches (2 ranks x B edges = 1 rank x 2B), negatives and picks: the same losses
    and final metrics, up to float32 rounding."""
    import torch

    import gsplit
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import LinkTrainConfig, train_link_rank

    ds = gsplit.datasets.load("synthetic", num_nodes=400, seed=2, feature_dim=6)
    split = split_edges(ds.graph, 0.05, 0.1, seed=0)
    cfg = dict(fanouts=[4, 3], hidden=8, epochs=2, neg_ratio=2, predictor="mlp", eval_negatives=20, hits_k=10,
               max_iters=4)
    one = train_link_rank(0, 1, LinkTrainConfig(batch_size=64, **cfg), split, ds.features, ds.graph, None)
    owner = torch.randint(0, 2, (ds.graph.num_nodes,), generator=torch.Generator().manual_seed(0))
    two = gsplit.launch(train_link_rank, 2, args=(LinkTrainConfig(batch_size=32, **cfg), split, ds.features,
                                                  ds.graph, owner))
    for a, b in zip(one["epochs"], two[0]["epochs"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    for key in ("final_val_mrr", "final_test_mrr", "final_test_hits@10"):
        assert one[key] == pytest.approx(two[0][key], abs=1e-3) and two[0][key] == two[1][key], key


@pytest.mark.parametrize("predictor", ["dot", "mlp"])
def test_link_evaluation_in_chunks_equals_all_at_once(predictor, monkeypatch):
    """The per-edge negatives are scored in chunks of edges (all at once they would hold edges x negatives x
    hidden floats: GBs at 100k vertices); chunks of 3 edges give the MRR and Hits@K of one chunk."""
    import torch

    import gsplit
    from gsplit.comm import Communicator
    from gsplit.link import train as link_train
    from gsplit.link.edge_split import split_edges
    from gsplit.nn import build_model

    ds = gsplit.datasets.load("synthetic", num_nodes=400, seed=2, feature_dim=6)
    split = split_edges(ds.graph, 0.05, 0.1, seed=0)
    cfg = link_train.LinkTrainConfig(fanouts=[4, 3], hidden=8, eval_negatives=20, hits_k=10, predictor=predictor)
    torch.manual_seed(0)
    model = build_model("sage", 6, 8, 8, num_layers=2)
    pred = None if predictor == "dot" else torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                                                 torch.nn.Linear(8, 1))
    negs = link_train.evaluation_negatives(split, cfg, ds.graph)
    args = (model, pred, split, ds.features, negs, None, Communicator(), torch.device("cpu"), 10)
    whole = link_train.evaluate_link(*args)
    monkeypatch.setattr(link_train, "_EVAL_CHUNK_VALUES", 3 * 20 * 8)  # 3 edges per chunk
    calls, real = [], link_train.score_pairs
    monkeypatch.setattr(link_train, "score_pairs", lambda p, u, v: (calls.append(u.shape[0]), real(p, u, v))[1])
    chunked = link_train.evaluate_link(*args)
    held_out = split.val[0].numel() + split.test[0].numel()
    assert calls.count(3) >= held_out // 3 - 2, calls  # the per-edge negatives went 3 edges at a time
    for key in ("final_val_mrr", "final_test_mrr", "final_test_hits@10"):
        assert chunked[key] == pytest.approx(whole[key], abs=1e-6), key
    assert 1 / 21 <= whole["final_test_mrr"] <= 1


def test_edge_presampling_counts_the_edge_sampler_s_batches(capsys):
    """The top level of the weights is how often a vertex is a target: an endpoint of a positive or negative
    pair of a global edge mini-batch, as the edge sampler plans them; a map made from them partitions."""
    import torch

    import gsplit
    from gsplit.link import negative
    from gsplit.link.presample import presample_edges
    from gsplit.sampling.batches import global_batches

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=1)
    eids = torch.arange(0, ds.graph.num_edges, 3)
    s = gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([3, 2]), exclude="self",
                                          negative_sampler=negative.Uniform(2))
    w = presample_edges(ds.graph, eids, s, batch_size=40, epochs=2, seed=5, num_parts=2)
    counts, n = torch.zeros(ds.graph.num_nodes), 0
    for epoch in range(2):
        for it, batch in enumerate(global_batches(eids, 80, 5, epoch)):
            counts[s.plan(ds.graph, batch, epoch, it).seeds] += 1
            n += 1
    assert w.num_batches == n and torch.allclose(w.level_vertex_weights[-1], counts / n)
    assert w.batch_size == 80 and w.metadata["task"] == "link"
    pmap = gsplit.partition(ds.graph, 2, method="gsplit", weights=w)
    assert sorted(pmap.assignment.unique().tolist()) == [0, 1]
    argv = ["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "2", "--presample", "sampled",
            "--presample-epochs", "1", "--epochs", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "partition map (gsplit, sampled pre-sampling, 2 parts)" in out and "pairs: scoring imbalance" in out


def test_link_checkpoint_resume_is_exact(tmp_path):
    """Two epochs in one run equal one epoch, then a resumed run to two (losses, metrics, weights)."""
    import dataclasses

    import torch

    import gsplit
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import LinkTrainConfig, train_link_rank
    from gsplit.run.model_io import load_model

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=2, feature_dim=6)
    split = split_edges(ds.graph, 0.05, 0.1, seed=0)
    cfg = LinkTrainConfig(fanouts=[4, 3], hidden=8, epochs=2, batch_size=64, predictor="mlp", eval_negatives=20,
                          hits_k=10, max_iters=3, dropout=0.2)
    straight = train_link_rank(0, 1, dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "a")), split,
                               ds.features, ds.graph, None)
    half = dataclasses.replace(cfg, epochs=1, checkpoint_dir=str(tmp_path / "b"))
    train_link_rank(0, 1, half, split, ds.features, ds.graph, None)
    resumed = train_link_rank(0, 1, dataclasses.replace(half, epochs=2, resume=True), split, ds.features, ds.graph,
                              None)
    assert [e["epoch"] for e in resumed["epochs"]] == [1]
    assert resumed["epochs"][0]["loss"] == straight["epochs"][1]["loss"]
    assert resumed["final_test_mrr"] == straight["final_test_mrr"]
    a, b = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    assert a.train_config["task"] == "link" and (tmp_path / "b" / "predictor.pt").exists()
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, name   # weights; dropout's step counter


def test_link_checkpoint_every_resumes_mid_epoch_exactly(tmp_path, monkeypatch):
    """checkpoint_every=2: a run killed right after its checkpoint inside epoch 0 and resumed ends as an
    uninterrupted run does (the next epoch's loss, the metrics, the weights); the resumed epoch's record says
    it is partial."""
    import dataclasses

    import torch

    import gsplit
    import gsplit.link.train as link_train
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import LinkTrainConfig, train_link_rank
    from gsplit.run.model_io import load_model

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=2, feature_dim=6)
    split = split_edges(ds.graph, 0.05, 0.1, seed=0)
    cfg = LinkTrainConfig(fanouts=[4, 3], hidden=8, epochs=2, batch_size=64, predictor="mlp", eval_negatives=20,
                          hits_k=10, max_iters=3, dropout=0.2, checkpoint_every=2)
    straight = train_link_rank(0, 1, dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "a")), split,
                               ds.features, ds.graph, None)
    save = link_train.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(directory, model, optimizer, counters, **kwargs):
        save(directory, model, optimizer, counters, **kwargs)
        if counters["iteration"]:  # inside an epoch (at step 2: epoch 0, iteration 2)
            raise Killed

    monkeypatch.setattr(link_train, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train_link_rank(0, 1, dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "b")), split, ds.features,
                        ds.graph, None)
    monkeypatch.setattr(link_train, "save_checkpoint", save)
    resumed = train_link_rank(0, 1, dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "b"), resume=True),
                              split, ds.features, ds.graph, None)
    first, second = resumed["epochs"]
    assert first["partial"] and first["first_iteration"] == 2 and first["iterations"] == 1, first
    assert "partial" not in second and second["loss"] == straight["epochs"][1]["loss"]
    assert resumed["final_test_mrr"] == straight["final_test_mrr"]
    assert resumed["final_val_hits@10"] == straight["final_val_hits@10"]
    a, b = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, name


def test_link_and_node_checkpoints_are_not_mixed_up(tmp_path, capsys):
    link_ck, node_ck = str(tmp_path / "link"), str(tmp_path / "node")
    assert main(["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", "--epochs", "1",
                 "--checkpoint", link_ck]) == 0
    assert main(["train", *DATA, "--fanouts", "4,3", "--hidden", "8", "--batch-size", "64", "--epochs", "1",
                 "--device", "cpu", "--num-ranks", "1", "--eval-every", "0", "--checkpoint", node_ck]) == 0
    capsys.readouterr()
    cases = [
        (["eval", "--checkpoint", link_ck, "--split", "train"], "a link model is scored on its held-out edges"),
        (["eval", "--checkpoint", link_ck, "--ids", "x.npy"], "--ids scores vertices of a node classification model"),
        (["predict", "--checkpoint", link_ck, "--out", str(tmp_path / "p.npy"), "--ids", "x.npy"],
         "--ids is for node classification models"),
        (["predict", "--checkpoint", node_ck, "--out", str(tmp_path / "p.npy"), "--pairs", "x.txt"],
         "--pairs scores vertex pairs with a link prediction model"),
        (["train", *DATA, "--num-ranks", "1", "--device", "cpu", "--checkpoint", link_ck, "--resume"],
         "is a link prediction run's; resume it with gsplit train --task link"),
        (["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", "--checkpoint", node_ck, "--resume"],
         "holds a node classification run's checkpoint"),
        (["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", "--checkpoint", link_ck],
         "already holds a checkpoint"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)


def test_link_eval_reports_the_runs_final_metrics(tmp_path, capsys):
    """gsplit eval of a link run's checkpoint scores the held-out edges as the end of the run did: the same MRR
    and Hits@K (its negatives, its predictor), on one rank and split over two."""
    ck, log = str(tmp_path / "ck"), tmp_path / "run.jsonl"
    assert main(["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", "--predictor", "mlp",
                 "--checkpoint", ck, "--log", str(log)]) == 0
    summary = json.loads(log.read_text().splitlines()[-1])
    capsys.readouterr()
    for ranks in ("1", "2"):
        assert main(["eval", "--checkpoint", ck, "--num-ranks", ranks, "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        for name in ("val", "test"):
            line = f"{name} MRR {summary[f'final_{name}_mrr']:.4f}  Hits@10 {summary[f'final_{name}_hits@10']:.4f}"
            assert line in out, (ranks, line, out)
    assert main(["eval", "--checkpoint", ck, "--num-ranks", "1", "--device", "cpu", "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert "test MRR" in out and "val MRR" not in out


def test_link_split_stats_count_the_pairs_as_the_loader_splits_them():
    import torch

    import gsplit
    from gsplit.link import negative
    from gsplit.link.stats import link_split_stats
    from gsplit.sampling.batches import global_batches

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=1)
    eids = torch.arange(0, ds.graph.num_edges, 5)
    s = gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([3, 2]), negative_sampler=negative.Uniform(2))
    owner = torch.randint(0, 3, (ds.graph.num_nodes,), generator=torch.Generator().manual_seed(0))
    st = link_split_stats(ds.graph, owner, s, eids, batch_size=60, num_batches=3, seed=2)
    remote, scored = [], []
    for it, batch in zip(range(3), global_batches(eids, 60, 2, 0)):
        plan = s.plan(ds.graph, batch, 0, it)
        u, v = torch.cat([plan.pos[0], plan.neg[0]]), torch.cat([plan.pos[1], plan.neg[1]])
        remote.append(float((owner[u] != owner[v]).double().mean()))
        counts = torch.bincount(owner[u], minlength=3).double()
        scored.append(float(counts.max() / counts.mean()))
    assert st.remote_pair_fraction == pytest.approx(sum(remote) / 3)
    assert st.pair_imbalance == pytest.approx(sum(scored) / 3)
    one = link_split_stats(ds.graph, torch.zeros(ds.graph.num_nodes, dtype=torch.int64), s, eids, 60, 2)
    assert one.remote_pair_fraction == 0 and one.exchanged_rows == 0 and one.blocks.cross_edge_fraction == [0, 0]


def test_predict_writes_embeddings_and_scores_pairs(tmp_path, capsys):
    import numpy as np
    import torch

    ck = str(tmp_path / "ck")
    assert main(["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "1", "--epochs", "1", "--predictor", "mlp",
                 "--checkpoint", ck]) == 0
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("0 1\n5 7\n599 3\n")
    assert main(["predict", "--checkpoint", ck, "--out", str(tmp_path / "all.npz"), "--pairs", str(pairs)]) == 0
    assert main(["predict", "--checkpoint", ck, "--out", str(tmp_path / "s.csv"), "--pairs", str(pairs)]) == 0
    assert main(["predict", "--checkpoint", ck, "--out", str(tmp_path / "emb.npy")]) == 0
    got = np.load(tmp_path / "all.npz")
    h = torch.from_numpy(np.load(tmp_path / "emb.npy"))
    assert h.shape == (600, 8) and np.allclose(got["embeddings"], h.numpy())
    from gsplit.link.train import make_predictor, score_pairs
    mlp = make_predictor("mlp", 8)
    mlp.load_state_dict(torch.load(tmp_path / "ck" / "predictor.pt", weights_only=True))
    with torch.no_grad():
        want = score_pairs(mlp, h[[0, 5, 599]], h[[1, 7, 3]])
    assert np.allclose(got["scores"], want.numpy(), atol=1e-6) and got["pairs"].tolist() == [[0, 1], [5, 7], [599, 3]]
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0] == "u,v,score" and rows[3].startswith("599,3,")
    capsys.readouterr()
    pairs.write_text("0 600\n")
    assert main(["predict", "--checkpoint", ck, "--out", str(tmp_path / "x.npy"), "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "600" in err[0], err


def test_prepare_stats_and_train_share_a_link_map(tmp_path, capsys):
    """gsplit prepare --task link saves the map of the split's graph; stats measures it on edge mini-batches;
    train --partition reuses it; another split (or world size) is refused in one line."""
    folder = str(tmp_path / "map")
    data = [*DATA, "--fanouts", "4,3", "--batch-size", "64"]
    assert main(["prepare", "--task", "link", *data, "--num-parts", "2", "--out", folder]) == 0
    assert "pairs: scoring imbalance" in capsys.readouterr().out
    js = tmp_path / "stats.json"
    assert main(["stats", "--task", "link", *DATA, "--partition", folder, "--num-batches", "2", "--json", str(js)]) == 0
    record = json.loads(js.read_text())
    assert 0 <= record["remote_pair_fraction"] <= 1 and len(record["blocks"]["cross_edge_fraction"]) == 2
    assert main(["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "2", "--epochs", "1",
                 "--partition", folder]) == 0
    assert f"using partition map {folder}" in capsys.readouterr().out
    cases = [
        (["stats", "--task", "link", *DATA, "--partition", folder, "--edge-split", "0.1,0.1"], "another graph"),
        (["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "2", "--partition", folder, "--seed", "3"],
         "another graph"),
        (["train", "--task", "link", *DATA, *SMALL, "--num-ranks", "3", "--partition", folder], "3"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)
