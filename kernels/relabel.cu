// Relabel a block's global vertex ids to local indices with a GPU hash table.
//
// Same result as gsplit.sampling.neighbor.relabel: src_nodes = dst_nodes ++ sorted(ids of src that are
// not in dst_nodes), and src_local[j] is the position of src[j] in src_nodes. The table maps a global
// id to its local index; only the new ids are sorted (by torch), not dst ++ src as torch.unique does.
//
// Launches, driven by gsplit/ops/cuda.py, on a table of `mask + 1` (a power of two, at most half full)
// slots whose keys start as GSPLIT_EMPTY (all bits set; vertex ids are never negative):
//   gsplit_relabel_insert_dst   key dst[i] -> value i                  (dst ids are unique)
//   gsplit_relabel_insert_src   insert every src id; each id first seen here is appended to new_ids
//   (torch.sort of new_ids on the host side's stream)
//   gsplit_relabel_assign       key sorted_new[r] -> value num_dst + r
//   gsplit_relabel_lookup       src_local[j] = value of src[j]
//
// No #include (NVRTC has no host headers); only threadIdx/blockIdx/blockDim/gridDim (.x), atomicCAS
// and atomicAdd on unsigned long long are used, so tests can run the kernels serially on the CPU.

typedef long long gs_i64;
typedef unsigned long long gs_u64;

#define GSPLIT_EMPTY 0xFFFFFFFFFFFFFFFFULL
#define GSPLIT_FIB 0x9E3779B97F4A7C15ULL

// Fibonacci hashing: the top bits of key * 2^64/phi spread consecutive ids over the table.
__device__ __forceinline__ gs_i64 gs_slot(gs_u64 key, int shift) {
    return (gs_i64)((key * GSPLIT_FIB) >> shift);
}

// Insert `key` (linear probing). Returns its slot; *inserted tells whether this call added it.
__device__ __forceinline__ gs_i64 gs_table_insert(gs_u64* keys, gs_i64 mask, int shift, gs_u64 key, int* inserted) {
    gs_i64 slot = gs_slot(key, shift);
    while (true) {
        const gs_u64 prev = atomicCAS(keys + slot, GSPLIT_EMPTY, key);
        if (prev == GSPLIT_EMPTY) {
            *inserted = 1;
            return slot;
        }
        if (prev == key) {
            *inserted = 0;
            return slot;
        }
        slot = (slot + 1) & mask;
    }
}

// Slot of a key inserted by an earlier launch (so plain reads see it).
__device__ __forceinline__ gs_i64 gs_table_find(const gs_u64* keys, gs_i64 mask, int shift, gs_u64 key) {
    gs_i64 slot = gs_slot(key, shift);
    while (keys[slot] != key) {
        slot = (slot + 1) & mask;
    }
    return slot;
}

extern "C" __global__ void gsplit_relabel_insert_dst(
    gs_u64* __restrict__ keys, gs_i64* __restrict__ vals, gs_i64 mask, int shift,
    const gs_i64* __restrict__ dst, gs_i64 num_dst)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 i = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; i < num_dst; i += stride) {
        int inserted;
        const gs_i64 slot = gs_table_insert(keys, mask, shift, (gs_u64)dst[i], &inserted);
        vals[slot] = i;
    }
}

// new_ids needs room for num_src entries; *num_new counts the distinct ids not in dst.
extern "C" __global__ void gsplit_relabel_insert_src(
    gs_u64* __restrict__ keys, gs_i64 mask, int shift,
    const gs_i64* __restrict__ src, gs_i64 num_src,
    gs_i64* __restrict__ new_ids, gs_u64* __restrict__ num_new)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 j = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; j < num_src; j += stride) {
        int inserted;
        gs_table_insert(keys, mask, shift, (gs_u64)src[j], &inserted);
        if (inserted) {
            new_ids[atomicAdd(num_new, 1ULL)] = src[j];
        }
    }
}

extern "C" __global__ void gsplit_relabel_assign(
    const gs_u64* __restrict__ keys, gs_i64* __restrict__ vals, gs_i64 mask, int shift,
    const gs_i64* __restrict__ sorted_new, gs_i64 num_new, gs_i64 num_dst)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 r = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; r < num_new; r += stride) {
        vals[gs_table_find(keys, mask, shift, (gs_u64)sorted_new[r])] = num_dst + r;
    }
}

extern "C" __global__ void gsplit_relabel_lookup(
    const gs_u64* __restrict__ keys, const gs_i64* __restrict__ vals, gs_i64 mask, int shift,
    const gs_i64* __restrict__ src, gs_i64 num_src, gs_i64* __restrict__ src_local)
{
    const gs_i64 stride = (gs_i64)blockDim.x * gridDim.x;
    for (gs_i64 j = (gs_i64)blockIdx.x * blockDim.x + threadIdx.x; j < num_src; j += stride) {
        src_local[j] = vals[gs_table_find(keys, mask, shift, (gs_u64)src[j])];
    }
}
