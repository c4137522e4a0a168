// Fused paged decode attention for the CPU: one pass over the selected K/V tiles, in place.
//
// Algorithm (flash-decoding on the CPU):
//   work items = (kv head h, split s); split s of head h owns a contiguous run of that head's
//   entries in blocks[h] (every logical block for dense, the selected ones for sparse; -1 entries
//   are padding and are skipped).
//   per item, for each of its blocks j (physical tile p = table[j], rows = valid tokens of j):
//       s[g, r]  = (scale * q[h*G + g]) . K[h, p, r]        for the G query heads of the group
//       m_new[g] = max(m[g], max_r s[g, r])
//       acc[g]   = acc[g] * exp(m[g] - m_new[g]) + sum_r exp(s[g, r] - m_new[g]) * V[h, p, r]
//       l[g]     = l[g]   * exp(m[g] - m_new[g]) + sum_r exp(s[g, r] - m_new[g])
//   merge the splits of each head with their (m, l):  out = sum_s acc_s e^(m_s - M) / L,
//   lse = M + log L, with M = max_s m_s and L = sum_s l_s e^(m_s - M).
//   A sliding-window layer passes min_token: rows of tokens before it score kNegBig, so they weigh exactly 0.
//
// Splits are chosen from the selection's width alone (cpu_decode.splits_for), never from the thread count, and
// each item is computed by one thread in a fixed order, so the result is the same bits at any thread count;
// simd.h makes it the same bits for any instruction set.
//
// Memory: every K and V row is read once, straight from the store's head-major pool (no gather
// copy), and the G query heads of a group share it. While the scores of tile t are computed, the K and
// V rows of tile t + ahead of the same item (about 128 KiB further on) are prefetched into L2, a row
// per row, so the scattered tiles of a sparse selection stream like one run. Compute (simd.h, 16 lanes, rows read 32 elements at a time): a K row is loaded once (bf16 widened
// by a shift and a mask, its lanes in even/odd order, which q shares) and multiplied into up to 4 query
// heads' accumulators, two rows at a time; for V, the accumulators of 32 output lanes of up to 4 heads
// stay in registers across all rows of the tile, so acc is loaded and stored once per tile, not once
// per row. Storage is float32 or bfloat16; accumulation is always float32.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "checks.h"
#include "simd.h"

namespace {

using skv::V16;
using skv::kHeadsPerPass;
using skv::kLanes;
using skv::kNegBig;            // the running maximum's "minus infinity" (simd.h)

struct Dims {
  int64_t D, P, Dp, bs;              // head dim, 32-element pairs per row (simd.h), 32 P, block size
  int last;                          // elements in the last pair (1..32)
};

template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) skv::prefetch_l2(p + b);
}

// s[g * bs + r] = qs[g] . k[r] for NG query heads (qs: scaled, [NG, Dp] in pair_lane<T> order, zero-padded)
// and `rows` rows, two rows at a time (each q vector loaded once for both); `next`, `next_v`: the K and V
// of a later tile to prefetch, two rows per two rows.
template <int NG, typename T>
inline void tile_scores(const float* qs, const T* k, int64_t rows, const Dims& d, float* s, const T* next,
                        const T* next_v) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const T* k0 = k + r * d.D;
    const T* k1 = k0 + d.D;
    if (next) prefetch_row(next + r * d.D, 2 * d.D), prefetch_row(next_v + r * d.D, 2 * d.D);
    V16 a0[NG], a1[NG];
    for (int g = 0; g < NG; ++g) a0[g] = a1[g] = skv::zero();
    for (int64_t pc = 0; pc < d.P; ++pc) {
      V16 x0a, x0b, x1a, x1b;
      skv::load_pair(k0, pc, d.P, d.last, x0a, x0b);
      skv::load_pair(k1, pc, d.P, d.last, x1a, x1b);
      for (int g = 0; g < NG; ++g) {
        const V16 qa = skv::load(qs + g * d.Dp + pc * 2 * kLanes), qb = skv::load(qs + g * d.Dp + pc * 2 * kLanes + kLanes);
        a0[g] = skv::fma(qb, x0b, skv::fma(qa, x0a, a0[g]));
        a1[g] = skv::fma(qb, x1b, skv::fma(qa, x1a, a1[g]));
      }
    }
    if constexpr (NG == 4) {
      float t0[4], t1[4];
      skv::hsum4(a0[0], a0[1], a0[2], a0[3], t0);
      skv::hsum4(a1[0], a1[1], a1[2], a1[3], t1);
      for (int g = 0; g < 4; ++g) s[g * d.bs + r] = t0[g], s[g * d.bs + r + 1] = t1[g];
    } else {
      for (int g = 0; g < NG; ++g) s[g * d.bs + r] = skv::hsum(a0[g]), s[g * d.bs + r + 1] = skv::hsum(a1[g]);
    }
  }
  for (; r < rows; ++r) {                                  // an odd last row
    V16 acc[NG];
    for (int g = 0; g < NG; ++g) acc[g] = skv::zero();
    for (int64_t pc = 0; pc < d.P; ++pc) {
      V16 xa, xb;
      skv::load_pair(k + r * d.D, pc, d.P, d.last, xa, xb);
      for (int g = 0; g < NG; ++g)
        acc[g] = skv::fma(skv::load(qs + g * d.Dp + pc * 2 * kLanes + kLanes), xb,
                          skv::fma(skv::load(qs + g * d.Dp + pc * 2 * kLanes), xa, acc[g]));
    }
    for (int g = 0; g < NG; ++g) s[g * d.bs + r] = skv::hsum(acc[g]);
  }
}

// acc[g, pair pc] += sum_r p[g, r] * v[r, pair pc] (acc in pair_lane<T> order), the 2 x NG accumulators
// in registers over all rows.
template <int NG, typename T>
inline void pv_pass(const float* p, const T* v, int64_t rows, const Dims& d, int64_t pc, float* acc) {
  V16 a[NG][2];
  float* base = acc + pc * 2 * kLanes;
  for (int g = 0; g < NG; ++g) a[g][0] = skv::load(base + g * d.Dp), a[g][1] = skv::load(base + g * d.Dp + kLanes);
  for (int64_t r = 0; r < rows; ++r) {
    V16 xa, xb;
    skv::load_pair(v + r * d.D, pc, d.P, d.last, xa, xb);
    for (int g = 0; g < NG; ++g) {
      const V16 w = skv::splat(p[g * d.bs + r]);
      a[g][0] = skv::fma(w, xa, a[g][0]);
      a[g][1] = skv::fma(w, xb, a[g][1]);
    }
  }
  for (int g = 0; g < NG; ++g) skv::store(base + g * d.Dp, a[g][0]), skv::store(base + g * d.Dp + kLanes, a[g][1]);
}

template <int NG, typename T>
inline void tile_pv(const float* p, const T* v, int64_t rows, const Dims& d, float* acc) {
  for (int64_t pc = 0; pc < d.P; ++pc) pv_pass<NG>(p, v, rows, d, pc, acc);
}

// The G query heads in passes of up to kHeadsPerPass, each with a compile-time head count.
template <typename T>
inline void scores_all(const float* qs, const T* k, int64_t rows, const Dims& d, float* s, const T* next,
                       const T* next_v, int64_t G) {
  for (int64_t g0 = 0; g0 < G; g0 += kHeadsPerPass) {
    const float* q = qs + g0 * d.Dp;
    float* out = s + g0 * d.bs;
    const T* pf = g0 == 0 ? next : nullptr;            // prefetch once
    switch (std::min<int64_t>(kHeadsPerPass, G - g0)) {
      case 4: tile_scores<4>(q, k, rows, d, out, pf, next_v); break;
      case 3: tile_scores<3>(q, k, rows, d, out, pf, next_v); break;
      case 2: tile_scores<2>(q, k, rows, d, out, pf, next_v); break;
      default: tile_scores<1>(q, k, rows, d, out, pf, next_v); break;
    }
  }
}

template <typename T>
inline void pv_all(const float* p, const T* v, int64_t rows, const Dims& d, float* acc, int64_t G) {
  for (int64_t g0 = 0; g0 < G; g0 += kHeadsPerPass) {
    const float* pg = p + g0 * d.bs;
    float* a = acc + g0 * d.Dp;
    switch (std::min<int64_t>(kHeadsPerPass, G - g0)) {
      case 4: tile_pv<4>(pg, v, rows, d, a); break;
      case 3: tile_pv<3>(pg, v, rows, d, a); break;
      case 2: tile_pv<2>(pg, v, rows, d, a); break;
      default: tile_pv<1>(pg, v, rows, d, a); break;
    }
  }
}

template <typename T>
void run(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* blocks, int64_t K, int64_t H,
         int64_t G, const Dims& d, int64_t NB, int64_t N, int64_t min_token, int64_t S, float scale, float* m_buf,
         float* l_buf, float* acc_buf) {
  // blocks: [H, K] logical ids per head (-1: padding); m/l: [H, S, G]; acc: [H, S, G, D]
  const int64_t bs = d.bs, D = d.D;
  // Prefetch distance in tiles: about 128 KiB of K and V in flight ahead of the tile being computed.
  const int64_t ahead = std::max<int64_t>(1, (128 << 10) / (2 * bs * D * static_cast<int64_t>(sizeof(T))));
  at::parallel_for(0, H * S, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * bs), qs(G * d.Dp, 0.f), acc(G * d.Dp);
    std::vector<int64_t> offs, nrows, skip;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / S, sp = item % S;
      const int64_t lo = K * sp / S, hi = K * (sp + 1) / S;
      float* m = m_buf + item * G;
      float* l = l_buf + item * G;
      std::fill(m, m + G, kNegBig);
      std::fill(l, l + G, 0.f);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t g = 0; g < G; ++g)                    // scaled, in the pair order of T, zero-padded
        for (int64_t x = 0; x < d.Dp; ++x) {
          const int64_t src = skv::pair_index<T>(x);
          qs[g * d.Dp + x] = src < D ? scale * q[(h * G + g) * D + src] : 0.f;
        }
      offs.clear(), nrows.clear(), skip.clear();         // this item's tiles: padding and empty blocks dropped
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t j = blocks[h * K + i];
        const int64_t rows = j < 0 ? 0 : std::min(bs, N - j * bs);
        const int64_t before = j < 0 ? 0 : std::max<int64_t>(0, std::min(rows, min_token - j * bs));
        if (rows > before) offs.push_back((h * NB + table[j]) * bs * D), nrows.push_back(rows), skip.push_back(before);
      }
      const int64_t T_ = static_cast<int64_t>(offs.size());
      for (int64_t t = 0; t < std::min(ahead, T_); ++t)          // the first tiles, before the loop's own
        prefetch_row(k + offs[t], nrows[t] * D), prefetch_row(v + offs[t], nrows[t] * D);
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t rows = nrows[t];
        const bool pf = t + ahead < T_;
        scores_all(qs.data(), k + offs[t], rows, d, s.data(), pf ? k + offs[t + ahead] : nullptr,
                   pf ? v + offs[t + ahead] : nullptr, G);
        for (int64_t g = 0; g < G; ++g) {                 // online softmax: rescale, then exponentiate the tile
          float* sg = s.data() + g * bs;
          for (int64_t r = 0; r < skip[t]; ++r) sg[r] = kNegBig;     // before a sliding window: weight 0
          const float mx = skv::max_of(sg, rows, m[g]);
          const float corr = skv::exp1(m[g] - mx);       // 0 on the first tile (m = kNegBig)
          float* ag = acc.data() + g * d.Dp;
          if (corr != 1.f)
            for (int64_t x = 0; x < d.Dp; ++x) ag[x] *= corr;
          l[g] = l[g] * corr + skv::exp_sum(sg, rows, mx);   // sg becomes the tile's numerators
          m[g] = mx;
        }
        pv_all(s.data(), v + offs[t], rows, d, acc.data(), G);
      }
      float* out = acc_buf + item * G * D;
      for (int64_t g = 0; g < G; ++g)                    // back to natural order
        for (int64_t x = 0; x < d.Dp; ++x) {
          const int64_t dst = skv::pair_index<T>(x);
          if (dst < D) out[g * D + dst] = acc[g * d.Dp + x];
        }
    }
  });
}

// out [H*G, D] and lse [H*G] from the splits: a head with no valid entry gives 0 and lse -inf.
void merge(const float* m, const float* l, const float* acc, int64_t H, int64_t S, int64_t G, int64_t D, float* out,
           float* lse) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t g = 0; g < G; ++g) {
      float M = kNegBig;
      for (int64_t s = 0; s < S; ++s) M = std::max(M, m[(h * S + s) * G + g]);
      float L = 0.f;
      float* o = out + (h * G + g) * D;
      std::fill(o, o + D, 0.f);
      for (int64_t s = 0; s < S; ++s) {
        const int64_t at = (h * S + s) * G + g;
        if (l[at] == 0.f) continue;                  // an empty split
        const float w = skv::exp1(m[at] - M);
        L += l[at] * w;
        const float* a = acc + at * D;
        for (int64_t x = 0; x < D; ++x) o[x] += w * a[x];
      }
      if (L > 0.f) {
        for (int64_t x = 0; x < D; ++x) o[x] /= L;
        lse[h * G + g] = M + std::log(L);
      } else {
        lse[h * G + g] = -std::numeric_limits<float>::infinity();
      }
    }
}

}  // namespace

void check_paged_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                        int64_t num_tokens, int64_t splits, int64_t min_token, const char* op) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.is_contiguous(), op, ": q must be a contiguous [Hq, D] tensor, got shape ",
                    q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat, op, ": q must be float32, got ", q.scalar_type());
  TORCH_CHECK_VALUE(k.dim() == 4 && k.sizes() == v.sizes() && k.is_contiguous() && v.is_contiguous(), op,
                    ": k and v must be contiguous [H, NB, bs, D] tensors of one shape, got ", k.sizes(), " and ",
                    v.sizes());
  TORCH_CHECK_TYPE(k.scalar_type() == v.scalar_type() &&
                       (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
                   op, ": k and v must both be float32 or both bfloat16, got ", k.scalar_type(), " and ",
                   v.scalar_type());
  const int64_t H = k.size(0), NB = k.size(1), bs = k.size(2), D = k.size(3);
  TORCH_CHECK_VALUE(H > 0 && NB > 0 && bs > 0 && D > 0, op, ": k and v must have no empty dimension, got ",
                    k.sizes());
  TORCH_CHECK_VALUE(q.size(0) > 0 && q.size(0) % H == 0 && q.size(1) == D, op,
                    ": q must be [H * G, D] with H = ", H, ", G >= 1 and D = ", D, ", got ", q.sizes());
  TORCH_CHECK_VALUE(table.dim() == 1 && table.is_contiguous() && table.numel() > 0, op,
                    ": table must be a contiguous [nb] tensor with nb >= 1, got shape ", table.sizes());
  TORCH_CHECK_TYPE(table.scalar_type() == at::kLong, op, ": table must be int64, got ", table.scalar_type());
  skv::check_range(table, 0, NB, op, "table", "the pool's physical blocks, NB = k.size(1)");
  const int64_t nb = table.numel();
  TORCH_CHECK_VALUE(num_tokens >= 1 && (num_tokens - 1) / bs < nb, op, ": num_tokens must be in [1, nb * bs] = [1, ",
                    nb * bs, "] (the table's capacity), got ", num_tokens);
  TORCH_CHECK_VALUE(min_token >= 0 && min_token < num_tokens, op, ": min_token must be in [0, num_tokens) = [0, ",
                    num_tokens, "), got ", min_token);
  TORCH_CHECK_VALUE(splits >= 1, op, ": splits must be >= 1, got ", splits);
}

void check_blocks(const at::Tensor& blocks, int64_t H, int64_t nb, const char* op) {
  TORCH_CHECK_VALUE(blocks.dim() == 2 && blocks.is_contiguous() && blocks.size(0) == H && blocks.size(1) > 0, op,
                    ": blocks must be a contiguous [H, K] tensor with H = ", H, " and K >= 1, got shape ",
                    blocks.sizes());
  TORCH_CHECK_TYPE(blocks.scalar_type() == at::kLong, op, ": blocks must be int64, got ", blocks.scalar_type());
  skv::check_range(blocks, -1, nb, op, "blocks", "the table's logical blocks, nb = table.numel(), or -1 padding");
}

// q [Hq, D] float32; k, v [H, NB, bs, D] (one layer, head-major, contiguous) float32 or bfloat16;
// table [nb] int64 physical ids in logical order, each in [0, NB); blocks [H, K] int64 logical ids per head in
// [0, nb), -1 for padding (dense: every block); num_tokens N in [1, nb * bs]; splits S >= 1 per head (more than
// K leave empty splits: K are run, the same bits); min_token in [0, N): the first token attended (a sliding
// window's start; 0 for global attention). Every argument is checked first (checks.h).
// Returns out [Hq, D] float32 and lse [Hq] float32 (a head with nothing to read: out 0, lse -inf).
std::vector<at::Tensor> paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                        at::Tensor blocks, int64_t num_tokens, int64_t splits, int64_t min_token) {
  check_paged_decode(q, k, v, table, num_tokens, splits, min_token, "paged_decode");
  check_blocks(blocks, k.size(0), table.numel(), "paged_decode");
  const int64_t H = k.size(0), NB = k.size(1), bs = k.size(2), D = k.size(3);
  const int64_t G = q.size(0) / H, K = blocks.size(1), S = std::min(splits, K);
  const int64_t P = (D + 2 * kLanes - 1) / (2 * kLanes);
  const Dims d{D, P, P * 2 * kLanes, bs, static_cast<int>(D - (P - 1) * 2 * kLanes)};
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto m = at::empty({H, S, G}, f32), l = at::empty({H, S, G}, f32), acc = at::empty({H, S, G, D}, f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (k.scalar_type() == at::kFloat) {
    run<float>(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), table.data_ptr<int64_t>(),
               blocks.data_ptr<int64_t>(), K, H, G, d, NB, num_tokens, min_token, S, scale, m.data_ptr<float>(),
               l.data_ptr<float>(), acc.data_ptr<float>());
  } else {
    run<uint16_t>(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(k.data_ptr<c10::BFloat16>()),
                  reinterpret_cast<const uint16_t*>(v.data_ptr<c10::BFloat16>()), table.data_ptr<int64_t>(),
                  blocks.data_ptr<int64_t>(), K, H, G, d, NB, num_tokens, min_token, S, scale, m.data_ptr<float>(),
                  l.data_ptr<float>(), acc.data_ptr<float>());
  }
  auto out = at::empty({H * G, D}, f32), lse = at::empty({H * G}, f32);
  merge(m.data_ptr<float>(), l.data_ptr<float>(), acc.data_ptr<float>(), H, S, G, D, out.data_ptr<float>(),
        lse.data_ptr<float>());
  return {out, lse};
}
