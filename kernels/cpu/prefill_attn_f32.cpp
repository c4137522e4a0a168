// Chunked-prefill attention in float32 with fused multiply-add: the prefill kernel of CPUs without AVX512-BF16.
//
// What it replaces: SDPA on a bfloat16 chunk where prefill_attn.cpp (AVX512-BF16 pair products) is not built, an
// AVX2 + FMA machine such as an AMD EPYC before Zen 4: there ATen has no bf16 dot product and emulates one. It keeps
// prefill_attn.cpp's design: (1) GQA folded into the rows, so the G query heads of a kv head read each K and V row
// once, as G times as many rows of one matmul; (2) tiles of 60 rows by 256 keys, an online softmax over the blocks;
// (3) the causal and window range of each row computed from positions, no mask read. Two layouts are about memory
// (2026-12-07): V is packed in 16-dim panels, and a work item runs up to kGroup tiles of a head over each block of
// keys in turn, so a block read from memory serves 240 rows rather than 60 (run_item). What differs is the arithmetic:
// K and V are widened to float32 once per call (exact from bf16), products are float32 FMAs, and the weights stay in
// float32 (no rounding to bf16 before they multiply V).
//
// Algorithm, per tile (kv head h, 60 rows; row r is token t = r / G, query head h * G + r % G):
//   pack K of head h into 16-key tiles, d-major (Kp[j / 16][d][j % 16]), V into 16-dim panels (Vp[d / 16][j][d % 16]),
//   both float32, zero past N;
//   for each block of 256 keys the tile's rows can see (causal, and within the window if any):
//       S[i, j]  = scale * (q_i . K_j)                        (6 rows x 16 keys at a time: 12 ymm accumulators)
//       for row i, over its visible keys [a_i, b_i) of the block (none: its P row is 0):
//           m_new = max(m_i, max_j S[i, j]);  alpha = exp(m_i - m_new)
//           P[i, j] = exp(S[i, j] - m_new), 0 outside [a_i, b_i)   (in place of S)
//           l_i = l_i * alpha + sum_j P[i, j];  O_i *= alpha
//       O[i, :] += P[i, :] . V                                (6 rows x 16 dims at a time, keys in order)
//   out_i = O_i * (1 / l_i).
// Visibility: query t (position q0 + t) sees key j (position k0 + j) for j in [max(0, q0 + t - w + 1 - k0), q0 + t
// - k0 + 1), w the window (0: none). A microkernel skips the 16-key tiles outside its 6 rows' union of ranges;
// what it skips has weight exactly 0.
//
// Microkernel shape: 6 rows by kCols 16-key tiles (kCols = 2 with AVX-512, 1 with AVX2): 12 accumulator registers,
// one or two K (or V) loads and one broadcast of q (or P) per step, within AVX2's 16 ymm registers.
//
// Determinism: written in simd.h's vector type only, with each score a chain of fmas over d in order, each output
// a chain of fmas over keys in order, and hsum's tree for every sum: the same bits with AVX-512, AVX2 + FMA or the
// portable loops (tests/test_cpu_kernel.py compares builds), and at any thread count (an item is one thread's).
// The portable build computes it too, slowly: `f32_prefill_vectorized` says whether this build is the fast one.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

namespace {

using skv::kLanes;
using skv::V16;

constexpr int64_t kRows = 60;                       // query rows per work item: 10 microkernel calls
constexpr int kMicro = 6;                           // rows per microkernel call
constexpr int kCols = SPARSEKV_AVX512 ? 2 : 1;      // 16-key (or 16-dim) tiles per microkernel call
constexpr int64_t kBlock = 256;                     // keys per softmax block, a multiple of 32
constexpr int64_t kGroup = 4;                       // tiles per work item at most (run_item)
using skv::kNegBig;                                 // below it exp is exactly 0 (simd.h)

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Kp[(j / 16) * D * 16 + d * 16 + j % 16] = K[j, d] for j < Np (0 past N): one 16-float load holds element d of
// 16 keys. Rows of k are `stride` elements apart.
template <typename T>
void pack_k(const T* k, int64_t stride, int64_t N, int64_t Np, int64_t D, float* out) {
  for (int64_t t = 0; t < Np / kLanes; ++t) {
    float* dst = out + t * D * kLanes;
    for (int64_t jj = 0; jj < kLanes; ++jj) {
      const int64_t j = t * kLanes + jj;
      const T* row = k + j * stride;
      for (int64_t d = 0; d < D; ++d) dst[d * kLanes + jj] = j < N ? skv::to_float(row[d]) : 0.f;
    }
  }
}

// Vp[(d / 16) * Np * 16 + j * 16 + d % 16] = V[j, d] for j < Np (0 past N): panels of 16 dims, each key's 16
// floats one 64-byte line, so P V streams each panel in order. Row-major [j][d] put each key of a 16-dim strip D
// floats apart: at D = 256, 1 KiB apart, every line of a block's strip in 4 of L1's 64 sets (measured on Gemma's shape
// at 8k: the kernel at 0.8x SDPA's speed with that layout, 2026-12-07).
template <typename T>
void pack_v(const T* v, int64_t stride, int64_t N, int64_t Np, int64_t D, float* out) {
  for (int64_t j = 0; j < Np; ++j)
    for (int64_t d = 0; d < D; ++d)
      out[(d / kLanes) * Np * kLanes + j * kLanes + d % kLanes] = j < N ? skv::to_float(v[j * stride + d]) : 0.f;
}

// The microkernels' accumulators are named variables, one (kCols = 1) or two (kCols = 2) V16 per row: as arrays,
// GCC kept them in memory and stored all twelve on every step of the loop (measured: a third of AVX2's FMA rate).
#define SKV_ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)

// S[i, c * 16 : c * 16 + 16] = scale * (q_i . K[16-key tile c]) for 6 rows and C tiles (kt: the first tile).
template <int C>
inline void scores_6(const float* const* q, const float* kt, int64_t D, float scale, float* S, int64_t lds) {
  static_assert(C == 1 || C == 2, "one or two 16-key tiles");
#define SKV_DECL(i) V16 a##i##0 = skv::zero(), a##i##1 = skv::zero(); const float* q##i = q[i];
  SKV_ROWS6(SKV_DECL)
#undef SKV_DECL
  const float* k1 = kt + D * kLanes;
  for (int64_t d = 0; d < D; ++d) {
    const V16 k0v = skv::load(kt + d * kLanes);
    if constexpr (C == 2) {
      const V16 k1v = skv::load(k1 + d * kLanes);
#define SKV_STEP(i) { const V16 x = skv::splat(q##i[d]); a##i##0 = skv::fma(x, k0v, a##i##0); \
                      a##i##1 = skv::fma(x, k1v, a##i##1); }
      SKV_ROWS6(SKV_STEP)
#undef SKV_STEP
    } else {
#define SKV_STEP(i) a##i##0 = skv::fma(skv::splat(q##i[d]), k0v, a##i##0);
      SKV_ROWS6(SKV_STEP)
#undef SKV_STEP
    }
  }
  const V16 s = skv::splat(scale);
#define SKV_STORE(i) skv::store(S + i * lds, skv::mul(a##i##0, s)); \
                     if constexpr (C == 2) skv::store(S + i * lds + kLanes, skv::mul(a##i##1, s));
  SKV_ROWS6(SKV_STORE)
#undef SKV_STORE
}

// O[i, d0 : d0 + 16 C] += sum_{j in [j0, j1)} P[i, j] * V[j, d0 : d0 + 16 C] for 6 rows, keys in ascending order;
// v0 (and v1 for C = 2): V's panels of dims d0.. (and d0 + 16..), from the block's first key (pack_v).
template <int C>
inline void pv_6(const float* const* p, int64_t j0, int64_t j1, const float* v0, const float* v1, int64_t d0,
                 float* const* o) {
  static_assert(C == 1 || C == 2, "one or two 16-dim chunks");
#define SKV_DECL(i) V16 a##i##0 = skv::load(o[i] + d0), a##i##1 = C == 2 ? skv::load(o[i] + d0 + kLanes) : skv::zero(); \
                    const float* p##i = p[i];
  SKV_ROWS6(SKV_DECL)
#undef SKV_DECL
  for (int64_t j = j0; j < j1; ++j) {
    const V16 x0 = skv::load(v0 + j * kLanes);
    if constexpr (C == 2) {
      const V16 x1 = skv::load(v1 + j * kLanes);
#define SKV_STEP(i) { const V16 w = skv::splat(p##i[j]); a##i##0 = skv::fma(w, x0, a##i##0); \
                      a##i##1 = skv::fma(w, x1, a##i##1); }
      SKV_ROWS6(SKV_STEP)
#undef SKV_STEP
    } else {
#define SKV_STEP(i) a##i##0 = skv::fma(skv::splat(p##i[j]), x0, a##i##0);
      SKV_ROWS6(SKV_STEP)
#undef SKV_STEP
    }
  }
#define SKV_STORE(i) skv::store(o[i] + d0, a##i##0); if constexpr (C == 2) skv::store(o[i] + d0 + kLanes, a##i##1);
  SKV_ROWS6(SKV_STORE)
#undef SKV_STORE
}
#undef SKV_ROWS6

// Row i's scores S[0:n] (n a multiple of 16) become its weights P = exp(S - m) on [a, b) and 0 elsewhere, in
// place; returns their sum (lanes, then hsum).
inline float exp_row(float* S, int64_t n, int64_t a, int64_t b, float m) {
  std::fill(S, S + a, kNegBig);                                   // exp(kNegBig - m) is exactly 0
  std::fill(S + b, S + n, kNegBig);
  const V16 mv = skv::splat(m);
  V16 sum = skv::zero();
  for (int64_t j = 0; j < n; j += kLanes) {
    const V16 e = skv::exp(skv::sub(skv::load(S + j), mv));
    skv::store(S + j, e);
    sum = skv::add(sum, e);
  }
  return skv::hsum(sum);
}

struct Problem {
  const float* q;               // [T, Hq, D] float32
  const float* kp;              // [H, Np * D] packed K (pack_k)
  const float* vp;              // [H, Np * D] packed V (pack_v: 16-dim panels)
  float* out;                   // [T, Hq, D] float32
  int64_t T, Hq, H, G, D, N, Np, q0, k0, window;
  float scale;
};

// One tile of kRows query rows of kv head h: what it sees, and its online softmax's state between key blocks.
struct Tile {
  const float* qrow[kRows];
  int64_t lo[kRows], hi[kRows];                                   // row i sees keys [lo, hi)
  float m[kRows], l[kRows];
  int64_t h, r0, rows, first, last;                               // the keys any row of the tile sees: [first, last)
  float* O;                                                       // [kRows, D] its unnormalised output
};

void start_tile(const Problem& p, int64_t h, int64_t r0, const float* zero_row, float* O, Tile& t) {
  const int64_t M = p.T * p.G;
  t.h = h, t.r0 = r0, t.rows = std::min(kRows, M - r0), t.first = p.N, t.last = 0, t.O = O;
  for (int64_t i = 0; i < kRows; ++i) {
    if (i < t.rows) {
      const int64_t r = r0 + i, tok = r / p.G, pos = p.q0 + tok;
      t.qrow[i] = p.q + (tok * p.Hq + h * p.G + r % p.G) * p.D;
      t.lo[i] = p.window ? std::max<int64_t>(pos - p.window + 1 - p.k0, 0) : 0;
      t.hi[i] = pos - p.k0 + 1;
      t.first = std::min(t.first, t.lo[i]), t.last = std::max(t.last, t.hi[i]);
    } else {
      t.qrow[i] = zero_row, t.lo[i] = t.hi[i] = 0;                // padding rows: see nothing, written nowhere
    }
    t.m[i] = kNegBig, t.l[i] = 0.f;
  }
  std::fill(O, O + kRows * p.D, 0.f);
}

// Blocks start on a multiple of 32 keys on every instruction set (span is 16 or 32), so the online softmax sees the
// same blocks, and rescales at the same keys, whatever the build.
inline int64_t block_start(const Tile& t, int64_t k) { return t.first / 32 * 32 + k * kBlock; }

// The tile's k-th block of kBlock keys: scores, the online softmax, O += P V. S: [kRows, kBlock] scratch.
void tile_block(const Problem& p, Tile& t, int64_t k, float* S, const float* zero_row, float* sink) {
  const int64_t D = p.D, rows = t.rows, b0 = block_start(t, k);
  const int64_t n = std::min(kBlock, round_up(t.last, 32) - b0);  // a multiple of 32, within Np
  const float* kp = p.kp + t.h * p.Np * D;
  const float* vp = p.vp + t.h * p.Np * D;
  const int64_t span = kCols * kLanes;                            // keys (or dims) per microkernel call
  int64_t ga[kRows / kMicro], gb[kRows / kMicro];                // per micro group: its rows' keys in the block
  for (int64_t i0 = 0; i0 < rows; i0 += kMicro) {
    int64_t a = n, b = 0;
    for (int64_t i = i0; i < i0 + kMicro; ++i)
      if (t.lo[i] < t.hi[i]) a = std::min(a, std::max<int64_t>(t.lo[i] - b0, 0)), b = std::max(b, std::min(t.hi[i] - b0, n));
    ga[i0 / kMicro] = a < b ? a / span * span : 0, gb[i0 / kMicro] = a < b ? round_up(b, span) : 0;
  }
  for (int64_t i0 = 0; i0 < rows; i0 += kMicro)                   // scores, only the tiles some row sees
    for (int64_t j = ga[i0 / kMicro]; j < gb[i0 / kMicro]; j += span)
      scores_6<kCols>(t.qrow + i0, kp + ((b0 + j) / kLanes) * D * kLanes, D, p.scale, S + i0 * kBlock + j, kBlock);
  for (int64_t i = 0; i < rows; ++i) {                            // the online softmax, row by row
    float* Si = S + i * kBlock;
    const int64_t a = std::max<int64_t>(t.lo[i] - b0, 0), b = std::min<int64_t>(t.hi[i] - b0, n);
    if (a >= b) {
      std::fill(Si, Si + n, 0.f);
      continue;
    }
    const float mx = skv::max_of(Si + a, b - a, kNegBig);
    const float mn = std::max(t.m[i], mx), alpha = skv::exp1(t.m[i] - mn);
    const float sum = exp_row(Si, n, a, b, mn);
    if (alpha != 1.f) {
      float* Oi = t.O + i * D;
      for (int64_t d = 0; d < D; ++d) Oi[d] *= alpha;
    }
    t.l[i] = t.l[i] * alpha + sum, t.m[i] = mn;
  }
  for (int64_t i0 = 0; i0 < rows; i0 += kMicro) {                // O += P V over the keys the group sees
    const int64_t ja = ga[i0 / kMicro], jb = gb[i0 / kMicro];
    if (ja >= jb) continue;
    const float* prow[kMicro];
    float* orow[kMicro];
    for (int i = 0; i < kMicro; ++i) {
      const bool real = i0 + i < rows;
      prow[i] = real ? S + (i0 + i) * kBlock : zero_row;          // zero_row holds kBlock zeros
      orow[i] = real ? t.O + (i0 + i) * D : sink;
    }
    const auto panel = [&](int64_t d) { return vp + ((d / kLanes) * p.Np + b0) * kLanes; };
    int64_t d0 = 0;
    for (; d0 + kCols * kLanes <= D; d0 += kCols * kLanes)
      pv_6<kCols>(prow, ja, jb, panel(d0), panel(d0 + (kCols - 1) * kLanes), d0, orow);
    for (; d0 < D; d0 += kLanes) pv_6<1>(prow, ja, jb, panel(d0), panel(d0), d0, orow);   // D % 32 == 16 (AVX-512)
  }
}

void finish_tile(const Problem& p, const Tile& t) {
  for (int64_t i = 0; i < t.rows; ++i) {
    const int64_t r = t.r0 + i, tok = r / p.G;
    float* dst = p.out + (tok * p.Hq + t.h * p.G + r % p.G) * p.D;
    const float inv = t.l[i] > 0.f ? 1.f / t.l[i] : 0.f;
    const float* Oi = t.O + i * p.D;
    for (int64_t d = 0; d < p.D; ++d) dst[d] = Oi[d] * inv;
  }
}

// A work item: tiles [t0, t1) of kv head h, their key blocks visited in step (block k of every tile, then k + 1), so
// a block of K and V read from memory serves every tile of the item while it is in cache, not one tile's 60 rows
// (at 32k keys a head's K and V are 64 MiB in float32, past any cache: one tile per item streamed them per tile).
// Each tile's arithmetic is the one-tile item's, in the same order: the same bits however tiles are grouped.
void run_item(const Problem& p, int64_t h, int64_t t0, int64_t t1, std::vector<float>& S, std::vector<float>& O,
              std::vector<Tile>& tiles, const float* zero_row, float* sink) {
  const int64_t n = t1 - t0;
  int64_t blocks = 0;
  for (int64_t i = 0; i < n; ++i) {
    Tile& t = tiles[i];
    start_tile(p, h, (t0 + i) * kRows, zero_row, O.data() + i * kRows * p.D, t);
    int64_t b = 0;
    while (block_start(t, b) < t.last) ++b;
    blocks = std::max(blocks, b);
  }
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t i = 0; i < n; ++i)
      if (block_start(tiles[i], k) < tiles[i].last) tile_block(p, tiles[i], k, S.data(), zero_row, sink);
  for (int64_t i = 0; i < n; ++i) finish_tile(p, tiles[i]);
}

template <typename T>
void pack_all(const at::Tensor& k, const at::Tensor& v, int64_t N, int64_t Np, int64_t H, int64_t D, float* kp,
              float* vp) {
  const T* kd = reinterpret_cast<const T*>(k.data_ptr());
  const T* vd = reinterpret_cast<const T*>(v.data_ptr());
  at::parallel_for(0, 2 * H, 1, [&](int64_t b, int64_t e) {
    for (int64_t x = b; x < e; ++x) {
      const int64_t h = x / 2;
      if (x % 2 == 0) pack_k(kd + h * D, H * D, N, Np, D, kp + h * Np * D);
      else pack_v(vd + h * D, H * D, N, Np, D, vp + h * Np * D);
    }
  });
}

}  // namespace

bool f32_prefill_vectorized() { return SPARSEKV_AVX512 || SPARSEKV_AVX2; }

// q: [T, Hq, D] float32 or bf16 (token t at absolute position q0 + t); k, v: [N, H, D], both float32 or both bf16
// (key j at position k0 + j); window: 0 (causal) or w > 0 (key visible to query iff 0 <= q_pos - k_pos < w).
// Returns [T, Hq, D] float32. Every argument is checked before any work (checks.h's rules).
at::Tensor prefill_attn_f32(at::Tensor q, at::Tensor k, at::Tensor v, int64_t q0, int64_t k0, int64_t window,
                            double scale) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "prefill_attn_f32: q, k, v must be 3-d, got ",
                    q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const auto fp = [](const at::Tensor& x) { return x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16; };
  TORCH_CHECK_TYPE(fp(q) && fp(k) && k.scalar_type() == v.scalar_type(), "prefill_attn_f32: q must be float32 or "
                   "bfloat16 and k, v both float32 or both bfloat16, got ", q.scalar_type(), ", ", k.scalar_type(),
                   ", ", v.scalar_type());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "prefill_attn_f32: k and v must have one shape, got ", k.sizes(), " and ",
                    v.sizes());
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), N = k.size(0), H = k.size(1);
  TORCH_CHECK_VALUE(T > 0 && Hq > 0 && D > 0, "prefill_attn_f32: q must be non-empty [T, Hq, D], got ", q.sizes());
  TORCH_CHECK_VALUE(k.size(2) == D && H > 0 && Hq % H == 0, "prefill_attn_f32: q's heads must be a multiple of k's "
                    "and the head dims equal, got q ", q.sizes(), ", k ", k.sizes());
  TORCH_CHECK_VALUE(D % 16 == 0, "prefill_attn_f32: head dim must be a multiple of 16, got ", D);
  TORCH_CHECK_VALUE(window >= 0, "prefill_attn_f32: window must be >= 0 (0: causal), got ", window);
  // without an overflow: q0 - k0 and N - T are differences of non-negative values, and k0 + N is representable
  TORCH_CHECK_VALUE(k0 >= 0 && q0 >= k0 && q0 - k0 <= N - T && k0 <= std::numeric_limits<int64_t>::max() - N,
                    "prefill_attn_f32: the queries' positions must lie within the keys' (0 <= k0 <= q0, q0 + T <= k0 "
                    "+ N), got q0 ", q0, ", k0 ", k0, ", T ", T, ", N ", N);
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, "prefill_attn_f32: scale must be positive and finite, got ",
                    scale);
  const at::Tensor qf = q.to(at::kFloat).contiguous();
  k = k.contiguous(), v = v.contiguous();
  const int64_t G = Hq / H, M = T * G, Np = round_up(N, kBlock);
  auto out = at::empty({T, Hq, D}, q.options().dtype(at::kFloat));
  auto kp = at::empty({H, Np * D}, q.options().dtype(at::kFloat));
  auto vp = at::empty({H, Np * D}, q.options().dtype(at::kFloat));
  if (k.scalar_type() == at::kFloat) pack_all<float>(k, v, N, Np, H, D, kp.data_ptr<float>(), vp.data_ptr<float>());
  else pack_all<uint16_t>(k, v, N, Np, H, D, kp.data_ptr<float>(), vp.data_ptr<float>());
  const Problem p{qf.data_ptr<float>(), kp.data_ptr<float>(), vp.data_ptr<float>(), out.data_ptr<float>(), T, Hq, H,
                  G, D, N, Np, q0, k0, window, static_cast<float>(scale)};
  // Items: each head's tiles in `groups` runs of nearly equal length, at most kGroup tiles each, with H * groups a
  // multiple of the threads where the tiles allow (parallel_for hands each thread a contiguous share of the items).
  const int64_t tiles = (M + kRows - 1) / kRows, threads = std::max(1, at::get_num_threads());
  int64_t groups = (tiles + kGroup - 1) / kGroup;
  while (groups < tiles && (H * groups) % threads != 0) ++groups;
  const std::vector<float> zero_row(std::max(D, kBlock), 0.f);
  at::parallel_for(0, H * groups, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> S(kRows * kBlock), O(kGroup * kRows * D), sink(D);
    std::vector<Tile> state(kGroup);
    for (int64_t item = w0; item < w1; ++item) {
      const int64_t h = item / groups, g = item % groups;
      run_item(p, h, g * tiles / groups, (g + 1) * tiles / groups, S, O, state, zero_row.data(), sink.data());
    }
  });
  return out;
}
