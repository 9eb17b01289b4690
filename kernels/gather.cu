// Gather feature rows for gsplit.feature_store.FeatureStore: cached rows from GPU memory, the others
// straight from pinned host memory (zero-copy over PCIe/NVLink through unified virtual addressing).
//
// out[i] = slots[i] >= 0 ? cache[slots[i]] : host[ids[i]]        (one row = `words` words of type W)
//
// One thread per output word, consecutive threads on consecutive words of a row, so both the reads
// (of the cache or of host memory) and the writes are coalesced. Four entry points differ only in the
// word size (16, 8, 4 or 1 bytes); the wrapper picks the widest that divides the row size and aligns
// every base pointer, because wide reads use PCIe best.
//
// No #include (NVRTC has no host headers); only threadIdx/blockIdx/blockDim/gridDim (.x) are used, so
// tests can run the kernels serially on the CPU.

typedef long long gsg_i64;

struct alignas(16) gsg_word16 {
    unsigned long long lo, hi;
};

template <typename W>
__device__ __forceinline__ void gsg_gather_rows(const W* cache, const W* host, const gsg_i64* slots, const gsg_i64* ids,
                                                gsg_i64 n, gsg_i64 words, W* out) {
    const gsg_i64 total = n * words;
    const gsg_i64 stride = (gsg_i64)blockDim.x * gridDim.x;
    for (gsg_i64 i = (gsg_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const gsg_i64 row = i / words;
        const gsg_i64 w = i - row * words;
        const gsg_i64 slot = slots[row];
        const W* src = slot >= 0 ? cache + slot * words : host + ids[row] * words;
        out[i] = src[w];
    }
}

extern "C" __global__ void gsplit_gather_rows_16(const gsg_word16* cache, const gsg_word16* host, const gsg_i64* slots,
                                                 const gsg_i64* ids, gsg_i64 n, gsg_i64 words, gsg_word16* out) {
    gsg_gather_rows(cache, host, slots, ids, n, words, out);
}

extern "C" __global__ void gsplit_gather_rows_8(const unsigned long long* cache, const unsigned long long* host,
                                                const gsg_i64* slots, const gsg_i64* ids, gsg_i64 n, gsg_i64 words,
                                                unsigned long long* out) {
    gsg_gather_rows(cache, host, slots, ids, n, words, out);
}

extern "C" __global__ void gsplit_gather_rows_4(const unsigned int* cache, const unsigned int* host, const gsg_i64* slots,
                                                const gsg_i64* ids, gsg_i64 n, gsg_i64 words, unsigned int* out) {
    gsg_gather_rows(cache, host, slots, ids, n, words, out);
}

extern "C" __global__ void gsplit_gather_rows_1(const unsigned char* cache, const unsigned char* host,
                                                const gsg_i64* slots, const gsg_i64* ids, gsg_i64 n, gsg_i64 words,
                                                unsigned char* out) {
    gsg_gather_rows(cache, host, slots, ids, n, words, out);
}
