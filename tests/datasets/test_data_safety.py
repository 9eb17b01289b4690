"""What a user's files may not do (issue 49, items 1, 5 and 6): corrupt memory through an id out of range,
leave a half-written or empty output behind, come out unreadable to colleagues, or get a planted kernel
loaded.

Whatever could crash the interpreter on the old code runs in a subprocess, so that a crash fails the test
instead of killing pytest.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import gsplit
from gsplit.datasets import load_folder, save_folder

ROOT = Path(__file__).resolve().parents[2]
N = 3000
BAD_IDS = {"negative": -1, "huge": 2**40, "just past the end": N + 5}


def _run(script: str, *args, timeout: float = 180) -> subprocess.CompletedProcess:
    # GSPLIT_NO_EXTENSIONS: no kernel build inside a subprocess with a timeout (the refusals come first anyway)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GSPLIT_NO_EXTENSIONS": "1"}
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    ds = gsplit.datasets.load("synthetic", num_nodes=N, feature_dim=8, seed=0)
    return save_folder(ds, tmp_path_factory.mktemp("data") / "ds")


def _poke(src: Path, dst: Path, file: str, value: int, pos: int) -> Path:
    """A copy of folder ``src`` whose ``file`` holds ``value`` at ``pos``, with the file's times restored, so
    the writer's stamp still reads "unchanged" (as a folder re-stamped by whoever shipped it would)."""
    shutil.copytree(src, dst, copy_function=shutil.copy2)  # copy2 keeps the times the stamps record
    p = dst / file
    st = os.stat(p)
    a = np.load(p, mmap_mode="r+")
    a[pos] = value
    a.flush()
    del a
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return dst


LOAD_AND_REVERSE = textwrap.dedent("""
    import sys
    from gsplit.datasets import load_folder
    from gsplit.partitioning.expected import reverse_edges
    try:
        ds = load_folder(sys.argv[1])
    except ValueError as e:
        print("REFUSED", e)
        sys.exit(0)
    reverse_edges(ds.graph.indptr.numpy(), ds.graph.indices.numpy())  # scipy's tocsr: the old crash
    print("LOADED")
""")


@pytest.mark.parametrize("kind", list(BAD_IDS))
def test_an_id_out_of_range_under_an_unchanged_stamp_is_refused_naming_the_file(folder, tmp_path, kind):
    """Crashed on the old code (`free(): invalid next size`, SIGSEGV at 2^40) or went on with the bad id: the
    folder's stamp matched, so the id range pass was skipped and scipy indexed with the id."""
    bad = _poke(folder, tmp_path / "bad", "graph/indices.npy", BAD_IDS[kind], 4321)
    proc = _run(LOAD_AND_REVERSE, bad)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-1500:]}"
    line = proc.stdout.strip()
    assert line.startswith("REFUSED") and len(line.splitlines()) == 1, line
    file = bad / "graph" / "indices.npy"
    assert f"{file} holds vertex id {BAD_IDS[kind]} outside [0, {N}) at entry 4321" in line, line


def test_graph_load_checks_ids_even_when_told_not_to_validate(tmp_path):
    g = gsplit.Graph.from_edges([0, 1, 2], [1, 2, 0])
    g.save(tmp_path / "g")
    np.save(tmp_path / "g" / "indices.npy", np.array([0, 7, 2]))
    with pytest.raises(ValueError, match=r"indices.npy holds vertex id 7 outside \[0, 3\) at entry 1 "):
        gsplit.Graph.load(tmp_path / "g", validate=False)
    ds = save_folder(gsplit.datasets.load("synthetic", num_nodes=200, seed=0), tmp_path / "ds")
    a = np.load(ds / "graph" / "indices.npy")
    a[3] = 207
    np.save(ds / "graph" / "indices.npy", a)
    with pytest.raises(ValueError, match=r"indices.npy holds vertex id 207 outside \[0, 200\) at entry 3 "):
        load_folder(ds, validate=False)  # a folder "you trust" skips the NaN scan, never the id range


CLI_COMMANDS = textwrap.dedent("""
    import contextlib, io, json, sys
    from gsplit.cli import main
    bad, model, out = sys.argv[1:4]
    commands = {
        "train": ["train", "--dataset", f"folder:{bad}", "--fanouts", "5,5", "--batch-size", "64", "--device", "cpu",
                  "--epochs", "1", "--num-ranks", "1"],
        "train --full-graph": ["train", "--dataset", f"folder:{bad}", "--full-graph", "--device", "cpu", "--epochs",
                               "1", "--num-ranks", "1"],
        "prepare": ["prepare", "--dataset", f"folder:{bad}", "--num-parts", "2", "--out", out + "/map"],
        "eval": ["eval", "--checkpoint", model, "--dataset", f"folder:{bad}", "--device", "cpu", "--num-ranks", "1"],
        "predict": ["predict", "--checkpoint", model, "--dataset", f"folder:{bad}", "--device", "cpu",
                    "--num-ranks", "1", "--out", out + "/pred.csv"],
    }
    got = {}
    for name, argv in commands.items():
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        got[name] = [rc, err.getvalue()]
    print(json.dumps(got))
""")


def test_every_command_refuses_the_damaged_folder_in_one_line(folder, tmp_path):
    """train, train --full-graph, prepare, eval and predict: exit 2 with one line naming the file (the old
    code crashed in train/prepare/full-graph and gave an IndexError traceback from a rank elsewhere)."""
    from gsplit.run.model_io import save_model
    from gsplit.nn.models import build_model

    bad = _poke(folder, tmp_path / "bad", "graph/indices.npy", 2**40, 17)
    spec = dict(name="sage", in_feats=8, hidden=8, num_classes=load_folder(folder).num_classes, num_layers=2,
                dropout=0.0, heads=1)
    save_model(tmp_path / "model.pt", build_model(**spec), spec)
    proc = _run(CLI_COMMANDS, bad, tmp_path / "model.pt", tmp_path)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-1500:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (rc, err) in got.items():
        lines = [line for line in err.strip().splitlines() if line.startswith("gsplit: error:")]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (name, rc, err[-800:])
        assert f"indices.npy holds vertex id 1099511627776 outside [0, {N}) at entry 17" in lines[0], (name, lines[0])
    assert not (tmp_path / "pred.csv").exists()  # and predict left no empty file behind


@pytest.mark.parametrize("file,value,says", [
    ("labels.npy", 99, r"labels.npy: labels\[5\] = 99 is outside"),
    ("train_idx.npy", N + 5, rf"train_idx.npy: train_idx contain id {N + 5}"),
    ("test_idx.npy", -3, r"test_idx.npy: test_idx contain id -3"),
])
def test_labels_and_splits_out_of_range_name_their_file(folder, tmp_path, file, value, says):
    bad = _poke(folder, tmp_path / "bad", file, value, 5 if file == "labels.npy" else 0)
    with pytest.raises(ValueError, match=says):
        load_folder(bad)


# ------------------------------------------------------------------------------------------ item 5
@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def test_data_files_get_the_umask_and_checkpoints_stay_private(tmp_path):
    """Every file came out 0600 (tempfile.mkstemp), so a shared dataset folder was unreadable to colleagues."""
    from gsplit.run.checkpoint import save_checkpoint
    from gsplit.runtime.io import append_jsonl, atomic_write_bytes
    from gsplit.partitioning import PartitionMap

    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
    with _umask(0o022):
        out = save_folder(ds, tmp_path / "ds")
        PartitionMap.from_tensor(torch.zeros(ds.num_nodes, dtype=torch.int64), num_parts=1).save(tmp_path / "map")
        append_jsonl(tmp_path / "run.jsonl", {"type": "run"})
        atomic_write_bytes(tmp_path / "pred.csv", "vertex,prediction\n")
        atomic_write_bytes(tmp_path / "secret", b"x", private=True)
        step = save_checkpoint(tmp_path / "ck", {"w": torch.ones(2)}, None, {"step": 3})
    written = sorted(out.rglob("*.npy")) + [out / "meta.json", tmp_path / "map" / "assignment.npy",
                                            tmp_path / "run.jsonl", tmp_path / "pred.csv"]
    assert {str(p): oct(_mode(p)) for p in written} == {str(p): "0o644" for p in written}
    assert _mode(tmp_path / "secret") == 0o600
    assert _mode(tmp_path / "ck") == 0o700 and _mode(step) == 0o700
    assert all(_mode(p) == 0o600 for p in [step / "state.pt", step / "meta.json", tmp_path / "ck" / "latest"])
    with _umask(0o002):  # a group-sharing umask is honoured too
        atomic_write_bytes(tmp_path / "shared.csv", "x")
    assert _mode(tmp_path / "shared.csv") == 0o664


def test_a_failed_predict_or_plot_leaves_no_empty_file(tmp_path, capsys):
    from gsplit.cli import main

    log = tmp_path / "run.jsonl"
    log.write_text('{"type": "nonsense"}\n')
    assert main(["plot", str(log), "--out", str(tmp_path / "fig.png")]) != 0
    assert main(["predict", "--checkpoint", str(tmp_path / "none.pt"), "--dataset", f"folder:{tmp_path / 'none'}",
                 "--out", str(tmp_path / "pred.csv")]) == 2
    capsys.readouterr()
    assert not (tmp_path / "fig.png").exists() and not (tmp_path / "pred.csv").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # an unwritable --out is still refused before any work
    assert main(["predict", "--checkpoint", "x", "--out", str(tmp_path / "run.jsonl" / "p.csv")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_dataset_that_does_not_fit_the_disk_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    from gsplit.cli import main, prepare

    monkeypatch.setattr(prepare, "free_bytes", lambda folder: 1 << 20)
    rc = main(["prepare", "-D", "num_nodes=20000", "--num-parts", "2", "--method", "random",
               "--out", str(tmp_path / "map"), "--dataset-out", str(tmp_path / "ds")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    m = re.match(rf"gsplit: error: the disk is full: writing the dataset to --dataset-out {re.escape(str(tmp_path))}"
                 r"/ds needs ([\d.]+) MiB but its file system has 1.0 MiB free; free space there", err)
    assert m and 7.5 < float(m.group(1)) < 8.0, err  # 7.8 MiB: 5 MB of features, 2.4 MB of edges, the rest
    assert not (tmp_path / "ds").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_disk_that_fills_while_the_dataset_is_written_is_one_line(tmp_path, monkeypatch, capsys):
    """The space was there when checked, and gone by the time the features were written (another writer)."""
    from gsplit.runtime import io as gio
    from gsplit.cli import main

    real = gio._new_temp_file

    def full_for_features(path, private):
        fd, tmp = real(path, private)
        if path.name == "features.npy":  # its writes go to /dev/full: ENOSPC after the header, mid-file
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, tmp

    monkeypatch.setattr(gio, "_new_temp_file", full_for_features)
    rc = main(["prepare", "-D", "num_nodes=2000", "--num-parts", "2", "--method", "random",
               "--out", str(tmp_path / "map"), "--dataset-out", str(tmp_path / "ds")])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("gsplit: error: No space left on device") and "the disk is full" in err, err
    assert f"({tmp_path / 'ds' / 'features.npy'})" in err
    assert not [p.name for p in (tmp_path / "ds").iterdir() if p.name.endswith(".tmp")]  # no partial file left
    assert not (tmp_path / "ds" / "meta.json").exists()  # an incomplete folder, which load_folder reports
    with pytest.raises(ValueError, match="incomplete dataset folder"):
        load_folder(tmp_path / "ds")


# ------------------------------------------------------------------------------------------ item 6
def test_a_kernel_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    from gsplit.ops import cpu_ext

    root = tmp_path / "ext"
    root.mkdir(mode=0o700)
    cpu_ext.check_kernel_path(root, root)
    os.chmod(root, 0o777)
    with pytest.raises(cpu_ext.UnsafeKernelPath, match=rf"kernel folder {root} is writable by its group and "
                                                       rf"others \(mode 0777\).*chmod go-w {root}"):
        cpu_ext.check_kernel_path(root, root)
    os.chmod(root, 0o1777)  # sticky does not help at or below the root: others may still add build folders
    with pytest.raises(cpu_ext.UnsafeKernelPath):
        cpu_ext.check_kernel_path(root, root)
    os.chmod(root, 0o770)
    with pytest.raises(cpu_ext.UnsafeKernelPath, match="writable by its group"):
        cpu_ext.check_kernel_path(root, root)
    # above the root, a sticky world-writable folder (/tmp) is fine: others cannot replace our entries
    os.chmod(root, 0o700)
    os.chmod(tmp_path, 0o1777)
    cpu_ext.check_kernel_path(root, root)
    os.chmod(tmp_path, 0o777)
    with pytest.raises(cpu_ext.UnsafeKernelPath, match=f"kernel folder {tmp_path} is writable"):
        cpu_ext.check_kernel_path(root, root)
    os.chmod(tmp_path, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_kernel_or_folder_owned_by_another_user_is_refused(tmp_path):
    from gsplit.ops import cpu_ext

    root = tmp_path / "ext"
    lib = root / "key" / "k.so"
    lib.parent.mkdir(parents=True, mode=0o700)
    lib.write_bytes(b"")
    os.chmod(root, 0o700)
    cpu_ext.check_kernel_path(lib, root)
    os.chown(lib, 4242, 4242)
    with pytest.raises(cpu_ext.UnsafeKernelPath, match=rf"kernel file {lib} is owned by uid 4242, not by you"):
        cpu_ext.check_kernel_path(lib, root)
    os.chown(lib, 0, 0)
    os.chown(lib.parent, 4242, 4242)
    with pytest.raises(cpu_ext.UnsafeKernelPath, match=rf"kernel folder {lib.parent} is owned by uid 4242"):
        cpu_ext.check_kernel_path(lib, root)


PLANTED = textwrap.dedent("""
    import logging, os, sys
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from gsplit.ops import cpu_ext, sample_cpu
    folder = cpu_ext.build_folder(sample_cpu.NAME, sample_cpu.SOURCES)
    folder.mkdir(parents=True)
    lib = folder / (sample_cpu.NAME + ".so")
    # a library that, if loaded, says so: what another user would plant
    lib.write_text("not a library")
    (folder / "built.json").write_text("{}")
    os.chmod(sys.argv[1], int(sys.argv[2], 8))
    report = cpu_ext.prebuild([(sample_cpu.NAME, sample_cpu.SOURCES)])
    print(report.failed.get(sample_cpu.NAME, "LOADED"))
""")


def test_gsplit_refuses_a_kernel_planted_in_a_shared_extension_dir(tmp_path):
    """With GSPLIT_EXTENSION_DIR a folder others can write, a planted library was imported (and run)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GSPLIT_EXTENSION_DIR": str(shared)}
    env.pop("GSPLIT_NO_EXTENSIONS", None)
    proc = subprocess.run([sys.executable, "-c", PLANTED, str(shared), "777"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-1500:]
    line = proc.stdout.strip()
    assert line.startswith("UnsafeKernelPath: kernel folder") and f"{shared} is writable by its group and others" \
        in line and "chmod go-w" in line, line


def test_the_kernel_cache_is_created_private(tmp_path, monkeypatch):
    from gsplit.ops import cpu_ext

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GSPLIT_EXTENSION_DIR", raising=False)
    (tmp_path / "home").mkdir()
    folder = cpu_ext.extension_root() / "key" / "k-1"
    with _umask(0o022):
        cpu_ext._make_private_dirs(folder)
    for p in [tmp_path / "home" / ".cache", tmp_path / "home" / ".cache" / "gsplit", folder.parent, folder]:
        assert _mode(p) == 0o700, p
    cpu_ext.check_kernel_path(folder)


SMALL_DISK_PREPARE = textwrap.dedent("""
    import subprocess, sys
    p = subprocess.run([sys.executable, "-m", "gsplit", "prepare", "-D", "num_nodes=20000", "--num-parts", "2",
                        "--method", "random", "--out", sys.argv[2] + "/map", "--dataset-out", sys.argv[1] + "/ds"],
                       capture_output=True, text=True, timeout=300)
    print(p.returncode)
    print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
    print("Traceback" in p.stderr)
""")


@pytest.mark.slow
def test_a_real_small_disk_refuses_the_dataset_in_one_line(tmp_path):
    """The same refusal on a real 2 MiB tmpfs (its own statvfs), in a private mount namespace."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small file system")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "s.py").write_text(SMALL_DISK_PREPARE)
    shell = (f"mount -t tmpfs -o size=2m tmpfs {mnt} && cd {ROOT} && GSPLIT_NO_EXTENSIONS=1 PYTHONPATH={ROOT} "
             f"{sys.executable} {tmp_path / 's.py'} {mnt} {tmp_path}")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=360)
    if "mount" in proc.stderr and ("permission denied" in proc.stderr.lower() or "not permitted" in proc.stderr):
        pytest.skip(f"mounting refused here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, last, traceback = proc.stdout.strip().splitlines()
    assert rc == "2" and traceback == "False", proc.stdout
    assert last.startswith(f"gsplit: error: the disk is full: writing the dataset to --dataset-out {mnt}/ds needs "
                           "7.8 MiB but its file system has 2.0 MiB free"), last


@pytest.mark.parametrize("label", [-5, 10**12])
def test_npz_labels_out_of_range_name_the_file_before_any_allocation(tmp_path, label):
    """A label of 1e12 sized the Planetoid split's per-class arrays: an 8 TB allocation (refused by the
    allocator here, a swap storm where it overcommits); -5 got a misleading split error."""
    import scipy.sparse as sp

    from gsplit.datasets.files import load_npz

    n = 200
    adj = sp.random(n, n, density=0.05, format="csr", random_state=0)
    labels = np.arange(n) % 4
    labels[3] = label
    path = tmp_path / "g.npz"
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=np.array(adj.shape),
             attr_matrix=np.ones((n, 4), dtype=np.float32), labels=labels)
    with pytest.raises(ValueError, match=rf"g.npz': labels\[3\] = {label}, but classes must be numbered 0..C-1"):
        load_npz(path)


@pytest.mark.parametrize("classes", [10**10, 0, 2.5])
def test_a_folder_whose_meta_json_claims_absurd_classes_is_refused(folder, tmp_path, classes):
    bad = Path(shutil.copytree(folder, tmp_path / "bad"))
    meta = json.loads((bad / "meta.json").read_text())
    meta["num_classes"] = classes
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"meta.json: num_classes={classes!r} must be an integer from 1 to 65536"):
        load_folder(bad)


def test_reverse_edges_refuses_ids_out_of_range_of_an_unchecked_graph():
    """An in-memory graph built without checks (Graph(...) or from_csc(validate=False)) reaches scipy here."""
    from gsplit.partitioning.expected import reverse_edges

    with pytest.raises(ValueError, match=r"indices hold ids in \[0, 9\] .* the graph has 3 vertices"):
        reverse_edges(np.array([0, 1, 2, 3]), np.array([1, 9, 0]))
    assert reverse_edges(np.array([0, 1, 3, 4]), np.array([1, 0, 2, 1])).tolist() == [1, 0, 3, 2]


def test_a_full_disk_in_the_chunked_conversion_names_the_file_and_cleans_up(tmp_path, monkeypatch):
    """The conversion's memory maps were sparse files: a full disk killed the process with SIGBUS (rc 135,
    scratch files left behind). Their blocks are reserved first now, so a full disk is an OSError."""
    import errno

    from gsplit.datasets import chunked

    edges = tmp_path / "edges.txt"
    edges.write_text("".join(f"{i} {(i * 7 + 1) % 500}\n" for i in range(2000)))

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"No space left on device: [\d,]+ bytes needed") as got:
        chunked.convert_edgelist(edges, tmp_path / "ds")
    assert got.value.errno == errno.ENOSPC and got.value.filename == str(tmp_path / "ds" / ".indices.tmp")
    assert not [p.name for p in (tmp_path / "ds").iterdir() if p.name.endswith(".tmp")]


SMALL_DISK_EDGELIST = textwrap.dedent("""
    import subprocess, sys
    p = subprocess.run([sys.executable, "-m", "gsplit", "prepare", "--dataset", "edgelist:" + sys.argv[2] + "/e.txt",
                        "--num-parts", "2", "--method", "random", "--out", sys.argv[2] + "/map",
                        "--dataset-out", sys.argv[1] + "/ds"], capture_output=True, text=True, timeout=300)
    print(p.returncode)
    print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
    print("Traceback" in p.stderr)
""")


@pytest.mark.slow
def test_a_real_disk_that_fills_during_an_edge_list_conversion_is_one_line(tmp_path):
    """On the old code: `Bus error`, rc 135, .edges.tmp and .indices.tmp left on the full disk."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small file system")
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 50_000, size=(300_000, 2))  # 4.8 MB of scratch pairs, 4.8 MB of placed ids
    np.savetxt(tmp_path / "e.txt", pairs, fmt="%d")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "s.py").write_text(SMALL_DISK_EDGELIST)
    shell = (f"mount -t tmpfs -o size=6m tmpfs {mnt} && cd {ROOT} && GSPLIT_NO_EXTENSIONS=1 PYTHONPATH={ROOT} "
             f"{sys.executable} {tmp_path / 's.py'} {mnt} {tmp_path} && ls -a {mnt}/ds")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=360)
    if "mount" in proc.stderr and ("permission denied" in proc.stderr.lower() or "not permitted" in proc.stderr):
        pytest.skip(f"mounting refused here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, last, traceback, *listing = proc.stdout.strip().splitlines()
    assert rc == "1" and traceback == "False", proc.stdout
    assert last.startswith("gsplit: error: No space left on device") and "the disk is full" in last, last
    assert f"({mnt}/ds/" in last, last
    assert not [name for name in listing if name.endswith(".tmp")], listing
