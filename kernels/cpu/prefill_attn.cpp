// Chunked-prefill attention from bfloat16 dot products: float32 scores, float32 softmax, float32 accumulators.
//
// What it replaces: SDPA's CPU flash kernel on a bfloat16 chunk (the gguf mode's bfloat16 prefill), which ran at
// about 200 GFLOP/s on 2 AVX512-BF16 cores for a 512-token chunk over 32k keys, a quarter of what the same cores
// multiply in bf16 matmuls. A global layer's chunk over a long prefix is that op's whole cost, so a 32k prefill
// of Gemma 3 was mostly this. The gain comes from (1) GQA folded into the rows: the G query heads of a kv head
// read each K and V row once, as G times as many rows of one matmul; (2) bigger tiles: 64 query rows by 256
// keys; (3) vdpbf16ps with float32 accumulation, so no score or output is rounded to bf16 on the way.
//
// Algorithm, per work item (kv head h, a tile of 64 rows; row r is token t = r / G, query head h * G + r % G):
//   pack K and V of head h once per call into the microkernels' layouts (below; keys past N are zero);
//   for each block of 256 keys the tile's rows can see (causal, and within the window if any):
//       S[i, j]  = scale * q_i . K_j                          (8 rows x 32 keys at a time, bf16 pairs, fp32 sums)
//       for row i, over its visible keys [a_i, b_i) of the block (none: its P row is 0):
//           m_new = max(m_i, max_j S[i, j]);  alpha = exp(m_i - m_new)
//           P[i, j] = bf16(exp(S[i, j] - m_new)),  0 outside [a_i, b_i)
//           l_i = l_i * alpha + sum_j P[i, j] (the rounded values: the weights actually applied);  O_i *= alpha
//       O[i, :] += P[i, :] . V                                (8 rows x 32 dims at a time, bf16 pairs, fp32 sums)
//   out_i = O_i / l_i.
// Visibility is a range per row, computed from positions (query t at q0 + t, key j at k0 + j): [max(0,
// q0 + t - w + 1 - k0), q0 + t - k0] with w the window (0: none). No mask tensor is read.
//
// Determinism: each item is computed by one thread in one order, so the output is the same bits at any thread
// count. It is not the same bits as another kernel's: the sums are vdpbf16ps's (pairs, then the accumulator),
// and exp is simd.h's. Built only where the compiler targets AVX512-BF16 (`bf16_prefill_available`); the
// Python side takes SDPA elsewhere.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

#if SPARSEKV_AVX512 && defined(__AVX512BF16__)
#define SPARSEKV_BF16DP 1
#else
#define SPARSEKV_BF16DP 0
#endif

namespace {

constexpr int64_t kRows = 64;     // query rows per work item
constexpr int64_t kMicro = 8;     // rows per microkernel call
constexpr int64_t kBlock = 256;   // keys per block; a multiple of 32 (two 16-key tiles)
using skv::kNegBig;               // below it exp is exactly 0 (simd.h)

#if SPARSEKV_BF16DP

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// K of one kv head for the score microkernel: 16-key tiles, then the d pair p, then (key, element):
//   Kp[((j / 16) * P + p) * 32 + (j % 16) * 2 + e] = K[j, 2p + e]      (P = D / 2; rows past N are zero)
// so one 64-byte load holds pair p of 16 keys, and one broadcast 32-bit word of q multiplies all of them.
void pack_k(const uint16_t* k, int64_t stride, int64_t N, int64_t Np, int64_t D, uint16_t* out) {
  const int64_t P = D / 2;
  at::parallel_for(0, Np / 16, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint16_t* dst = out + t * P * 32;
      for (int64_t jj = 0; jj < 16; ++jj) {
        const int64_t j = t * 16 + jj;
        if (j >= N) {
          for (int64_t p = 0; p < P; ++p) dst[p * 32 + jj * 2] = dst[p * 32 + jj * 2 + 1] = 0;
          continue;
        }
        const uint16_t* row = k + j * stride;
        for (int64_t p = 0; p < P; ++p) std::memcpy(dst + p * 32 + jj * 2, row + 2 * p, 4);
      }
    }
  });
}

// V of one kv head for the output microkernel: the key pair jp, then d, then the element:
//   Vp[(jp * D + d) * 2 + e] = V[2 jp + e, d]                            (rows past N are zero)
// so one load holds 16 dims of two keys, and one broadcast word of P (two keys' weights) multiplies them.
void pack_v(const uint16_t* v, int64_t stride, int64_t N, int64_t Np, int64_t D, uint16_t* out) {
  at::parallel_for(0, Np / 2, 64, [&](int64_t p0, int64_t p1) {
    for (int64_t jp = p0; jp < p1; ++jp) {
      uint16_t* dst = out + jp * D * 2;
      for (int e = 0; e < 2; ++e) {
        const int64_t j = 2 * jp + e;
        if (j >= N) {
          for (int64_t d = 0; d < D; ++d) dst[d * 2 + e] = 0;
          continue;
        }
        const uint16_t* row = v + j * stride;
        for (int64_t d = 0; d < D; ++d) dst[d * 2 + e] = row[d];
      }
    }
  });
}

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }              // a vector cast: same 64 bytes
inline __m512bh bcast_pair(const uint16_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return as_bh(_mm512_set1_epi32(w));
}

// S[i, 0:32] = scale * q_i . K[j0 : j0 + 32] for 8 rows; kp: the first of the two 16-key tiles.
inline void scores_8x32(const uint16_t* const* q, const uint16_t* kp, int64_t P, float scale, float* S,
                        int64_t lds) {
  __m512 acc[kMicro][2];
  for (int i = 0; i < kMicro; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const uint16_t* k1 = kp + P * 32;
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh a = as_bh(_mm512_loadu_si512(kp + p * 32));
    const __m512bh b = as_bh(_mm512_loadu_si512(k1 + p * 32));
    for (int i = 0; i < kMicro; ++i) {
      const __m512bh x = bcast_pair(q[i] + 2 * p);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, a);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, b);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < kMicro; ++i) {
    _mm512_storeu_ps(S + i * lds, _mm512_mul_ps(acc[i][0], s));
    _mm512_storeu_ps(S + i * lds + 16, _mm512_mul_ps(acc[i][1], s));
  }
}

// O[i, d0 : d0 + 32] += P[i, 0:n] . V[jp0 * 2 : jp0 * 2 + n, d0 : d0 + 32] for 8 rows (n even).
inline void pv_8x32(const uint16_t* const* p, int64_t n, const uint16_t* vp, int64_t D, int64_t d0,
                    float* const* o) {
  __m512 acc[kMicro][2];
  for (int i = 0; i < kMicro; ++i) {
    acc[i][0] = _mm512_loadu_ps(o[i] + d0);
    acc[i][1] = _mm512_loadu_ps(o[i] + d0 + 16);
  }
  for (int64_t j = 0; j < n; j += 2) {
    const uint16_t* row = vp + ((j / 2) * D + d0) * 2;
    const __m512bh a = as_bh(_mm512_loadu_si512(row));
    const __m512bh b = as_bh(_mm512_loadu_si512(row + 32));
    for (int i = 0; i < kMicro; ++i) {
      const __m512bh x = bcast_pair(p[i] + j);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, a);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, b);
    }
  }
  for (int i = 0; i < kMicro; ++i) {
    _mm512_storeu_ps(o[i] + d0, acc[i][0]);
    _mm512_storeu_ps(o[i] + d0 + 16, acc[i][1]);
  }
}

// P[a:b] = bf16(exp(S[a:b] - m)), 0 elsewhere in [0, n); returns the sum of the rounded values (lanes, hsum).
inline float exp_round(const float* S, int64_t n, int64_t a, int64_t b, float m, uint16_t* P) {
  const skv::V16 mv = skv::splat(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t lo = std::max<int64_t>(a - j, 0), hi = std::min<int64_t>(b - j, 16);
    const __mmask16 keep = lo < hi ? static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
    __m256i h = _mm256_setzero_si256();
    if (keep) {
      const skv::V16 e = skv::exp(skv::sub(skv::load(S + j), mv));
      const __m512 kept = _mm512_maskz_mov_ps(keep, e.v);
      const __m256bh r = _mm512_cvtneps_pbh(kept);
      h = reinterpret_cast<const __m256i&>(r);
      // the rounded values, widened back (exact), summed
      sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(P + j), h);
  }
  return skv::hsum(skv::V16{sum});
}

#endif  // SPARSEKV_BF16DP

}  // namespace

bool bf16_prefill_available() { return SPARSEKV_BF16DP; }

// q: [T, Hq, D] bf16 (token t at absolute position q0 + t); k, v: [N, H, D] bf16 (key j at position k0 + j);
// window: 0 (causal) or w > 0 (key visible to query iff 0 <= q_pos - k_pos < w). Returns [T, Hq, D] float32.
at::Tensor prefill_attn_bf16(at::Tensor q, at::Tensor k, at::Tensor v, int64_t q0, int64_t k0, int64_t window,
                             double scale) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "prefill_attn_bf16: q, k, v must be 3-d");
  TORCH_CHECK_TYPE(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                       v.scalar_type() == at::kBFloat16, "prefill_attn_bf16: q, k, v must be bfloat16");
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "prefill_attn_bf16: k and v must have one shape");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), N = k.size(0), H = k.size(1);
  TORCH_CHECK_VALUE(T > 0 && Hq > 0 && D > 0, "prefill_attn_bf16: q must be non-empty [T, Hq, D], got ", q.sizes());
  TORCH_CHECK_VALUE(k.size(2) == D && H > 0 && Hq % H == 0, "prefill_attn_bf16: q's heads must be a multiple of k's");
  TORCH_CHECK_VALUE(D % 32 == 0, "prefill_attn_bf16: head dim must be a multiple of 32, got ", D);
  // without an overflow: q0 - k0 and N - T are differences of non-negative values, and k0 + N (the last key's
  // position + 1, above every position the loops form) is representable
  TORCH_CHECK_VALUE(window >= 0, "prefill_attn_bf16: window must be >= 0 (0: causal), got ", window);
  TORCH_CHECK_VALUE(k0 >= 0 && q0 >= k0 && q0 - k0 <= N - T &&
                        k0 <= std::numeric_limits<int64_t>::max() - N,
                    "prefill_attn_bf16: the queries' positions must lie within the keys' (0 <= k0 <= q0, q0 + T <= k0 "
                    "+ N), got q0 ", q0, ", k0 ", k0, ", T ", T, ", N ", N);
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, "prefill_attn_bf16: scale must be positive and finite, got ",
                    scale);
#if !SPARSEKV_BF16DP
  TORCH_CHECK(false, "prefill_attn_bf16: built without AVX512-BF16 (bf16_prefill_available() is false)");
  return q;
#else
  q = q.contiguous(), k = k.contiguous(), v = v.contiguous();
  const int64_t G = Hq / H, M = T * G, P = D / 2, Np = round_up(N, 32);
  auto out = at::empty({T, Hq, D}, q.options().dtype(at::kFloat));
  auto kp = at::empty({H, Np * D}, q.options());
  auto vp = at::empty({H, Np * D}, q.options());
  const auto* qd = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const auto* kd = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto* vd = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  auto* kpd = reinterpret_cast<uint16_t*>(kp.data_ptr<at::BFloat16>());
  auto* vpd = reinterpret_cast<uint16_t*>(vp.data_ptr<at::BFloat16>());
  float* od = out.data_ptr<float>();
  for (int64_t h = 0; h < H; ++h) {
    pack_k(kd + h * D, H * D, N, Np, D, kpd + h * Np * D);
    pack_v(vd + h * D, H * D, N, Np, D, vpd + h * Np * D);
  }
  const float sc = static_cast<float>(scale);
  const int64_t tiles = (M + kRows - 1) / kRows;
  std::vector<uint16_t> zero_row(std::max<int64_t>(D, kBlock), 0);
  at::parallel_for(0, H * tiles, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> S(kRows * kBlock), O(kRows * D), m(kRows), l(kRows);
    std::vector<uint16_t> Pb(kRows * kBlock);
    std::vector<int64_t> lo(kRows), hi(kRows);
    const uint16_t* qrow[kRows];
    for (int64_t item = w0; item < w1; ++item) {
      const int64_t h = item / tiles, r0 = (item % tiles) * kRows, rows = std::min(kRows, M - r0);
      int64_t first = N, last = 0;                        // the keys any row of the tile sees: [first, last)
      for (int64_t i = 0; i < kRows; ++i) {
        if (i < rows) {
          const int64_t r = r0 + i, t = r / G, pos = q0 + t;
          qrow[i] = qd + (t * Hq + h * G + r % G) * D;
          lo[i] = window ? std::max<int64_t>(pos - window + 1 - k0, 0) : 0;
          hi[i] = pos - k0 + 1;
          first = std::min(first, lo[i]), last = std::max(last, hi[i]);
        } else {
          qrow[i] = zero_row.data(), lo[i] = hi[i] = 0;
        }
        m[i] = kNegBig, l[i] = 0.f;
      }
      std::fill(O.begin(), O.end(), 0.f);
      for (int64_t b0 = first / 32 * 32; b0 < last; b0 += kBlock) {
        const int64_t n = std::min(kBlock, round_up(last, 32) - b0);      // a multiple of 32, within Np
        for (int64_t i0 = 0; i0 < rows; i0 += kMicro)
          for (int64_t j = 0; j < n; j += 32)
            scores_8x32(qrow + i0, kpd + h * Np * D + ((b0 + j) / 16) * P * 32, P, sc, S.data() + i0 * kBlock + j,
                        kBlock);
        for (int64_t i = 0; i < rows; ++i) {
          uint16_t* Pi = Pb.data() + i * kBlock;
          const int64_t a = std::max<int64_t>(lo[i] - b0, 0), b = std::min<int64_t>(hi[i] - b0, n);
          if (a >= b) {
            std::memset(Pi, 0, n * sizeof(uint16_t));
            continue;
          }
          const float* Si = S.data() + i * kBlock;
          const float mx = skv::max_of(Si + a, b - a, kNegBig);
          const float mn = std::max(m[i], mx), alpha = skv::exp1(m[i] - mn);
          const float sum = exp_round(Si, n, a, b, mn, Pi);
          if (alpha != 1.f) {
            float* Oi = O.data() + i * D;
            for (int64_t d = 0; d < D; ++d) Oi[d] *= alpha;
          }
          l[i] = l[i] * alpha + sum, m[i] = mn;
        }
        for (int64_t i0 = 0; i0 < rows; i0 += kMicro) {
          const uint16_t* prow[kMicro];
          float* orow[kMicro];
          std::vector<float> sink;                                          // rows past the tile's end
          for (int i = 0; i < kMicro; ++i) {
            if (i0 + i < rows) {
              prow[i] = Pb.data() + (i0 + i) * kBlock, orow[i] = O.data() + (i0 + i) * D;
            } else {
              if (sink.empty()) sink.assign(D, 0.f);
              prow[i] = zero_row.data(), orow[i] = sink.data();
            }
          }
          for (int64_t d0 = 0; d0 < D; d0 += 32)
            pv_8x32(prow, n, vpd + h * Np * D + b0 * D, D, d0, orow);
        }
      }
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = r0 + i, t = r / G;
        float* dst = od + (t * Hq + h * G + r % G) * D;
        const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
        const float* Oi = O.data() + i * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = Oi[d] * inv;
      }
    }
  });
  return out;
#endif
}
