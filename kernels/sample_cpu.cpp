// Counter-based neighbour sampling and block relabelling on the CPU (C++, parallel over vertices).
//
// The CPU twin of kernels/sample.cu and kernels/relabel.cu: it picks exactly the edges that
// gsplit.ops.torch_ops.sample_neighbors_torch picks for the same stream key (the same SplitMix64
// arithmetic as gsplit/sampling/counter_rng.py, the same Floyd's algorithm without replacement, the
// same sorted draws with replacement; change all of them together, tests compare them), and relabels
// exactly as gsplit.ops.torch_ops.relabel does. Built at first use by gsplit/ops/cpu_ext.py and
// driven by gsplit/ops/sample_cpu.py, which turns the returned counts of bad ids into errors.
//
// Why C++ and not torch: the torch sampler runs Floyd's algorithm as `fanout` passes over
// [vertices, fanout] tensors and the relabel as several passes over the graph-sized tables; here each
// vertex is sampled in one pass over its own few draws, and the relabel touches each id once or twice.
//
// Threads: at::parallel_for, so torch.set_num_threads applies (one OpenMP runtime: torch's).

// Only the headers used (not <torch/extension.h>, which pulls in all of libtorch's C++ API): the
// build on a 2-core machine takes a fraction of the time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

namespace {

using i64 = int64_t;
using u64 = uint64_t;

constexpr u64 kGolden = 0x9E3779B97F4A7C15ULL;
constexpr u64 kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr u64 kMix2 = 0x94D049BB133111EBULL;

// SplitMix64 finaliser, as counter_rng.mix64.
inline u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * kMix1;
    z = (z ^ (z >> 27)) * kMix2;
    return z ^ (z >> 31);
}

// Draw number `draw` of a vertex: uniform in [0, bound), as counter_rng.draw_below (top 63 bits mod bound).
inline i64 draw_below(u64 vkey, i64 draw, i64 bound) {
    const u64 r = mix64(vkey + static_cast<u64>(draw + 1) * kGolden);
    return static_cast<i64>((r >> 1) % static_cast<u64>(bound));
}

// Sort a short run ascending: insertion sort for the fanouts GNNs use, std::sort beyond.
inline void sort_run(i64* p, i64 k) {
    if (k > 32) {
        std::sort(p, p + k);
        return;
    }
    for (i64 j = 1; j < k; ++j) {
        const i64 x = p[j];
        i64 t = j - 1;
        while (t >= 0 && p[t] > x) {
            p[t + 1] = p[t];
            --t;
        }
        p[t + 1] = x;
    }
}

at::Tensor empty_i64(i64 n) { return at::empty({n}, at::TensorOptions().dtype(at::kLong)); }

// Grain sizes: below these, splitting over threads costs more than it saves.
constexpr i64 kVertexGrain = 1024;
constexpr i64 kIdGrain = 16384;

// Contiguous chunks of [0, n) for two-pass (count, then write) loops whose output order must not
// depend on the number of threads.
struct Chunks {
    i64 n, count, size;
    Chunks(i64 n_, i64 grain) : n(n_) {
        const i64 want = std::max<i64>(1, 4 * static_cast<i64>(at::get_num_threads()));
        size = std::max<i64>(grain, (n + want - 1) / want);
        count = n == 0 ? 0 : (n + size - 1) / size;
    }
    i64 begin(i64 c) const { return c * size; }
    i64 end(i64 c) const { return std::min(n, (c + 1) * size); }
};

}  // namespace

namespace {

// Largest in-degree for which Floyd's membership test and the ascending output use a bitmap of the
// vertex's in-edges on the stack (d bits) instead of a scan of the picks and a sort.
constexpr i64 kBitmapMaxDegree = 1024;

// Picks of one vertex without replacement, d > fanout, as positions in [0, d), written ascending.
// Floyd's algorithm: a uniform fanout-subset of [0, d) in fanout draws, no rejection loop; a draw
// that is already taken becomes `top`, which no earlier draw can be.
inline void floyd_sorted(u64 vkey, i64 d, i64 fanout, i64* pos) {
    if (d <= kBitmapMaxDegree) {
        u64 bits[kBitmapMaxDegree / 64];
        const i64 words = (d + 63) / 64;
        std::fill(bits, bits + words, u64(0));
        // The draws first: they are independent, so their divisions overlap, while Floyd's test
        // below is a chain through the bitmap.
        for (i64 j = 0; j < fanout; ++j) pos[j] = draw_below(vkey, j, d - fanout + j + 1);
        for (i64 j = 0; j < fanout; ++j) {
            const i64 top = d - fanout + j;
            i64 r = pos[j];
            if ((bits[r >> 6] >> (r & 63)) & 1) r = top;
            bits[r >> 6] |= u64(1) << (r & 63);
        }
        i64 k = 0;
        for (i64 w = 0; w < words; ++w) {
            for (u64 b = bits[w]; b; b &= b - 1) pos[k++] = 64 * w + __builtin_ctzll(b);
        }
        return;
    }
    for (i64 j = 0; j < fanout; ++j) {
        const i64 top = d - fanout + j;
        i64 r = draw_below(vkey, j, top + 1);
        for (i64 t = 0; t < j; ++t) {
            if (pos[t] == r) {
                r = top;
                break;
            }
        }
        pos[j] = r;
    }
    sort_run(pos, fanout);
}

// How many vertices ahead the fill pass prefetches a destination's in-edges (DRAM latency hiding).
constexpr i64 kPrefetchAhead = 8;

}  // namespace

// One layer of sampling. Returns (src, dst_index, edge_ids, num_bad): the picked edges grouped by
// destination in `nodes` order, each destination's edges in CSC order; num_bad counts ids of `nodes`
// outside [0, num_nodes) (then the edge tensors are empty and the caller raises).
std::tuple<at::Tensor, at::Tensor, at::Tensor, i64> sample_neighbors(
    const at::Tensor& indptr_t, const at::Tensor& indices_t, const at::Tensor& nodes_t,
    i64 fanout, bool replace, u64 key) {
    const i64* indptr = indptr_t.data_ptr<i64>();
    const i64* indices = indices_t.data_ptr<i64>();
    const i64* nodes = nodes_t.data_ptr<i64>();
    const i64 num_nodes = indptr_t.numel() - 1;
    const i64 n = nodes_t.numel();

    // Pass 1: each destination's first in-edge, in-degree and number of picks.
    std::vector<i64> start(static_cast<size_t>(n)), deg(static_cast<size_t>(n)), ends(static_cast<size_t>(n));
    std::atomic<i64> num_bad{0};
    at::parallel_for(0, n, kVertexGrain, [&](i64 lo, i64 hi) {
        i64 bad = 0;
        for (i64 i = lo; i < hi; ++i) {
            if (i + 16 < hi) {
                const i64 ahead = nodes[i + 16];
                if (ahead >= 0 && ahead < num_nodes) __builtin_prefetch(indptr + ahead);
            }
            const i64 v = nodes[i];
            if (v < 0 || v >= num_nodes) {
                ++bad;
                start[i] = deg[i] = ends[i] = 0;
                continue;
            }
            const i64 s = indptr[v];
            const i64 d = indptr[v + 1] - s;
            start[i] = s;
            deg[i] = d;
            ends[i] = fanout < 0 ? d : replace ? (d > 0 ? fanout : 0) : std::min(d, fanout);
        }
        num_bad += bad;
    });
    if (num_bad.load()) {
        return {empty_i64(0), empty_i64(0), empty_i64(0), num_bad.load()};
    }
    // Inclusive prefix sum: destination i owns output slots [ends[i-1], ends[i]).
    for (i64 i = 1; i < n; ++i) ends[i] += ends[i - 1];
    const i64 total = n ? ends[n - 1] : 0;

    at::Tensor src_t = empty_i64(total), dst_t = empty_i64(total), eid_t = empty_i64(total);
    i64* src = src_t.data_ptr<i64>();
    i64* dst_index = dst_t.data_ptr<i64>();
    i64* eids = eid_t.data_ptr<i64>();

    if (fanout < 0) {
        // Every in-edge: split the output (not the vertices) over threads, so hubs do not serialise.
        at::parallel_for(0, total, kIdGrain, [&](i64 lo, i64 hi) {
            i64 i = std::upper_bound(ends.begin(), ends.end(), lo) - ends.begin();
            for (i64 o = lo; o < hi; ++i) {
                const i64 begin = i > 0 ? ends[i - 1] : 0;
                const i64 stop = std::min(ends[i], hi);
                const i64 e0 = start[i] - begin;
                for (; o < stop; ++o) {
                    eids[o] = e0 + o;
                    src[o] = indices[e0 + o];
                    dst_index[o] = i;
                }
            }
        });
        return {src_t, dst_t, eid_t, 0};
    }

    // Pass 2: picks of each destination as positions in its edge_ids slots (which double as scratch,
    // as in sample.cu), ascending, then turned into edge ids and sources.
    at::parallel_for(0, n, kVertexGrain / 8, [&](i64 lo, i64 hi) {
        for (i64 i = lo; i < hi; ++i) {
            if (i + kPrefetchAhead < hi) {
                const i64* ahead = indices + start[i + kPrefetchAhead];
                __builtin_prefetch(ahead);
                if (deg[i + kPrefetchAhead] > 8) __builtin_prefetch(ahead + 8);
            }
            const i64 begin = i > 0 ? ends[i - 1] : 0;
            const i64 cnt = ends[i] - begin;
            if (cnt == 0) continue;
            const i64 s = start[i];
            const i64 d = deg[i];
            i64* pos = eids + begin;
            if (!replace && d <= fanout) {
                for (i64 j = 0; j < cnt; ++j) pos[j] = j;
            } else {
                const u64 vkey = mix64(key ^ (static_cast<u64>(nodes[i]) * kGolden));
                if (replace) {
                    for (i64 j = 0; j < fanout; ++j) pos[j] = draw_below(vkey, j, d);
                    sort_run(pos, fanout);
                } else {
                    floyd_sorted(vkey, d, fanout, pos);
                }
            }
            for (i64 j = 0; j < cnt; ++j) {
                const i64 e = s + pos[j];
                pos[j] = e;
                src[begin + j] = indices[e];
                dst_index[begin + j] = i;
            }
        }
    });
    return {src_t, dst_t, eid_t, 0};
}

namespace {

// Dense relabel for ids in [0, num_nodes), in passes that stay in small per-vertex arrays (a 1M-vertex
// graph needs 1 MB of marks and 0.5 MB of words, which fit in a core's L2 cache, where a table of
// local indices, 4-8 MB, would not):
//   mark[v]   (1 byte per vertex) 0 unseen, 1 seen in src only (a new id), 2 a dst vertex;
//   words[w]  per 64 vertices: bitmaps of the new ids and of the dst vertices among them, and the
//             number of new ids below them, so a new id's rank is a popcount and the new ids come out
//             ascending without a sort;
//   dpos[v]   (T per vertex, uninitialised) position of a dst vertex, read only for dst vertices.
struct alignas(32) Word {
    u64 fresh;   // new ids among the 64 vertices
    u64 is_dst;  // dst vertices among them
    i64 before;  // new ids in lower words
};

// src_local of src[lo:hi]; a separate function so that x86-64 can run it with the popcnt
// instruction when the CPU has it (the default target calls a slower library popcount).
template <typename T>
inline void dense_lookup_body(const i64* src, i64 lo, i64 hi, const Word* words, const T* dpos, i64 nd,
                              i64* local) {
    for (i64 j = lo; j < hi; ++j) {
        if (j + 16 < hi) __builtin_prefetch(words + (src[j + 16] >> 6));
        const i64 v = src[j];
        const Word& w = words[v >> 6];
        const u64 bit = u64(1) << (v & 63);
        local[j] = (w.is_dst & bit) ? static_cast<i64>(dpos[v]) : nd + w.before + __builtin_popcountll(w.fresh & (bit - 1));
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename T>
__attribute__((target("popcnt"))) void dense_lookup_popcnt(const i64* src, i64 lo, i64 hi, const Word* words,
                                                           const T* dpos, i64 nd, i64* local) {
    dense_lookup_body(src, lo, hi, words, dpos, nd, local);
}
#endif

template <typename T>
void dense_lookup(const i64* src, i64 lo, i64 hi, const Word* words, const T* dpos, i64 nd, i64* local) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("popcnt")) {
        dense_lookup_popcnt(src, lo, hi, words, dpos, nd, local);
        return;
    }
#endif
    dense_lookup_body(src, lo, hi, words, dpos, nd, local);
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, i64> relabel_dense_impl(const i64* dst, i64 nd, const i64* src, i64 ne,
                                                           i64 num_nodes) {
    std::vector<uint8_t> mark(static_cast<size_t>(num_nodes), 0);
    uint8_t* mk = mark.data();
    std::unique_ptr<T[]> dpos(new T[static_cast<size_t>(num_nodes)]);
    std::atomic<i64> num_bad{0};
    at::parallel_for(0, ne, kIdGrain, [&](i64 lo, i64 hi) {
        i64 bad = 0;
        for (i64 j = lo; j < hi; ++j) {
            const i64 v = src[j];
            if (v < 0 || v >= num_nodes) {
                ++bad;
                continue;
            }
            // Threads may mark the same id at once; they all store the same value.
            __atomic_store_n(mk + v, uint8_t(1), __ATOMIC_RELAXED);
        }
        num_bad += bad;
    });
    at::parallel_for(0, nd, kIdGrain, [&](i64 lo, i64 hi) {
        i64 bad = 0;
        for (i64 i = lo; i < hi; ++i) {
            const i64 v = dst[i];
            if (v < 0 || v >= num_nodes) {
                ++bad;
                continue;
            }
            mk[v] = 2;
            dpos[v] = static_cast<T>(i);
        }
        num_bad += bad;
    });
    if (num_bad.load()) return {empty_i64(0), empty_i64(0), num_bad.load()};

    const i64 num_words = (num_nodes + 63) / 64;
    std::vector<Word> words(static_cast<size_t>(num_words));
    at::parallel_for(0, num_words, 1024, [&](i64 lo, i64 hi) {
        for (i64 w = lo; w < hi; ++w) {
            const i64 v0 = 64 * w, v1 = std::min(num_nodes, v0 + 64);
            u64 fresh = 0, is_dst = 0;
            for (i64 v = v0; v < v1; ++v) {
                fresh |= u64(mk[v] == 1) << (v - v0);
                is_dst |= u64(mk[v] == 2) << (v - v0);
            }
            words[w].fresh = fresh;
            words[w].is_dst = is_dst;
        }
    });
    i64 num_new = 0;
    for (Word& w : words) {
        w.before = num_new;
        num_new += __builtin_popcountll(w.fresh);
    }
    at::Tensor nodes_t = empty_i64(nd + num_new);
    i64* out_nodes = nodes_t.data_ptr<i64>();
    std::copy(dst, dst + nd, out_nodes);
    at::parallel_for(0, num_words, 1024, [&](i64 lo, i64 hi) {
        for (i64 w = lo; w < hi; ++w) {
            i64* out = out_nodes + nd + words[w].before;
            for (u64 b = words[w].fresh; b; b &= b - 1) *out++ = 64 * w + __builtin_ctzll(b);
        }
    });
    at::Tensor local_t = empty_i64(ne);
    i64* local = local_t.data_ptr<i64>();
    at::parallel_for(0, ne, kIdGrain, [&](i64 lo, i64 hi) {
        dense_lookup<T>(src, lo, hi, words.data(), dpos.get(), nd, local);
    });
    return {nodes_t, local_t, 0};
}

// Open-addressing hash table from global id to local index (linear probing, at most half full).
struct IdTable {
    static constexpr i64 kEmpty = -1;  // vertex ids are never negative
    std::vector<i64> keys, vals;
    i64 mask;
    int shift;
    explicit IdTable(i64 max_keys) {
        i64 cap = 2;
        while (cap < 2 * max_keys) cap <<= 1;
        keys.assign(static_cast<size_t>(cap), kEmpty);
        vals.resize(static_cast<size_t>(cap));
        mask = cap - 1;
        shift = 64 - __builtin_ctzll(static_cast<u64>(cap));
    }
    i64 home(i64 key) const { return static_cast<i64>((static_cast<u64>(key) * kGolden) >> shift) & mask; }
    // Inserts key (threads may race); returns its slot and whether this call added it.
    i64 insert(i64 key, bool* inserted) {
        for (i64 slot = home(key);; slot = (slot + 1) & mask) {
            i64 expected = kEmpty;
            if (__atomic_compare_exchange_n(&keys[slot], &expected, key, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                *inserted = true;
                return slot;
            }
            if (expected == key) {
                *inserted = false;
                return slot;
            }
        }
    }
    // Slot of a key inserted before the last parallel region ended.
    i64 find(i64 key) const {
        i64 slot = home(key);
        while (keys[slot] != key) slot = (slot + 1) & mask;
        return slot;
    }
};

}  // namespace

// Relabel with a dense per-vertex table (num_nodes > 0) or a hash table (num_nodes <= 0).
// Returns (src_nodes, src_local, num_bad): src_nodes = dst ++ sorted(ids of src not in dst),
// src_nodes[src_local] == src; num_bad counts ids outside [0, num_nodes) (negative ids for the hash),
// in which case the tensors are empty and the caller raises. dst must be unique.
std::tuple<at::Tensor, at::Tensor, i64> relabel(const at::Tensor& dst_t, const at::Tensor& src_t, i64 num_nodes) {
    const i64* dst = dst_t.data_ptr<i64>();
    const i64* src = src_t.data_ptr<i64>();
    const i64 nd = dst_t.numel(), ne = src_t.numel();
    if (num_nodes > 0) {
        // dst positions are below nd <= num_nodes (dst unique): int32 while that fits.
        if (num_nodes < (i64(1) << 31)) return relabel_dense_impl<int32_t>(dst, nd, src, ne, num_nodes);
        return relabel_dense_impl<i64>(dst, nd, src, ne, num_nodes);
    }
    for (i64 i = 0; i < nd; ++i) {
        if (dst[i] < 0) return {empty_i64(0), empty_i64(0), 1};
    }
    IdTable table(nd + ne);
    for (i64 i = 0; i < nd; ++i) {
        bool inserted;
        table.vals[table.insert(dst[i], &inserted)] = i;
    }
    // Ids first seen in src, collected per chunk so the set does not depend on the thread count.
    const Chunks chunks(ne, kIdGrain);
    std::vector<std::vector<i64>> found(static_cast<size_t>(chunks.count));
    std::vector<i64> bad(static_cast<size_t>(chunks.count), 0);
    at::parallel_for(0, chunks.count, 1, [&](i64 lo, i64 hi) {
        for (i64 c = lo; c < hi; ++c) {
            for (i64 j = chunks.begin(c); j < chunks.end(c); ++j) {
                if (src[j] < 0) {
                    ++bad[c];
                    continue;
                }
                bool inserted;
                table.insert(src[j], &inserted);
                if (inserted) found[c].push_back(src[j]);
            }
        }
    });
    i64 num_bad = 0, num_new = 0;
    for (i64 c = 0; c < chunks.count; ++c) {
        num_bad += bad[c];
        num_new += static_cast<i64>(found[c].size());
    }
    if (num_bad) return {empty_i64(0), empty_i64(0), num_bad};
    at::Tensor nodes_t = empty_i64(nd + num_new);
    i64* out_nodes = nodes_t.data_ptr<i64>();
    std::copy(dst, dst + nd, out_nodes);
    i64* fresh = out_nodes + nd;
    for (const auto& f : found) fresh = std::copy(f.begin(), f.end(), fresh);
    std::sort(out_nodes + nd, out_nodes + nd + num_new);
    at::parallel_for(0, num_new, kIdGrain, [&](i64 lo, i64 hi) {
        for (i64 r = lo; r < hi; ++r) table.vals[table.find(out_nodes[nd + r])] = nd + r;
    });
    at::Tensor local_t = empty_i64(ne);
    i64* local = local_t.data_ptr<i64>();
    at::parallel_for(0, ne, kIdGrain, [&](i64 lo, i64 hi) {
        for (i64 j = lo; j < hi; ++j) local[j] = table.vals[table.find(src[j])];
    });
    return {nodes_t, local_t, 0};
}

// Cell c of n is kept when its 63-bit draw (mix64(key ^ c * kGolden) >> 1, counter_rng.keep_cells) is at least
// threshold: the dropout mask bank, the same bits as the torch version on any device.
at::Tensor keep_cells(u64 key, i64 n, i64 threshold) {
    at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kBool));
    bool* keep = out.data_ptr<bool>();
    const u64 t = static_cast<u64>(threshold);
    at::parallel_for(0, n, kIdGrain, [&](i64 lo, i64 hi) {
        for (i64 c = lo; c < hi; ++c) keep[c] = (mix64(key ^ (static_cast<u64>(c) * kGolden)) >> 1) >= t;
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "gsplit's CPU sampler and relabel (kernels/sample_cpu.cpp)";
    m.def("sample_neighbors", &sample_neighbors, "one layer of counter-based neighbour sampling",
          py::arg("indptr"), py::arg("indices"), py::arg("nodes"), py::arg("fanout"), py::arg("replace"),
          py::arg("key"));
    m.def("relabel", &relabel, "dst ++ sorted new ids of src, and src's local indices",
          py::arg("dst_nodes"), py::arg("src"), py::arg("num_nodes"));
    m.def("keep_cells", &keep_cells, "cells whose counter-based draw is at least threshold (dropout masks)",
          py::arg("key"), py::arg("n"), py::arg("threshold"));
}
