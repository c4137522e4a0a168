// Block routing for the CPU in one pass: score every block from its summaries, turn scores into a block
// distribution, and pick the top K, without a tensor op in between.
//
// Algorithm, per kv head h (one work item each):
//   score   s[g, j] = scale * sum_d max(q[h*G+g, d] * kmin[h, p_j, d], q[h*G+g, d] * kmax[h, p_j, d])   (minmax,
//           Quest's bound), scale * q[h*G+g] . kmean[h, p_j] (mean, MoBA), or scale * max(q[h*G+g] . a[h, p_j],
//           q[h*G+g] . b[h, p_j]) over a block's two half means (halves), p_j = table[j]; the summaries
//           are read once, in place, and shared by the G query heads of the group (simd.h: 16 lanes,
//           rows read 32 elements at a time, q laid out in the same lane order)
//   mass    per query head, softmax over blocks; then the group's mean, renormalised to sum 1
//           (Router's gqa="shared", agg="sum")
//   select  forced blocks (the first `sink`, the last `local`) rank first, then by mass, ties to the
//           later block; the K best (nth_element, O(nb)), written in ascending block order
// The result equals the torch path's (`Router.select`) wherever no two masses tie within float32
// rounding; an exact tie goes to the later block on both paths. The same bits at any thread count (one kv
// head per work item) and for any instruction set (simd.h).
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "checks.h"
#include "simd.h"

namespace {

using skv::V16;
using skv::kLanes;

enum Kind : int64_t { kMinMax = 0, kMean = 1, kHalves = 2 };

struct Shape {
  int64_t D, P, Dp, NB;             // head dim, 32-element pairs per row (simd.h), 32 P, pool blocks
  int last;                         // elements in the last pair (1..32)
};

// out[g * stride] = the block's score for NG query heads, q in pair_lane<T> order, zero-padded: for mean and
// halves [NG, Dp] rows of q; for minmax [NG, 2, Dp], each head's q+ = max(q, 0) then q- = min(q, 0), so that
// sum_d max(q lo, q hi) = q+ . hi + q- . lo (hi >= lo) is two fused multiply-adds per element. halves keeps one
// accumulator per half (a, b) and takes the larger sum.
template <int NG, Kind KIND, typename T>
inline void block_score(const float* q, const T* a, const T* b, const Shape& s, float scale, float* out,
                        int64_t stride) {
  V16 acc[NG], acc_b[NG];
  for (int g = 0; g < NG; ++g) acc[g] = skv::zero(), acc_b[g] = skv::zero();
  for (int64_t pc = 0; pc < s.P; ++pc) {
    V16 lo0, lo1;
    skv::load_pair(a, pc, s.P, s.last, lo0, lo1);
    if constexpr (KIND == kMinMax) {            // q holds q+ = max(q, 0) then q- = min(q, 0): q+ . hi + q- . lo
      V16 hi0, hi1;
      skv::load_pair(b, pc, s.P, s.last, hi0, hi1);
      for (int g = 0; g < NG; ++g) {
        const float* qp = q + 2 * g * s.Dp + pc * 2 * kLanes;
        const float* qn = qp + s.Dp;
        acc[g] = skv::fma(skv::load(qp), hi0, skv::fma(skv::load(qp + kLanes), hi1, acc[g]));
        acc[g] = skv::fma(skv::load(qn), lo0, skv::fma(skv::load(qn + kLanes), lo1, acc[g]));
      }
    } else {
      for (int g = 0; g < NG; ++g)
        acc[g] = skv::fma(skv::load(q + g * s.Dp + pc * 2 * kLanes + kLanes), lo1,
                          skv::fma(skv::load(q + g * s.Dp + pc * 2 * kLanes), lo0, acc[g]));
      if constexpr (KIND == kHalves) {            // the second half's mean: the same q, its own accumulator
        V16 hi0, hi1;
        skv::load_pair(b, pc, s.P, s.last, hi0, hi1);
        for (int g = 0; g < NG; ++g)
          acc_b[g] = skv::fma(skv::load(q + g * s.Dp + pc * 2 * kLanes + kLanes), hi1,
                              skv::fma(skv::load(q + g * s.Dp + pc * 2 * kLanes), hi0, acc_b[g]));
      }
    }
  }
  float t[NG], u[NG];
  if constexpr (NG == 4) {
    skv::hsum4(acc[0], acc[1], acc[2], acc[3], t);
    if constexpr (KIND == kHalves) skv::hsum4(acc_b[0], acc_b[1], acc_b[2], acc_b[3], u);
  } else {
    for (int g = 0; g < NG; ++g) {
      t[g] = skv::hsum(acc[g]);
      if constexpr (KIND == kHalves) u[g] = skv::hsum(acc_b[g]);
    }
  }
  for (int g = 0; g < NG; ++g) out[g * stride] = scale * (KIND == kHalves ? std::max(t[g], u[g]) : t[g]);
}

template <Kind KIND, typename T>
inline void score_block(const float* q, const T* a, const T* b, const Shape& s, float scale, float* out,
                        int64_t stride, int64_t G) {
  constexpr int64_t rows = KIND == kMinMax ? 2 : 1;           // query vectors per head (q+, q- for minmax)
  for (int64_t g0 = 0; g0 < G; g0 += skv::kHeadsPerPass) {
    const float* qg = q + rows * g0 * s.Dp;
    float* o = out + g0 * stride;
    switch (std::min<int64_t>(skv::kHeadsPerPass, G - g0)) {
      case 4: block_score<4, KIND>(qg, a, b, s, scale, o, stride); break;
      case 3: block_score<3, KIND>(qg, a, b, s, scale, o, stride); break;
      case 2: block_score<2, KIND>(qg, a, b, s, scale, o, stride); break;
      default: block_score<1, KIND>(qg, a, b, s, scale, o, stride); break;
    }
  }
}

// scores [G, nb] of kv head h (q: that head's [G, Dp] zero-padded rows).
template <Kind KIND, typename T>
void head_scores(const float* q, const T* a, const T* b, const int64_t* table, int64_t nb, int64_t h, int64_t G,
                 const Shape& s, float scale, float* out) {
  constexpr int64_t kAhead = 16;                    // blocks prefetched ahead (scattered summary rows)
  for (int64_t j = 0; j < nb; ++j) {
    if (j + kAhead < nb) {
      const int64_t p = (h * s.NB + table[j + kAhead]) * s.D;
      for (int64_t x = 0; x < s.D * static_cast<int64_t>(sizeof(T)); x += 64) {
        skv::prefetch_l2(reinterpret_cast<const char*>(a + p) + x);
        if (KIND != kMean) skv::prefetch_l2(reinterpret_cast<const char*>(b + p) + x);
      }
    }
    const int64_t p = (h * s.NB + table[j]) * s.D;
    score_block<KIND>(q, a + p, b + p, s, scale, out + j, nb, G);
  }
}

// Head h's G query rows in the pair order of T, zero-padded: [G, Dp] for mean; [G, 2, Dp] (q+, q-) for minmax.
template <typename T>
void padded_query(const float* q, int64_t h, int64_t G, const Shape& s, bool split_sign, std::vector<float>& out) {
  const int64_t rows = split_sign ? 2 : 1;
  out.assign(rows * G * s.Dp, 0.f);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t x = 0; x < s.Dp; ++x) {
      const int64_t src = skv::pair_index<T>(x);
      if (src >= s.D) continue;
      const float v = q[(h * G + g) * s.D + src];
      if (split_sign) out[2 * g * s.Dp + x] = std::max(v, 0.f), out[(2 * g + 1) * s.Dp + x] = std::min(v, 0.f);
      else out[g * s.Dp + x] = v;
    }
}

// The group's block distribution from scores [G, nb] (overwritten): per-head softmax, mean over heads,
// renormalised.
void group_mass(float* sc, int64_t G, int64_t nb, float* mass) {
  std::fill(mass, mass + nb, 0.f);
  for (int64_t g = 0; g < G; ++g) {
    float* sg = sc + g * nb;
    const float mx = skv::max_of(sg, nb, sg[0]);
    const float z = skv::exp_sum(sg, nb, mx);          // exponentiated in place (the scores are scratch)
    const float w = 1.f / (z * static_cast<float>(G));
    for (int64_t j = 0; j < nb; ++j) mass[j] += sg[j] * w;
  }
  float total = 0.f;
  for (int64_t j = 0; j < nb; ++j) total += mass[j];    // in order (no -ffast-math reorders it)
  for (int64_t j = 0; j < nb; ++j) mass[j] /= total;
}

// The K best blocks (forced first, then mass, ties to the later block), ascending, into out[K].
void top_blocks(const float* mass, int64_t nb, int64_t K, int64_t sink, int64_t local, std::vector<int64_t>& idx,
                std::vector<float>& key, int64_t* out) {
  key.resize(nb);
  idx.resize(nb);
  // mass <= 1, so a forced block's key 2 ranks it first; a NaN mass (NaN or infinite inputs) ranks last, so that
  // `better` stays a strict weak order (with a NaN key nth_element's unguarded loops can run off the array)
  for (int64_t j = 0; j < nb; ++j)
    key[j] = (j < sink || j >= nb - local) ? 2.f : std::isnan(mass[j]) ? -1.f : mass[j];
  std::iota(idx.begin(), idx.end(), int64_t{0});
  auto better = [&](int64_t x, int64_t y) { return key[x] > key[y] || (key[x] == key[y] && x > y); };
  if (K < nb) std::nth_element(idx.begin(), idx.begin() + K, idx.end(), better);
  std::sort(idx.begin(), idx.begin() + K);
  std::copy(idx.begin(), idx.begin() + K, out);
}

template <typename T>
const T* raw(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) return t.data_ptr<float>();
  else return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>());
}

Shape shape_of(const at::Tensor& a) {
  const int64_t D = a.size(2), P = (D + 2 * kLanes - 1) / (2 * kLanes);
  return Shape{D, P, P * 2 * kLanes, a.size(1), static_cast<int>(D - (P - 1) * 2 * kLanes)};
}

template <typename T>
void scores_run(const at::Tensor& q, const at::Tensor& a, const at::Tensor& b, const at::Tensor& table,
                float* out) {
  const Shape s = shape_of(a);
  const int64_t H = a.size(0), G = q.size(0) / H, nb = table.numel();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  at::parallel_for(0, H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qp;
    for (int64_t h = begin; h < end; ++h) {
      padded_query<T>(q.data_ptr<float>(), h, G, s, true, qp);
      head_scores<kMinMax>(qp.data(), raw<T>(a), raw<T>(b), table.data_ptr<int64_t>(), nb, h, G, s, scale,
                           out + h * G * nb);
    }
  });
}

template <typename T>
void route_run(const at::Tensor& q, const at::Tensor& a, const at::Tensor& b, const at::Tensor& table,
               int64_t kind, int64_t K, int64_t sink, int64_t local, int64_t* blocks, float* mass) {
  const Shape s = shape_of(a);
  const int64_t H = a.size(0), G = q.size(0) / H, nb = table.numel();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  at::parallel_for(0, H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qp, sc(G * nb), key;
    std::vector<int64_t> idx;
    for (int64_t h = begin; h < end; ++h) {
      padded_query<T>(q.data_ptr<float>(), h, G, s, kind == kMinMax, qp);
      if (kind == kMinMax)
        head_scores<kMinMax>(qp.data(), raw<T>(a), raw<T>(b), table.data_ptr<int64_t>(), nb, h, G, s, scale, sc.data());
      else if (kind == kHalves)
        head_scores<kHalves>(qp.data(), raw<T>(a), raw<T>(b), table.data_ptr<int64_t>(), nb, h, G, s, scale, sc.data());
      else
        head_scores<kMean>(qp.data(), raw<T>(a), raw<T>(b), table.data_ptr<int64_t>(), nb, h, G, s, scale, sc.data());
      group_mass(sc.data(), G, nb, mass + h * nb);
      top_blocks(mass + h * nb, nb, K, sink, local, idx, key, blocks + h * K);
    }
  });
}

}  // namespace

void check_summaries(const at::Tensor& q, const at::Tensor& a, const at::Tensor& b, const at::Tensor& table,
                     const char* op) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.is_contiguous(), op, ": q must be a contiguous [Hq, D] tensor, got shape ",
                    q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat, op, ": q must be float32, got ", q.scalar_type());
  TORCH_CHECK_VALUE(a.dim() == 3 && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous(), op,
                    ": the summaries must be contiguous [H, NB, D] tensors of one shape, got ", a.sizes(), " and ",
                    b.sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type() &&
                       (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16),
                   op, ": the summaries must both be float32 or both bfloat16, got ", a.scalar_type(), " and ",
                   b.scalar_type());
  const int64_t H = a.size(0), NB = a.size(1), D = a.size(2);
  TORCH_CHECK_VALUE(H > 0 && NB > 0 && D > 0, op, ": the summaries must have no empty dimension, got ", a.sizes());
  TORCH_CHECK_VALUE(q.size(0) > 0 && q.size(0) % H == 0 && q.size(1) == D, op,
                    ": q must be [H * G, D] with H = ", H, ", G >= 1 and D = ", D, ", got ", q.sizes());
  TORCH_CHECK_VALUE(table.dim() == 1 && table.is_contiguous() && table.numel() > 0, op,
                    ": table must be a contiguous [nb] tensor with nb >= 1, got shape ", table.sizes());
  TORCH_CHECK_TYPE(table.scalar_type() == at::kLong, op, ": table must be int64, got ", table.scalar_type());
  skv::check_range(table, 0, NB, op, "table", "the summaries' physical blocks, NB = size(1)");
}

void check_route_args(int64_t kind, int64_t top_k, int64_t sink, int64_t local, const char* op) {
  TORCH_CHECK_VALUE(kind == kMinMax || kind == kMean || kind == kHalves, op,
                    ": kind must be 0 (minmax), 1 (mean) or 2 (halves), got ", kind);
  TORCH_CHECK_VALUE(top_k >= 1 && sink >= 0 && local >= 1, op,
                    ": need top_k >= 1, sink >= 0 and local >= 1, got top_k ", top_k, ", sink ", sink, ", local ",
                    local);
}

// Quest's bound [H, G, nb] float32 for q [Hq, D] float32 over one layer's head-major summaries
// kmin, kmax [H, NB, D] (float32 or bfloat16, read in place) at the blocks of table [nb] (each in [0, NB)); every
// argument is checked first (checks.h).
at::Tensor minmax_scores(at::Tensor q, at::Tensor kmin, at::Tensor kmax, at::Tensor table) {
  check_summaries(q, kmin, kmax, table, "minmax_scores");
  const int64_t H = kmin.size(0), G = q.size(0) / H;
  auto out = at::empty({H, G, table.numel()}, at::TensorOptions().dtype(at::kFloat));
  if (kmin.scalar_type() == at::kFloat) scores_run<float>(q, kmin, kmax, table, out.data_ptr<float>());
  else scores_run<uint16_t>(q, kmin, kmax, table, out.data_ptr<float>());
  return out;
}

// Score, distribute and select in one pass (see the top of the file). kind 0: minmax over (a, b) =
// (kmin, kmax); kind 1: mean over a = kmean (b is ignored; pass a again); kind 2: halves over (a, b) = the
// block's first and second half means. top_k >= 1, sink >= 0, local >= 1; table [nb >= 1] entries in [0, NB).
// Returns blocks [H, min(top_k, nb)] int64 ascending and mass [H, nb] float32.
std::vector<at::Tensor> route_topk(at::Tensor q, at::Tensor a, at::Tensor b, at::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local) {
  check_summaries(q, a, b, table, "route_topk");
  check_route_args(kind, top_k, sink, local, "route_topk");
  const int64_t H = a.size(0), nb = table.numel(), K = std::min(top_k, nb);
  auto blocks = at::empty({H, K}, at::TensorOptions().dtype(at::kLong));
  auto mass = at::empty({H, nb}, at::TensorOptions().dtype(at::kFloat));
  if (a.scalar_type() == at::kFloat)
    route_run<float>(q, a, b, table, kind, K, sink, local, blocks.data_ptr<int64_t>(), mass.data_ptr<float>());
  else
    route_run<uint16_t>(q, a, b, table, kind, K, sink, local, blocks.data_ptr<int64_t>(), mass.data_ptr<float>());
  return {blocks, mass};
}
