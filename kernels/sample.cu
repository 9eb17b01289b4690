// Counter-based uniform neighbour sampling on the GPU.
//
// Picks exactly the edges that gsplit.sampling.neighbor.NeighborSampler.sample_neighbors picks on the
// CPU for the same (seed, epoch, iteration, layer, vertex): the same SplitMix64 arithmetic as
// gsplit/sampling/counter_rng.py (change both together; tests compare them), the same Floyd's
// algorithm without replacement, and positions sorted ascending within each destination.
//
// Three launches, driven by gsplit/ops/cuda.py:
//   gsplit_sample_count   one thread per destination: start, degree and number of picks
//   (torch.cumsum on the host side's stream: inclusive ends of each destination's output run)
//   gsplit_sample_fill    one thread per destination: picks, sorted, written as edge ids
//   gsplit_sample_all     one warp per destination: every in-edge (fanout -1, power-law degrees)
//
// The graph arrays may live in GPU memory or in pinned host memory reached through unified virtual
// addressing: the kernels only read through the pointers they are given.
//
// No #include: CuPy compiles this file with NVRTC, which has no host headers. The only built-ins
// used are threadIdx/blockIdx/blockDim/gridDim (.x), so tests can also run these kernels serially
// on the CPU with a small shim.

typedef long long gs_i64;
typedef unsigned long long gs_u64;

#define GSPLIT_GOLDEN 0x9E3779B97F4A7C15ULL
#define GSPLIT_MIX_M1 0xBF58476D1CE4E5B9ULL
#define GSPLIT_MIX_M2 0x94D049BB133111EBULL

// SplitMix64 finaliser, as counter_rng.mix64.
__device__ __forceinline__ gs_u64 gs_mix64(gs_u64 z) {
    z = (z ^ (z >> 30)) * GSPLIT_MIX_M1;
    z = (z ^ (z >> 27)) * GSPLIT_MIX_M2;
    return z ^ (z >> 31);
}

// Draw number `draw` of a vertex: uniform in [0, bound), as counter_rng.draw_below (top 63 bits mod bound).
__device__ __forceinline__ gs_i64 gs_draw_below(gs_u64 vkey, gs_i64 draw, gs_i64 bound) {
    gs_u64 r = gs_mix64(vkey + (gs_u64)(draw + 1) * GSPLIT_GOLDEN);
    return (gs_i64)((r >> 1) % (gs_u64)bound);
}

// Pass 1. For destination i: start[i] = indptr[v], deg[i] = in-degree of v, counts[i] = number of
// edges the sampler keeps. An id outside [0, num_nodes) sets *bad = 1 and counts 0 edges, so the
// caller can raise instead of reading out of bounds.
extern "C" __global__ void gsplit_sample_count(
    const gs_i64* __restrict__ indptr, gs_i64 num_nodes,
    const gs_i64* __restrict__ nodes, gs_i64 n,
    gs_i64 fanout, int replace,
    gs_i64* __restrict__ start, gs_i64* __restrict__ deg, gs_i64* __restrict__ counts,
    gs_i64* __restrict__ bad)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 i = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const gs_i64 v = nodes[i];
        if (v < 0 || v >= num_nodes) {
            *bad = 1;  // every offender writes the same value: a benign race
            start[i] = 0;
            deg[i] = 0;
            counts[i] = 0;
            continue;
        }
        const gs_i64 s = indptr[v];
        const gs_i64 d = indptr[v + 1] - s;
        gs_i64 c;
        if (fanout < 0) {
            c = d;                          // -1: every in-edge, with or without replacement
        } else if (replace) {
            c = d > 0 ? fanout : 0;
        } else {
            c = d < fanout ? d : fanout;
        }
        start[i] = s;
        deg[i] = d;
        counts[i] = c;
    }
}

// Pass 2, one thread per destination (fanout >= 1; also correct for -1 but unbalanced on hubs).
// ends[i] is the inclusive prefix sum of counts, so destination i owns output slots
// [ends[i-1], ends[i]). Those edge_ids slots double as scratch for the picked positions, so any
// fanout works without a fixed-size local array; the O(fanout^2) membership test and insertion sort
// are cheap for the fanouts GNNs use (<= ~32) and stay correct for larger ones.
extern "C" __global__ void gsplit_sample_fill(
    const gs_i64* __restrict__ indices,
    const gs_i64* __restrict__ nodes, const gs_i64* __restrict__ start, const gs_i64* __restrict__ deg,
    const gs_i64* __restrict__ ends, gs_i64 n,
    gs_i64 fanout, int replace, gs_u64 key,
    gs_i64* __restrict__ src, gs_i64* __restrict__ dst_index, gs_i64* __restrict__ edge_ids)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 i = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const gs_i64 begin = i > 0 ? ends[i - 1] : 0;
        const gs_i64 cnt = ends[i] - begin;
        if (cnt == 0) {
            continue;
        }
        const gs_i64 s = start[i];
        const gs_i64 d = deg[i];
        gs_i64* pos = edge_ids + begin;
        if (fanout < 0 || (!replace && d <= fanout)) {
            for (gs_i64 j = 0; j < cnt; ++j) {
                pos[j] = j;
            }
        } else {
            const gs_u64 vkey = gs_mix64(key ^ ((gs_u64)nodes[i] * GSPLIT_GOLDEN));
            if (replace) {
                for (gs_i64 j = 0; j < fanout; ++j) {
                    pos[j] = gs_draw_below(vkey, j, d);
                }
            } else {
                // Floyd's algorithm: a uniform fanout-subset of [0, d) in fanout draws, no rejection loop.
                for (gs_i64 j = 0; j < fanout; ++j) {
                    const gs_i64 top = d - fanout + j;
                    gs_i64 r = gs_draw_below(vkey, j, top + 1);
                    for (gs_i64 t = 0; t < j; ++t) {
                        if (pos[t] == r) {
                            r = top;
                            break;
                        }
                    }
                    pos[j] = r;
                }
            }
            // Ascending positions, so edges come in CSC order as on the CPU.
            for (gs_i64 j = 1; j < fanout; ++j) {
                const gs_i64 x = pos[j];
                gs_i64 t = j - 1;
                while (t >= 0 && pos[t] > x) {
                    pos[t + 1] = pos[t];
                    --t;
                }
                pos[t + 1] = x;
            }
        }
        for (gs_i64 j = 0; j < cnt; ++j) {
            const gs_i64 e = s + pos[j];
            pos[j] = e;
            src[begin + j] = indices[e];
            dst_index[begin + j] = i;
        }
    }
}

// Pass 2 for fanout -1: one warp per destination, lanes stride over its in-edges, so a hub with
// millions of in-edges does not serialise on one thread. blockDim.x must be a multiple of 32.
extern "C" __global__ void gsplit_sample_all(
    const gs_i64* __restrict__ indices,
    const gs_i64* __restrict__ start, const gs_i64* __restrict__ ends, gs_i64 n,
    gs_i64* __restrict__ src, gs_i64* __restrict__ dst_index, gs_i64* __restrict__ edge_ids)
{
    const gs_i64 lane = threadIdx.x & 31;
    const gs_i64 num_warps = ((gs_i64)blockDim.x * gridDim.x) >> 5;
    for (gs_i64 i = ((gs_i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n; i += num_warps) {
        const gs_i64 begin = i > 0 ? ends[i - 1] : 0;
        const gs_i64 cnt = ends[i] - begin;
        const gs_i64 s = start[i];
        for (gs_i64 j = lane; j < cnt; j += 32) {
            const gs_i64 e = s + j;
            edge_ids[begin + j] = e;
            src[begin + j] = indices[e];
            dst_index[begin + j] = i;
        }
    }
}
