// CPU aggregation kernels for gsplit's GNN layers (built at first use by gsplit/ops/cpu_ext.py).
//
// A block's edges are grouped by destination (edge_dst non-decreasing), so the edge list already is a
// CSR matrix by destination: row pointers come from one pass over edge_dst, the column of edge e is
// edge_src[e]. Forward kernels run one destination row per iteration of a parallel loop (no atomics,
// each row summed in edge order: deterministic). Backward kernels regroup the edges by source (a stable
// counting sort, O(edges + sources)) and gather: one source row per iteration of a parallel loop, its
// terms summed in edge order (the same bits for any thread count), reading the destinations' gradient
// rows, a table much smaller than the sources' that stays in cache.
// Nothing here materialises an [edges x width] message tensor; GAT keeps [edges x heads] scalars.

#include <torch/extension.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// Rows per scheduling chunk: rows are short (tens of edges) and degrees are skewed, so dynamic chunks.
constexpr int64_t kChunk = 64;
// How many edges ahead the gather loops prefetch a source row, across row boundaries (most rows have fewer
// edges than that: a row-local window never prefetched a row's first edges). 8 against 4 row-local: a 64-wide
// layer-0 aggregation 1.5x faster (16-18 -> 11-13 ms on a 358k-edge block, one thread), a wider one unchanged.
constexpr int64_t kAhead = 8;

int num_threads() { return std::max(1, at::get_num_threads()); }

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* c = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < n * int64_t(sizeof(T)); b += 64) __builtin_prefetch(c + b);
}

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == torch::kInt64 && t.dim() == 1,
                    name, " must be a 1-D int64 CPU tensor, got ", t.scalar_type(), " of shape ", t.sizes(),
                    " on ", t.device());
}

void check_values(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == dim &&
                        (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble),
                    name, " must be a ", dim, "-D float32 or float64 CPU tensor, got ", t.scalar_type(),
                    " of shape ", t.sizes(), " on ", t.device());
}

// Every index in [0, n), one pass; a bad one raises IndexError (as torch's index ops).
void check_rows_index(const torch::Tensor& idx, int64_t n, const char* what) {
  check_index(idx, "idx");
  const int64_t* i = idx.data_ptr<int64_t>();
  const int64_t m = idx.numel();
  int64_t lo = m ? i[0] : 0, hi = lo;
  for (int64_t k = 1; k < m; ++k) {
    lo = std::min(lo, i[k]);
    hi = std::max(hi, i[k]);
  }
  TORCH_CHECK_INDEX(m == 0 || (lo >= 0 && hi < n), what, ": an index is outside [0, ", n, "): min ", lo, ", max ", hi);
}

}  // namespace

// Row pointers [num_dst + 1] of the destination-grouped edge list, and a check of every index (the kernels do
// not check): destinations grouped and in [0, num_dst) (a wrong order would silently mix rows), sources in
// [0, num_src). Returns (indptr, problem, edge): problem 0 when all is well, else 1 (edge_dst[edge] outside
// [0, num_dst)), 2 (edge_dst not grouped at edge) or 3 (edge_src[edge] outside [0, num_src)); Python raises
// the error. Bad data is returned rather than thrown: on the first GPU run's host a C++ exception from this
// function killed the Python process (a pytest worker) instead of reaching Python as a ValueError.
std::tuple<torch::Tensor, int64_t, int64_t> dst_indptr(torch::Tensor edge_src, torch::Tensor edge_dst,
                                                       int64_t num_src, int64_t num_dst) {
  check_index(edge_src, "edge_src");
  check_index(edge_dst, "edge_dst");
  auto src = edge_src.contiguous(), dst = edge_dst.contiguous();
  const int64_t E = dst.numel();
  auto indptr = torch::empty({num_dst + 1}, torch::kInt64);
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t* d = dst.data_ptr<int64_t>();
  int64_t* p = indptr.data_ptr<int64_t>();
  p[0] = 0;
  int64_t r = 0;  // rows < r are closed: p[0..r] is final
  for (int64_t e = 0; e < E; ++e) {
    const int64_t v = d[e];
    if (v < 0 || v >= num_dst) return {indptr, 1, e};
    if (v < r) return {indptr, 2, e};
    if (s[e] < 0 || s[e] >= num_src) return {indptr, 3, e};
    for (; r < v; ++r) p[r + 1] = e;
  }
  for (; r < num_dst; ++r) p[r + 1] = E;
  return {indptr, 0, -1};
}

namespace {

// Sum (mean: divided by the row's entry count, as torch's `agg / deg` does: the same bits) of x's rows
// col[p[i]..p[i+1]) into out[i].
template <typename T>
void spmm_rows(const int64_t* __restrict__ p, const int64_t* __restrict__ col, const T* __restrict__ x,
               T* __restrict__ out, int64_t rows, int64_t F, bool mean) {
  const int64_t last = p[rows];  // the end of the edge list: prefetch runs across rows
#pragma omp parallel for schedule(dynamic, kChunk) num_threads(num_threads())
  for (int64_t i = 0; i < rows; ++i) {
    T* __restrict__ o = out + i * F;
    std::fill(o, o + F, T(0));
    const int64_t end = p[i + 1];
    for (int64_t j = p[i]; j < end; ++j) {
      // Source rows are scattered over x: ask for a later one while this one is summed.
      if (j + kAhead < last) prefetch_row(x + col[j + kAhead] * F, F);
      const T* __restrict__ xr = x + col[j] * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] += xr[f];
    }
    if (mean && end - p[i] > 1) {
      const T deg = T(end - p[i]);
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] /= deg;
    }
  }
}

// The destination-grouped edge list regrouped by source, stably (a counting sort): source u's edges are
// [ptr[u], ptr[u + 1]) of `dst` (each edge's destination, in edge order, hence ascending) and, with
// `with_edge_ids` (GAT's backward reads per-edge scalars), of `edge`.
struct EdgesBySource {
  std::vector<int64_t> ptr, dst, edge;  // edge: each entry's index in the destination-grouped list
};

inline EdgesBySource edges_by_source(const int64_t* __restrict__ p, const int64_t* __restrict__ src, int64_t nd,
                                     int64_t ns, bool with_edge_ids = false) {
  EdgesBySource t;
  t.ptr.assign(ns + 1, 0);
  t.dst.resize(p[nd] - p[0]);
  if (with_edge_ids) t.edge.resize(p[nd] - p[0]);
  for (int64_t e = p[0]; e < p[nd]; ++e) ++t.ptr[src[e] + 1];
  for (int64_t u = 0; u < ns; ++u) t.ptr[u + 1] += t.ptr[u];
  std::vector<int64_t> next(t.ptr.begin(), t.ptr.end() - 1);
  for (int64_t v = 0; v < nd; ++v) {
    for (int64_t e = p[v]; e < p[v + 1]; ++e) {
      const int64_t j = next[src[e]]++;
      t.dst[j] = v;
      if (with_edge_ids) t.edge[j] = e;
    }
  }
  return t;
}

// g's rows (row stride ld, F columns from column `off`) divided by their destination's edge count where it is
// above 1 (the bits of torch's `grad / deg`), as a compact [nd, F] table.
template <typename T>
std::vector<T> rows_over_degree(const int64_t* __restrict__ p, const T* __restrict__ g, int64_t nd, int64_t F,
                             int64_t ld, int64_t off) {
  std::vector<T> out(nd * F);
  T* __restrict__ o = out.data();
  at::parallel_for(0, nd, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v) {
      const T* __restrict__ gv = g + v * ld + off;
      T* __restrict__ ov = o + v * F;
      const int64_t deg = p[v + 1] - p[v];
      if (deg > 1) {
        const T d = T(deg);
        for (int64_t f = 0; f < F; ++f) ov[f] = gv[f] / d;
      } else {
        std::copy(gv, gv + F, ov);
      }
    }
  });
  return out;
}

// gx[u] = the sum, in edge order, of rows[v] (row stride ld) over u's edges u -> v; with `self`, also self[u - d0]
// (row stride self_ld) for d0 <= u < d0 + nd, summed where destination u - d0 falls in that order (before the
// edges of that destination). A gather per source row: every row is written once, by one thread, in the order
// and with the bits of the scatter over the destination-grouped edges that it replaces, for any thread count.
// Gathering reads the destinations' rows, a table much smaller than the sources' (it stays in cache), where the
// scatter read and wrote source rows all over a large gradient: 12-19 -> 6.4-9.5 ms on a 48k-edge, 256-wide block
// (experiments/README.md, "Backward kernels gather by source").
// `add`: gx already holds another part's gradient of the same sources (an overlapped layer's other part); only
// the rows this part reaches are visited, each summed apart and then added (gx[u] + sum: the bits of autograd
// adding two full gradients), and no [ns x F] gradient of mostly zeros is written.
template <typename T>
void gather_by_source(const EdgesBySource& t, const T* __restrict__ rows, int64_t ld, T* __restrict__ gx, int64_t ns,
                      int64_t F, const T* __restrict__ self, int64_t self_ld, int64_t d0, int64_t nd,
                      bool add = false) {
  const int64_t last = t.ptr[ns];
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<T> part(add ? F : 0);  // add: this part's sum of a row, before it is added
#pragma omp for schedule(dynamic, kChunk)
    for (int64_t u = 0; u < ns; ++u) {
      const int64_t own = u - d0;  // the destination whose own row u is, if any
      bool self_due = self != nullptr && own >= 0 && own < nd;
      const int64_t end = t.ptr[u + 1];
      if (add && !self_due && t.ptr[u] == end) continue;  // this part reaches no row u: gx[u] stays
      T* __restrict__ o = add ? part.data() : gx + u * F;
      std::fill(o, o + F, T(0));
      for (int64_t j = t.ptr[u]; j < end; ++j) {
        const int64_t v = t.dst[j];
        if (self_due && v >= own) {
          const T* __restrict__ sr = self + own * self_ld;
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) o[f] += sr[f];
          self_due = false;
        }
        if (j + kAhead < last) prefetch_row(rows + t.dst[j + kAhead] * ld, F);
        const T* __restrict__ r = rows + v * ld;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) o[f] += r[f];
      }
      if (self_due) {
        const T* __restrict__ sr = self + own * self_ld;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) o[f] += sr[f];
      }
      if (add) {
        T* __restrict__ g = gx + u * F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) g[f] += o[f];
      }
    }
  }
}

// grad_x[u] = sum over edges e = (u -> v), in edge order, of g[v] (mean: g[v] / deg(v)).
template <typename T>
void spmm_transpose(const int64_t* __restrict__ p, const int64_t* __restrict__ src, const T* __restrict__ g,
                    T* __restrict__ gx, int64_t nd, int64_t ns, int64_t F, bool mean, bool add) {
  const EdgesBySource t = edges_by_source(p, src, nd, ns);
  const std::vector<T> scaled = mean ? rows_over_degree(p, g, nd, F, F, 0) : std::vector<T>();
  gather_by_source<T>(t, mean ? scaled.data() : g, F, gx, ns, F, nullptr, 0, 0, 0, add);
}

}  // namespace

// out[i] = sum over j in [indptr[i], indptr[i+1]) of x[col[j]]: one CSR row per output row.
// Forward of copy_u_sum: (dst row pointers, edge_src).
torch::Tensor spmm_sum(torch::Tensor indptr, torch::Tensor col, torch::Tensor x) {
  check_index(indptr, "indptr");
  check_index(col, "col");
  check_values(x, "x", 2);
  auto xc = x.contiguous();
  const int64_t rows = indptr.numel() - 1, F = xc.size(1);
  auto out = torch::empty({rows, F}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "spmm_sum", [&] {
    spmm_rows<scalar_t>(indptr.data_ptr<int64_t>(), col.data_ptr<int64_t>(), xc.data_ptr<scalar_t>(),
                        out.data_ptr<scalar_t>(), rows, F, false);
  });
  return out;
}

// As spmm_sum, each row divided by its entry count (rows without entries stay zero): copy_u_mean's forward.
torch::Tensor spmm_mean(torch::Tensor indptr, torch::Tensor col, torch::Tensor x) {
  check_index(indptr, "indptr");
  check_index(col, "col");
  check_values(x, "x", 2);
  auto xc = x.contiguous();
  const int64_t rows = indptr.numel() - 1, F = xc.size(1);
  auto out = torch::empty({rows, F}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "spmm_mean", [&] {
    spmm_rows<scalar_t>(indptr.data_ptr<int64_t>(), col.data_ptr<int64_t>(), xc.data_ptr<scalar_t>(),
                        out.data_ptr<scalar_t>(), rows, F, true);
  });
  return out;
}

// The gradient `into` that the rows of another part of the same sources went to (an overlapped layer's other
// part): [num_src, F], contiguous, grad_out's dtype; this part's rows are added to it in place.
static void check_into(const torch::Tensor& into, const torch::Tensor& g, int64_t num_src, int64_t F, const char* what) {
  TORCH_CHECK_VALUE(into.device().is_cpu() && into.is_contiguous() && into.scalar_type() == g.scalar_type() &&
                        into.dim() == 2 && into.size(0) == num_src && into.size(1) == F,
                    what, ": into must be a contiguous [", num_src, ", ", F, "] ", g.scalar_type(),
                    " CPU tensor, got ", into.scalar_type(), " of shape ", into.sizes());
}

// Backward of spmm_sum / spmm_mean (by destination row pointers indptr, columns edge_src) w.r.t. x:
// grad_x [num_src, F], each source row summed in edge order (a gather over the edges regrouped by source).
// With `into` (the gradient of another part of the same sources), this part's rows are added to it: returns it.
torch::Tensor spmm_backward(torch::Tensor indptr, torch::Tensor edge_src, torch::Tensor grad_out, int64_t num_src,
                            bool mean, c10::optional<torch::Tensor> into) {
  check_index(indptr, "indptr");
  check_index(edge_src, "edge_src");
  check_values(grad_out, "grad_out", 2);
  auto g = grad_out.contiguous();
  const int64_t nd = indptr.numel() - 1, F = g.size(1);
  TORCH_CHECK_VALUE(g.size(0) == nd, "spmm_backward: grad_out has ", g.size(0), " rows for ", nd, " destinations");
  const bool add = into.has_value();
  if (add) check_into(*into, g, num_src, F, "spmm_backward");
  auto gx = add ? *into : torch::empty({num_src, F}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "spmm_backward", [&] {
    spmm_transpose<scalar_t>(indptr.data_ptr<int64_t>(), edge_src.data_ptr<int64_t>(), g.data_ptr<scalar_t>(),
                             gx.data_ptr<scalar_t>(), nd, num_src, F, mean, add);
  });
  return gx;
}

namespace {

// SAGE-mean's GEMM input [h_dst | mean of the in-neighbours' rows], [nd, 2F], in one pass per row; with `ones`, a
// last column of ones, [nd, 2F + 1]: the bias rides in the GEMM as one more row of the weight, so its gradient is
// part of the weight's product in backward instead of a separate column sum over the layer's [nd, out] gradient.
template <typename T>
void sage_concat_impl(const int64_t* __restrict__ p, const int64_t* __restrict__ col, const T* __restrict__ x,
                      T* __restrict__ out, int64_t nd, int64_t F, int64_t d0, bool ones) {
  const int64_t last = p[nd], ld = 2 * F + (ones ? 1 : 0);
#pragma omp parallel for schedule(dynamic, kChunk) num_threads(num_threads())
  for (int64_t i = 0; i < nd; ++i) {
    T* __restrict__ self = out + i * ld;
    T* __restrict__ o = self + F;
    std::copy(x + (d0 + i) * F, x + (d0 + i + 1) * F, self);
    std::fill(o, o + F, T(0));
    const int64_t end = p[i + 1];
    for (int64_t j = p[i]; j < end; ++j) {
      if (j + kAhead < last) prefetch_row(x + col[j + kAhead] * F, F);
      const T* __restrict__ xr = x + col[j] * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] += xr[f];
    }
    if (end - p[i] > 1) {
      const T deg = T(end - p[i]);
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] /= deg;
    }
    if (ones) o[F] = T(1);
  }
}

// Its backward: grad_x[d0 + v] gets g[v, :F], the sources of v's edges g[v, F:] / deg(v); one gradient over
// the sources (no zero-filled slice gradient to add). Each row is owned by one thread and gets its terms in
// destination order (the self term of v before v's edges): the same bits for any thread count.
template <typename T>
void sage_concat_backward_impl(const int64_t* __restrict__ p, const int64_t* __restrict__ src,
                               const T* __restrict__ g, T* __restrict__ gx, int64_t nd, int64_t ns, int64_t F,
                               int64_t ld, int64_t d0, bool add) {
  const EdgesBySource t = edges_by_source(p, src, nd, ns);
  const std::vector<T> scaled = rows_over_degree(p, g, nd, F, ld, F);  // the mean half, divided by the degree
  gather_by_source<T>(t, scaled.data(), F, gx, ns, F, g, ld, d0, nd, add);
}

}  // namespace

// [x[dst_start + i] | mean of x over row i's entries] for every destination row i: [num_dst, 2F].
torch::Tensor sage_concat(torch::Tensor indptr, torch::Tensor col, torch::Tensor x, int64_t dst_start, bool ones) {
  check_index(indptr, "indptr");
  check_index(col, "col");
  check_values(x, "x", 2);
  auto xc = x.contiguous();
  const int64_t nd = indptr.numel() - 1, F = xc.size(1);
  TORCH_CHECK_VALUE(dst_start >= 0 && dst_start + nd <= xc.size(0), "sage_concat: destinations [", dst_start, ", ",
                    dst_start + nd, ") are not rows of x (", xc.size(0), " rows)");
  auto out = torch::empty({nd, 2 * F + (ones ? 1 : 0)}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "sage_concat", [&] {
    sage_concat_impl<scalar_t>(indptr.data_ptr<int64_t>(), col.data_ptr<int64_t>(), xc.data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), nd, F, dst_start, ones);
  });
  return out;
}

// With `into` (the gradient of another part of the same sources), this part's rows are added to it: returns it.
torch::Tensor sage_concat_backward(torch::Tensor indptr, torch::Tensor edge_src, torch::Tensor grad_out,
                                   int64_t num_src, int64_t dst_start, c10::optional<torch::Tensor> into) {
  check_index(indptr, "indptr");
  check_index(edge_src, "edge_src");
  check_values(grad_out, "grad_out", 2);
  auto g = grad_out.contiguous();
  // [nd, 2F] or, after sage_concat(..., ones=true), [nd, 2F + 1]: the ones column's gradient is not x's
  const int64_t nd = indptr.numel() - 1, ld = g.size(1), F = ld / 2;
  TORCH_CHECK_VALUE(g.size(0) == nd && F > 0, "sage_concat_backward: grad_out ", g.sizes(), " for ", nd,
                    " destinations");
  const bool add = into.has_value();
  if (add) check_into(*into, g, num_src, F, "sage_concat_backward");
  auto gx = add ? *into : torch::empty({num_src, F}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "sage_concat_backward", [&] {
    sage_concat_backward_impl<scalar_t>(indptr.data_ptr<int64_t>(), edge_src.data_ptr<int64_t>(),
                                        g.data_ptr<scalar_t>(), gx.data_ptr<scalar_t>(), nd, num_src, F, ld, dst_start,
                                        add);
  });
  return gx;
}

namespace {

template <typename scalar_t>
void gat_forward_impl(const int64_t* __restrict__ p, const int64_t* __restrict__ src,
                      const scalar_t* __restrict__ zp, const scalar_t* __restrict__ lp,
                      const scalar_t* __restrict__ rp, scalar_t* __restrict__ op, scalar_t* __restrict__ ap,
                      int64_t nd, int64_t H, int64_t D, scalar_t sl) {
  const int64_t HD = H * D, last = p[nd];
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<scalar_t> buf(2 * H);  // per thread: running maximum and sum of each head
    scalar_t* __restrict__ mx = buf.data();
    scalar_t* __restrict__ sm = mx + H;
#pragma omp for schedule(dynamic, kChunk)
    for (int64_t v = 0; v < nd; ++v) {
      const int64_t b = p[v], f = p[v + 1];
      scalar_t* __restrict__ o = op + v * HD;
      std::fill(o, o + HD, scalar_t(0));
      if (b == f) continue;
      const scalar_t* __restrict__ r = rp + v * H;
      std::fill(mx, mx + H, -std::numeric_limits<scalar_t>::infinity());
      std::fill(sm, sm + H, scalar_t(0));
      for (int64_t e = b; e < f; ++e) {
        const scalar_t* __restrict__ l = lp + src[e] * H;
        scalar_t* __restrict__ a = ap + e * H;
        for (int64_t k = 0; k < H; ++k) {
          const scalar_t s = l[k] + r[k];
          a[k] = s > 0 ? s : s * sl;
          mx[k] = std::max(mx[k], a[k]);
        }
      }
      for (int64_t e = b; e < f; ++e) {
        scalar_t* __restrict__ a = ap + e * H;
        for (int64_t k = 0; k < H; ++k) {
          a[k] = std::exp(a[k] - mx[k]);
          sm[k] += a[k];
        }
      }
      for (int64_t e = b; e < f; ++e) {
        if (e + kAhead < last) prefetch_row(zp + src[e + kAhead] * HD, HD);
        scalar_t* __restrict__ a = ap + e * H;
        const scalar_t* __restrict__ zr = zp + src[e] * HD;
        for (int64_t k = 0; k < H; ++k) {
          a[k] /= sm[k];  // sm >= 1: the maximum contributes exp(0)
          const scalar_t w = a[k];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[k * D + d] += w * zr[k * D + d];
        }
      }
    }
  }
}

}  // namespace

// GAT forward for every destination row v and head k: scores s_e = leaky_relu(el[u_e, k] + er[v, k]),
// alpha = stable softmax of s over v's edges, out[v, k] = sum_e alpha_e z[u_e, k]. Returns (out, alpha).
std::vector<torch::Tensor> gat_forward(torch::Tensor indptr, torch::Tensor edge_src, torch::Tensor z,
                                       torch::Tensor el, torch::Tensor er, double slope) {
  check_index(indptr, "indptr");
  check_index(edge_src, "edge_src");
  check_values(z, "z", 3);
  check_values(el, "el", 2);
  check_values(er, "er", 2);
  auto zc = z.contiguous(), elc = el.contiguous(), erc = er.contiguous();
  const int64_t nd = indptr.numel() - 1, E = edge_src.numel(), H = zc.size(1), D = zc.size(2);
  TORCH_CHECK_VALUE(erc.size(0) >= nd && erc.size(1) == H && elc.size(1) == H && elc.size(0) == zc.size(0),
                    "gat_forward: shapes do not fit: z ", zc.sizes(), ", el ", elc.sizes(), ", er ", erc.sizes(),
                    ", num_dst ", nd);
  auto out = torch::empty({nd, H, D}, zc.options());
  auto alpha = torch::empty({E, H}, zc.options());
  AT_DISPATCH_FLOATING_TYPES(zc.scalar_type(), "gat_forward", [&] {
    gat_forward_impl<scalar_t>(indptr.data_ptr<int64_t>(), edge_src.data_ptr<int64_t>(), zc.data_ptr<scalar_t>(),
                               elc.data_ptr<scalar_t>(), erc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                               alpha.data_ptr<scalar_t>(), nd, H, D, static_cast<scalar_t>(slope));
  });
  return {out, alpha};
}

namespace {

template <typename scalar_t>
void gat_backward_impl(const int64_t* __restrict__ p, const int64_t* __restrict__ src,
                       const scalar_t* __restrict__ gp,
                       const scalar_t* __restrict__ zp, const scalar_t* __restrict__ lp,
                       const scalar_t* __restrict__ rp, const scalar_t* __restrict__ ap,
                       scalar_t* __restrict__ gpre, scalar_t* __restrict__ gzp, scalar_t* __restrict__ glp,
                       scalar_t* __restrict__ grp, int64_t nd, int64_t ns, int64_t H, int64_t D, scalar_t sl) {
  const int64_t HD = H * D, last = p[nd];
  const EdgesBySource t = edges_by_source(p, src, nd, ns, /*with_edge_ids=*/true);
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<scalar_t> dot(H);  // per thread: sum_e alpha_e * dalpha_e, the softmax Jacobian's rank-one term
#pragma omp for schedule(dynamic, kChunk)
    for (int64_t v = 0; v < nd; ++v) {
      const int64_t b = p[v], f = p[v + 1];
      const scalar_t* __restrict__ gv = gp + v * HD;
      const scalar_t* __restrict__ r = rp + v * H;
      std::fill(dot.begin(), dot.end(), scalar_t(0));
      for (int64_t e = b; e < f; ++e) {  // d loss / d alpha_e = g_v . z_u
        if (e + kAhead < last) prefetch_row(zp + src[e + kAhead] * HD, HD);
        const scalar_t* __restrict__ zr = zp + src[e] * HD;
        const scalar_t* __restrict__ a = ap + e * H;
        scalar_t* __restrict__ ga = gpre + e * H;
        for (int64_t k = 0; k < H; ++k) {
          scalar_t acc = 0;
          // A dot product: let the compiler split the sum over vector lanes (a fixed order: deterministic).
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += gv[k * D + d] * zr[k * D + d];
          ga[k] = acc;
          dot[k] += a[k] * acc;
        }
      }
      scalar_t* __restrict__ gr = grp + v * H;
      for (int64_t e = b; e < f; ++e) {  // through the softmax and the leaky_relu
        const scalar_t* __restrict__ l = lp + src[e] * H;
        const scalar_t* __restrict__ a = ap + e * H;
        scalar_t* __restrict__ ga = gpre + e * H;
        for (int64_t k = 0; k < H; ++k) {
          const scalar_t gs = a[k] * (ga[k] - dot[k]);
          ga[k] = l[k] + r[k] > 0 ? gs : gs * sl;
          gr[k] += ga[k];
        }
      }
    }
    // Pass 2, after pass 1's implicit barrier: a gather per source over its edges in edge order (the order and
    // bits of a scatter over the destination-grouped edges; reads the destinations' small gradient rows).
#pragma omp for schedule(dynamic, kChunk)
    for (int64_t u = 0; u < ns; ++u) {
      scalar_t* __restrict__ gz = gzp + u * HD;
      scalar_t* __restrict__ gl = glp + u * H;
      std::fill(gz, gz + HD, scalar_t(0));
      std::fill(gl, gl + H, scalar_t(0));
      const int64_t f = t.ptr[u + 1];
      for (int64_t j = t.ptr[u]; j < f; ++j) {
        const scalar_t* __restrict__ gv = gp + t.dst[j] * HD;
        const scalar_t* __restrict__ a = ap + t.edge[j] * H;
        const scalar_t* __restrict__ ga = gpre + t.edge[j] * H;
        for (int64_t k = 0; k < H; ++k) {
          const scalar_t w = a[k];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) gz[k * D + d] += w * gv[k * D + d];
          gl[k] += ga[k];
        }
      }
    }
  }
}

}  // namespace

// GAT backward from grad_out [nd, H, D]: returns (grad_z [ns, H, D], grad_el [ns, H], grad_er [nd, H]).
// Pass 1 (rows = destinations): grad of alpha, softmax and leaky_relu per edge, summed into grad_er.
// Pass 2 (a gather per source over its edges, regrouped by source): grad_z and grad_el.
std::vector<torch::Tensor> gat_backward(torch::Tensor grad_out, torch::Tensor indptr, torch::Tensor edge_src,
                                        torch::Tensor z, torch::Tensor el, torch::Tensor er, torch::Tensor alpha,
                                        double slope) {
  check_values(grad_out, "grad_out", 3);
  auto g = grad_out.contiguous(), zc = z.contiguous(), elc = el.contiguous(), erc = er.contiguous();
  const int64_t nd = indptr.numel() - 1, ns = zc.size(0), E = edge_src.numel();
  const int64_t H = zc.size(1), D = zc.size(2);
  auto grad_z = torch::empty_like(zc);
  auto grad_el = torch::empty({ns, H}, zc.options());
  auto grad_er = torch::zeros({erc.size(0), H}, zc.options());
  auto grad_pre = torch::empty({E, H}, zc.options());
  AT_DISPATCH_FLOATING_TYPES(zc.scalar_type(), "gat_backward", [&] {
    gat_backward_impl<scalar_t>(indptr.data_ptr<int64_t>(), edge_src.data_ptr<int64_t>(), g.data_ptr<scalar_t>(), zc.data_ptr<scalar_t>(),
                                elc.data_ptr<scalar_t>(), erc.data_ptr<scalar_t>(), alpha.data_ptr<scalar_t>(),
                                grad_pre.data_ptr<scalar_t>(), grad_z.data_ptr<scalar_t>(),
                                grad_el.data_ptr<scalar_t>(), grad_er.data_ptr<scalar_t>(), nd, ns, H, D,
                                static_cast<scalar_t>(slope));
  });
  return {grad_z, grad_el, grad_er};
}

// Between two layers: ReLU, then dropout with each row's mask drawn from a small 0/1 bank (vertex_dropout):
// out[i] = relu(h[i]) * (mask[rows[i]] * scale). One pass instead of relu, a gather of [n, F] mask rows and a
// product. The same float operations per cell as the unfused ops (mask * scale, then the product), so the same
// bits; relu keeps a NaN (as torch's clamp_min does). Backward needs only the output: where out > 0 the mask
// was 1 (a 0/1 mask), so the gradient is grad * scale there and 0 where out <= 0, as threshold_backward of the
// unfused ops gives; a NaN output passes grad * scale (the unfused ops give 0 where its mask was 0).
namespace {

// A bool tensor's cells as bytes (0 or 1): converted to T in a vectorised loop, where a `bool` operand is not.
inline const uint8_t* bool_bytes(const torch::Tensor& t) { return reinterpret_cast<const uint8_t*>(t.data_ptr<bool>()); }

// Cells of m[0..n) other than 0 and 1: counted, not and-ed into a bool, so that it vectorises (0.36 instead of
// 1.48 ms for a 4096 x 256 bank, which every call checks: four calls per step of an overlapped 3-layer model).
template <typename T>
int64_t non_binary_cells(const T* __restrict__ m, int64_t n) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t k = 0; k < n; ++k) bad += (m[k] != T(0)) & (m[k] != T(1));
  return bad;
}

template <typename T, typename M>  // M: T (a 0/1 float bank) or uint8_t (a bool bank as drawn: 1/4 of the bytes)
void relu_dropout_rows_impl(const T* __restrict__ h, const int64_t* __restrict__ rows, const M* __restrict__ mask,
                            T scale, const int64_t* __restrict__ pos, T* __restrict__ out, int64_t n, int64_t F) {
  // pos == nullptr: row i of out; else row pos[i] (placed)
  at::parallel_for(0, n, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (pos != nullptr && i + kAhead < e) prefetch_row(out + pos[i + kAhead] * F, F);  // scattered rows: ask ahead
      const T* __restrict__ x = h + i * F;
      const M* __restrict__ m = mask + rows[i] * F;
      T* __restrict__ o = out + (pos != nullptr ? pos[i] : i) * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] = (x[f] < T(0) ? T(0) : x[f]) * (T(m[f]) * scale);
    }
  });
}

// f(m) with the mask's cells: bytes for a bool mask, T for a float one (the kernels are templated on both).
template <typename T, typename Fn>
void with_mask(const torch::Tensor& mc, Fn&& f) {
  if (mc.scalar_type() == torch::kBool) {
    f(bool_bytes(mc));
  } else {
    f(static_cast<const T*>(mc.data_ptr<T>()));
  }
}

// h [n, F], one mask row per row of h, and a 2-D CPU mask of h's width, bool or of h's dtype (a float one holding
// only 0 and 1, which backward relies on: one pass over the small bank). Shared by the plain and the placed forward.
void check_relu_dropout_args(const torch::Tensor& h, const torch::Tensor& rows, const torch::Tensor& mask,
                             const char* what) {
  check_values(h, "h", 2);
  check_index(rows, "rows");
  const bool bool_mask = mask.scalar_type() == torch::kBool;
  TORCH_CHECK_VALUE(mask.device().is_cpu() && mask.dim() == 2 && (bool_mask || mask.scalar_type() == h.scalar_type()) &&
                        rows.numel() == h.size(0) && mask.size(1) == h.size(1),
                    what, ": h ", h.sizes(), " ", h.scalar_type(), " needs one row index per row and a 2-D CPU mask "
                    "of its width, bool or of its dtype; got rows ", rows.sizes(), " and mask ", mask.sizes(), " ",
                    mask.scalar_type());
}

// The forward of relu_dropout_rows(_placed) for a bool mask or a float one (checked to hold only 0 and 1).
template <typename T>
void relu_dropout_rows_dispatch(const torch::Tensor& hc, const torch::Tensor& rows, const torch::Tensor& mc,
                                double scale, const int64_t* pos, torch::Tensor& out, const char* what) {
  if (mc.scalar_type() != torch::kBool) {
    const int64_t bad = non_binary_cells(mc.data_ptr<T>(), mc.numel());
    TORCH_CHECK_VALUE(bad == 0, what, ": the mask must hold only 0 and 1 (a dropout bank); ", bad,
                      " cells hold something else");
  }
  with_mask<T>(mc, [&](const auto* m) {
    relu_dropout_rows_impl<T>(hc.data_ptr<T>(), rows.data_ptr<int64_t>(), m, static_cast<T>(scale), pos,
                              out.data_ptr<T>(), hc.size(0), hc.size(1));
  });
}

template <typename T>
void relu_dropout_rows_backward_impl(const T* __restrict__ g, const T* __restrict__ out, T scale, T* __restrict__ gh,
                                     int64_t numel) {
  at::parallel_for(0, numel, 16384, [&](int64_t b, int64_t e) {
    // written so that GCC vectorises it (-O3, default trapping math): the product unconditional, the select as
    // "> 0 or NaN" (a plain `out <= 0 ? 0 : g * s` stays a branch per cell: 3-4x slower at 50 % dropout)
#pragma omp simd
    for (int64_t k = b; k < e; ++k) {
      const T v = g[k] * scale;
      gh[k] = out[k] > T(0) ? v : (out[k] != out[k] ? v : T(0));
    }
  });
}

}  // namespace

// Rows must index the mask (the caller draws them below mask.size(0)); not checked per cell. The mask is bool, or
// of h's dtype holding only 0 and 1 (backward relies on it): checked here, one pass over the (small) bank.
torch::Tensor relu_dropout_rows(torch::Tensor h, torch::Tensor rows, torch::Tensor mask, double scale) {
  check_relu_dropout_args(h, rows, mask, "relu_dropout_rows");
  auto hc = h.contiguous(), mc = mask.contiguous();
  auto out = torch::empty_like(hc);
  AT_DISPATCH_FLOATING_TYPES(hc.scalar_type(), "relu_dropout_rows", [&] {
    relu_dropout_rows_dispatch<scalar_t>(hc, rows, mc, scale, nullptr, out, "relu_dropout_rows");
  });
  return out;
}

torch::Tensor relu_dropout_rows_backward(torch::Tensor grad, torch::Tensor out, double scale) {
  auto gc = grad.contiguous(), oc = out.contiguous();
  TORCH_CHECK_VALUE(gc.sizes() == oc.sizes() && gc.scalar_type() == oc.scalar_type(),
                    "relu_dropout_rows_backward: grad ", gc.sizes(), " ", gc.scalar_type(), " for an output of ",
                    oc.sizes(), " ", oc.scalar_type());
  auto gh = torch::empty_like(oc);
  AT_DISPATCH_FLOATING_TYPES(oc.scalar_type(), "relu_dropout_rows_backward", [&] {
    relu_dropout_rows_backward_impl<scalar_t>(gc.data_ptr<scalar_t>(), oc.data_ptr<scalar_t>(),
                                              static_cast<scalar_t>(scale), gh.data_ptr<scalar_t>(), oc.numel());
  });
  return gh;
}

// Placed: row i of the result goes to row pos[i] of a new [num_rows, F] tensor (an overlapped layer's interior rows,
// straight into the next layer's input: gsplit/overlap.py), the other rows left for the caller to write. Backward
// reads the gradient's rows pos and recomputes each output cell from h and the mask (one product) to decide as
// relu_dropout_rows_backward does (an inf times a dropped cell is NaN there, which passes its gradient), so it
// keeps h, not the output, which the caller writes into afterwards.
namespace {

template <typename T, typename M>
void relu_dropout_placed_backward_impl(const T* __restrict__ g, const T* __restrict__ h,
                                       const int64_t* __restrict__ rows, const M* __restrict__ mask, T scale,
                                       const int64_t* __restrict__ pos, T* __restrict__ gh, int64_t n, int64_t F) {
  at::parallel_for(0, n, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) prefetch_row(g + pos[i + kAhead] * F, F);  // scattered rows: ask ahead
      const T* __restrict__ gr = g + pos[i] * F;
      const T* __restrict__ x = h + i * F;
      const M* __restrict__ m = mask + rows[i] * F;
      T* __restrict__ o = gh + i * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) {  // the forward's output again, decided as relu_dropout_rows_backward does
        const T y = (x[f] < T(0) ? T(0) : x[f]) * (T(m[f]) * scale);
        const T v = gr[f] * scale;
        o[f] = y > T(0) ? v : (y != y ? v : T(0));
      }
    }
  });
}

void check_placed_args(const torch::Tensor& h, const torch::Tensor& rows, const torch::Tensor& mask,
                       const torch::Tensor& pos, int64_t num_rows, const char* what) {
  check_relu_dropout_args(h, rows, mask, what);
  TORCH_CHECK_VALUE(pos.numel() == h.size(0), what, ": h ", h.sizes(), " needs one place per row; got pos ",
                    pos.sizes());
  check_rows_index(pos, num_rows, what);
}

}  // namespace

// relu_dropout_rows with row i written to row pos[i] of a new [num_rows, F] tensor (other rows uninitialised).
// A float mask must hold only 0 and 1: checked, as relu_dropout_rows does.
torch::Tensor relu_dropout_rows_placed(torch::Tensor h, torch::Tensor rows, torch::Tensor mask, double scale,
                                       int64_t num_rows, torch::Tensor pos) {
  check_placed_args(h, rows, mask, pos, num_rows, "relu_dropout_rows_placed");
  auto hc = h.contiguous(), mc = mask.contiguous();
  auto out = torch::empty({num_rows, hc.size(1)}, hc.options());
  AT_DISPATCH_FLOATING_TYPES(hc.scalar_type(), "relu_dropout_rows_placed", [&] {
    relu_dropout_rows_dispatch<scalar_t>(hc, rows, mc, scale, pos.data_ptr<int64_t>(), out, "relu_dropout_rows_placed");
  });
  return out;
}

// Its gradient w.r.t. h: [h.size(0), F] from the rows pos of grad ([num_rows, F]).
torch::Tensor relu_dropout_rows_placed_backward(torch::Tensor grad, torch::Tensor h, torch::Tensor rows,
                                                torch::Tensor mask, double scale, torch::Tensor pos) {
  auto gc = grad.contiguous();
  TORCH_CHECK_VALUE(gc.dim() == 2 && gc.scalar_type() == h.scalar_type() && gc.size(1) == h.size(1),
                    "relu_dropout_rows_placed_backward: grad ", gc.sizes(), " ", gc.scalar_type(), " for rows ",
                    h.sizes(), " ", h.scalar_type());
  check_placed_args(h, rows, mask, pos, gc.size(0), "relu_dropout_rows_placed_backward");
  auto hc = h.contiguous(), mc = mask.contiguous();
  auto gh = torch::empty_like(hc);
  AT_DISPATCH_FLOATING_TYPES(hc.scalar_type(), "relu_dropout_rows_placed_backward", [&] {
    with_mask<scalar_t>(mc, [&](const auto* m) {
      relu_dropout_placed_backward_impl<scalar_t>(gc.data_ptr<scalar_t>(), hc.data_ptr<scalar_t>(),
                                                  rows.data_ptr<int64_t>(), m, static_cast<scalar_t>(scale),
                                                  pos.data_ptr<int64_t>(), gh.data_ptr<scalar_t>(), hc.size(0),
                                                  hc.size(1));
    });
  });
  return gh;
}

// GAT's per-vertex score halves, out[i, h] = sum over d of z[i, h, d] * attn[h, d] (el over the sources, er over
// the destinations), without the [n, H, D] product the unfused `(z * attn).sum(-1)` writes, reads and keeps the
// gradient of. Backward: grad_z[i, h, d] = g[i, h] * attn[h, d] (one product: the bits of the unfused ops) and
// grad_attn[h, d] = sum over i of g[i, h] * z[i, h, d], summed per fixed block of rows and then over the blocks
// in order, so the same bits for any thread count.
namespace {

constexpr int64_t kScoreRows = 2048;  // rows per partial sum of grad_attn

template <typename T>
void gat_scores_impl(const T* __restrict__ z, const T* __restrict__ a, T* __restrict__ out, int64_t n, int64_t H,
                     int64_t D) {
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        const T* __restrict__ zr = z + (i * H + h) * D;
        const T* __restrict__ ar = a + h * D;
        T acc = T(0);
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += zr[d] * ar[d];
        out[i * H + h] = acc;
      }
    }
  });
}

template <typename T>
void gat_scores_backward_impl(const T* __restrict__ g, const T* __restrict__ z, const T* __restrict__ a,
                              T* __restrict__ gz, T* __restrict__ ga, int64_t n, int64_t H, int64_t D) {
  const int64_t HD = H * D, blocks = (n + kScoreRows - 1) / kScoreRows;
  std::vector<T> partial(ga != nullptr ? blocks * HD : 0, T(0));
  at::parallel_for(0, blocks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      T* __restrict__ part = ga != nullptr ? partial.data() + c * HD : nullptr;
      const int64_t end = std::min(n, (c + 1) * kScoreRows);
      for (int64_t i = c * kScoreRows; i < end; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          const T gv = g[i * H + h];
          const T* __restrict__ ar = a + h * D;
          if (gz != nullptr) {
            T* __restrict__ o = gz + (i * H + h) * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o[d] = gv * ar[d];
          }
          if (part != nullptr) {
            const T* __restrict__ zr = z + (i * H + h) * D;
            T* __restrict__ p = part + h * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) p[d] += gv * zr[d];
          }
        }
      }
    }
  });
  if (ga != nullptr) {
    std::fill(ga, ga + HD, T(0));
    for (int64_t c = 0; c < blocks; ++c) {
      const T* __restrict__ part = partial.data() + c * HD;
#pragma omp simd
      for (int64_t k = 0; k < HD; ++k) ga[k] += part[k];
    }
  }
}

void check_scores_args(const torch::Tensor& z, const torch::Tensor& attn, const char* what) {
  check_values(z, "z", 3);
  check_values(attn, "attn", 2);
  TORCH_CHECK_VALUE(attn.size(0) == z.size(1) && attn.size(1) == z.size(2) && attn.scalar_type() == z.scalar_type(),
                    what, ": z ", z.sizes(), " ", z.scalar_type(), " needs attn of shape [", z.size(1), ", ", z.size(2),
                    "] and its dtype; got ", attn.sizes(), " ", attn.scalar_type());
}

}  // namespace

torch::Tensor gat_scores(torch::Tensor z, torch::Tensor attn) {
  check_scores_args(z, attn, "gat_scores");
  auto zc = z.contiguous(), ac = attn.contiguous();
  auto out = torch::empty({zc.size(0), zc.size(1)}, zc.options());
  AT_DISPATCH_FLOATING_TYPES(zc.scalar_type(), "gat_scores", [&] {
    gat_scores_impl<scalar_t>(zc.data_ptr<scalar_t>(), ac.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), zc.size(0),
                              zc.size(1), zc.size(2));
  });
  return out;
}

// (grad_z, grad_attn); either is an empty tensor when not asked for.
std::tuple<torch::Tensor, torch::Tensor> gat_scores_backward(torch::Tensor grad, torch::Tensor z, torch::Tensor attn,
                                                             bool need_z, bool need_attn) {
  check_scores_args(z, attn, "gat_scores_backward");
  auto gc = grad.contiguous(), zc = z.contiguous(), ac = attn.contiguous();
  TORCH_CHECK_VALUE(gc.dim() == 2 && gc.size(0) == zc.size(0) && gc.size(1) == zc.size(1) &&
                        gc.scalar_type() == zc.scalar_type(),
                    "gat_scores_backward: grad ", gc.sizes(), " ", gc.scalar_type(), " for scores of z ", zc.sizes());
  auto gz = need_z ? torch::empty_like(zc) : torch::Tensor();
  auto ga = need_attn ? torch::empty_like(ac) : torch::Tensor();
  AT_DISPATCH_FLOATING_TYPES(zc.scalar_type(), "gat_scores_backward", [&] {
    gat_scores_backward_impl<scalar_t>(gc.data_ptr<scalar_t>(), zc.data_ptr<scalar_t>(), ac.data_ptr<scalar_t>(),
                                       need_z ? gz.data_ptr<scalar_t>() : nullptr,
                                       need_attn ? ga.data_ptr<scalar_t>() : nullptr, zc.size(0), zc.size(1),
                                       zc.size(2));
  });
  return {gz, ga};
}

// ------------------------------------------------------------------------------------------------ row copies
// The shuffles' and the feature store's row copies: out[i] = x[idx[i]] (gather) and out[idx[i]] = x[i] (scatter),
// a memcpy per row with the row kAhead places on prefetched. torch's index_copy_ runs 2x slower on scattered rows
// (8.4 against 4.2 ms for 19.8k 256-wide rows into 26k, 8.8 against 2.6 ms for 62k 64-wide rows, one thread),
// its index_select 1.2-1.6x. Indices are checked first (one pass): a bad one raises, as torch's ops do.

namespace {

template <typename T>
void copy_rows(const T* __restrict__ x, const int64_t* __restrict__ xi, T* __restrict__ out,
               const int64_t* __restrict__ oi, int64_t n, int64_t F) {
  // xi == nullptr: read row k of x; oi == nullptr: write row k of out
  at::parallel_for(0, n, 2048, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      if (k + kAhead < e) {
        const int64_t a = k + kAhead;
        if (xi != nullptr) prefetch_row(x + xi[a] * F, F);
        if (oi != nullptr) prefetch_row(out + oi[a] * F, F);
      }
      std::memcpy(out + (oi != nullptr ? oi[k] : k) * F, x + (xi != nullptr ? xi[k] : k) * F, F * sizeof(T));
    }
  });
}

}  // namespace

// x[idx] for a 2-D x: [idx.numel(), x.size(1)].
torch::Tensor gather_rows(torch::Tensor x, torch::Tensor idx) {
  check_values(x, "x", 2);
  auto xc = x.contiguous();
  check_rows_index(idx, xc.size(0), "gather_rows");
  const int64_t F = xc.size(1);
  auto out = torch::empty({idx.numel(), F}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "gather_rows", [&] {
    copy_rows<scalar_t>(xc.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), nullptr,
                        idx.numel(), F);
  });
  return out;
}

// out[idx[i]] = x[i] in place, for a contiguous 2-D out and idx of distinct rows (as index_copy_).
void scatter_rows_(torch::Tensor out, torch::Tensor idx, torch::Tensor x) {
  check_values(out, "out", 2);
  check_values(x, "x", 2);
  TORCH_CHECK_VALUE(out.is_contiguous(), "scatter_rows_: out must be contiguous");
  TORCH_CHECK_VALUE(x.scalar_type() == out.scalar_type() && x.size(1) == out.size(1) && x.size(0) == idx.numel(),
                    "scatter_rows_: x ", x.sizes(), " ", x.scalar_type(), " does not fit out ", out.sizes(), " ",
                    out.scalar_type(), " at ", idx.numel(), " indices");
  check_rows_index(idx, out.size(0), "scatter_rows_");
  auto xc = x.contiguous();
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "scatter_rows_", [&] {
    copy_rows<scalar_t>(xc.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(),
                        idx.numel(), xc.size(1));
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gsplit CPU aggregation kernels (CSR by destination, deterministic, no per-edge messages)";
  m.def("dst_indptr", &dst_indptr, "row pointers of a destination-grouped edge list; checks all indices");
  m.def("spmm_sum", &spmm_sum, "out[i] = sum of x[col[j]] over row i's entries");
  m.def("spmm_mean", &spmm_mean, "spmm_sum divided by each row's entry count");
  m.def("spmm_backward", &spmm_backward, "grad of spmm_sum / spmm_mean w.r.t. x, each source row summed in edge order",
        py::arg("indptr"), py::arg("edge_src"), py::arg("grad_out"), py::arg("num_src"), py::arg("mean"),
        py::arg("into") = py::none());
  m.def("sage_concat", &sage_concat, "[x[dst_start + i] | mean of x over row i's entries (| 1 with ones)]",
        py::arg("indptr"), py::arg("col"), py::arg("x"), py::arg("dst_start"), py::arg("ones") = false);
  m.def("sage_concat_backward", &sage_concat_backward, "grad of sage_concat w.r.t. x",
        py::arg("indptr"), py::arg("edge_src"), py::arg("grad_out"), py::arg("num_src"), py::arg("dst_start"),
        py::arg("into") = py::none());
  m.def("gat_forward", &gat_forward, "fused GAT edge softmax and weighted sum: (out, alpha)");
  m.def("gat_backward", &gat_backward, "backward of gat_forward: (grad_z, grad_el, grad_er)");
  m.def("relu_dropout_rows", &relu_dropout_rows, "relu(h[i]) * (mask[rows[i]] * scale) for every row i");
  m.def("relu_dropout_rows_backward", &relu_dropout_rows_backward, "grad of relu_dropout_rows w.r.t. h, from its output");
  m.def("relu_dropout_rows_placed", &relu_dropout_rows_placed, "relu_dropout_rows, row i at row pos[i] of a new tensor");
  m.def("relu_dropout_rows_placed_backward", &relu_dropout_rows_placed_backward,
        "grad of relu_dropout_rows_placed w.r.t. h, from h and the mask");
  m.def("gat_scores", &gat_scores, "out[i, h] = sum over d of z[i, h, d] * attn[h, d]");
  m.def("gat_scores_backward", &gat_scores_backward, "backward of gat_scores: (grad_z, grad_attn)");
  m.def("gather_rows", &gather_rows, "x[idx] for a 2-D x");
  m.def("scatter_rows_", &scatter_rows_, "out[idx[i]] = x[i] in place (distinct idx)");
}
