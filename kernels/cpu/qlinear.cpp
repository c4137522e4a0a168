// Weight-only quantised linear layers for the CPU: y = x W^T with W kept as a GGUF file's own integer codes.
//
// Layout (sparsekv/model/quant.py builds it from a GGUF tensor, exactly): W [N, K] in groups of G consecutive
// weights along K, w[n, k] = fma(code[n, k], scale[n, k / G], offset[n, k / G]) in float32;
//   bits 4: codes uint8 [N, K / 2], G = 32; byte j of group g holds element 32 g + j in its low nibble and
//           32 g + 16 + j in its high nibble (GGUF's Q4_0 / Q4_1 order); code = the nibble, 0..15
//   bits 5: codes uint8 [N, 5 K / 8], G = 32: per row, the low nibbles as bits 4 lays them out (K / 2 bytes),
//           then the high bits (K / 8 bytes), one little-endian uint16 per 16 consecutive elements with element
//           i of them at bit i; code = nibble + 16 high - 16, -16..15 (GGUF's Q5_0)
//   bits 6: codes uint8 [N, 3 K / 4], G = 16 or 32: the low nibbles as bits 4 (K / 2 bytes), then the high 2
//           bits (K / 4 bytes), one little-endian uint32 per 16 consecutive elements with element i at bits 2i,
//           2i + 1; code = nibble + 16 high - 32, -32..31 (GGUF's Q6_K)
//   bits 8: codes int8 [N, K], G = 16 or 32
// scale, and offset where there is one, in one of three forms:
//   plain     float32 [N, K / G]
//   half      float16 [N, K / G] (widened exactly: the form of the legacy formats' d and m)
//   factored  uint8 [N, K / G + 4 K / 256]: per row, K / G int8 multipliers m, then K / 256 float32 super-scales d
//             (little-endian bytes), one per 256 weights; scale[n, g] = d[n, g G / 256] * m[n, g] rounded to
//             float32 (the K-quants' own form: GGUF's float16 d times a 6- or 8-bit integer, exact in float32)
// offset may also be empty (w = code * scale, the same value as the fma with 0). K a multiple of 32 (of 256
// with a factored scale or offset).
//
// Algorithm (qlinear), per output row n (rows split across threads, one row always one thread's):
//   for each 16-weight chunk c of the row:
//       w = fma(code[c], scale, offset)                       16 lanes, widened exactly from the codes
//       for each of up to kBatch rows m of x: acc[m][c % 4] = fma(w, x[m, 16 c ...], acc[m][c % 4])
//   y[m, n] = hsum((acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]))
// so each code is read and widened once per kBatch tokens, and four accumulators hide the FMA latency. A
// decode step's matmuls are M = 1 (or the batch's B); a prefill chunk's go through qdequant and MKL instead.
// Every path widens a row's scales (and offsets) kScaleChunk groups at a time (row_scales: float16 by F16C, the
// factored form 8 groups per super-scale, each value the same float32 as Table::at), and walks its pairs or groups
// two at a time, so that the two accumulator sets are named, not indexed by a loop variable: indexed, they lived on
// the stack and every product waited on a store and a load (a decode step's matmuls ran 2-3x slower, Dec 2026).
// The order of every sum is unchanged by that: the same bits as before, on every path.
// The same bits at any thread count and for any instruction set (simd.h's rules).
//
// qdequant writes W as float32 [N, K] with the same fma.
//
// qlinear_q8 takes x quantised to int8 first, as llama.cpp's own dot products do: per 32 values of a row of x,
// d = max|x| / 127 and q = nearbyint(x * (1 / d)) (0 where d = 0), so |q| <= 127 (ggml rounds d to float16; here
// it stays float32). Then per output row n and 32 weights p (one x block):
//   8-bit codes (G = 32, no offset: GGUF's Q8_0):
//     lane j of dot = sum over i < 4 of code[32 p + 4 j + i] * q[32 p + 4 j + i]      8 int32 lanes, exact
//     acc[p % 2][j] = fma(float(lane j), scale[n, p] * d[p], acc[p % 2][j])
//     y[m, n] = the 8-lane sum of acc[0] + acc[1] (a fixed tree)
//   4-, 5- and 6-bit codes (rows_q8u): the same lanes over u = code + bias (unsigned, bias 0, 16, 32), each lane
//     scaled by its own group's scale (G = 16: lanes 0..3 and 4..7), plus per group (offset - scale bias) d sum q
//     in one float per row; y = the lane sum + that.
// On AVX2 the lanes are maddubs(u8, q) summed in pairs by madd (8-bit codes: u8 = |code|, q with code's sign; at
// most 2 * 128 * 127, no int16 saturation); with AVX-512 VNNI or AVX-VNNI, dpbusd; elsewhere plain loops. Every lane
// is exact and the float steps are the same, so the bits are too, on every instruction set and at any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "simd.h"

namespace {

using skv::V16;
using skv::kLanes;

constexpr int kBatch = 4;           // rows of x sharing one pass over the codes
constexpr int64_t kGrainRows = 16;  // output rows per work item, at least

// A scale or offset table in one of its three forms: plain, half or factored (file comment).
struct Table {
  const float* plain = nullptr;    // [N, K / G]
  const uint16_t* half = nullptr;  // float16 [N, K / G]
  const uint8_t* bytes = nullptr;  // factored: [N, K / G + 4 K / 256]
  int64_t row = 0;                 // elements (plain) or bytes (factored) per row
  int64_t groups = 0;              // K / G
  int64_t per_super = 1;           // groups per 256 weights

  bool empty() const { return plain == nullptr && half == nullptr && bytes == nullptr; }
  float at(int64_t n, int64_t g) const {
    if (plain != nullptr) return plain[n * row + g];
    if (half != nullptr) return c10::detail::fp16_ieee_to_fp32_value(half[n * row + g]);
    const uint8_t* r = bytes + n * row;
    float d;
    std::memcpy(&d, r + groups + 4 * (g / per_super), sizeof d);
    return d * static_cast<float>(static_cast<int8_t>(r[g]));
  }
};

struct QWeight {
  const uint8_t* codes;  // [N, row_bytes]: bits 4 packed, bits 5 and 6 nibbles then high bits, bits 8 int8
  Table scale, offset;   // offset empty: no offset
  int64_t N, K, row_bytes;
  int bits, group;
};

// The high bits of pair p (chunks 2p, 2p+1) added to its nibble codes: W bits per weight in one little-endian word
// per 16 weights (bits 5: W = 1, a uint16; bits 6: W = 2, a uint32), code = nibble + 16 high - 2^(3 + W), every
// step exact in float32.
template <int W>
inline void add_high(const uint8_t* high, int64_t p, V16& c0, V16& c1) {
  using Word = std::conditional_t<W == 1, uint16_t, uint32_t>;
  Word h[2];
  std::memcpy(h, high + p * 2 * sizeof(Word), sizeof h);
  const V16 sixteen = skv::splat(16.0f), bias = skv::splat(static_cast<float>(1 << (3 + W)));
  c0 = skv::sub(skv::fma(skv::load_fields<W>(h[0]), sixteen, c0), bias);
  c1 = skv::sub(skv::fma(skv::load_fields<W>(h[1]), sixteen, c1), bias);
}

// The 32 codes of pair p of one row (r: the row's bytes), widened exactly to float32.
template <int Bits>
inline void pair_codes(const uint8_t* r, int64_t K, int64_t p, V16& c0, V16& c1) {
  if constexpr (Bits == 8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(r) + p * 32;
    c0 = skv::load_i8(q), c1 = skv::load_i8(q + kLanes);
  } else {
    skv::load_u4(r + p * 16, c0, c1);
    if constexpr (Bits == 5) add_high<1>(r + K / 2, p, c0, c1);
    if constexpr (Bits == 6) add_high<2>(r + K / 2, p, c0, c1);
  }
}

// The 32 weights of pair p (chunks 2p, 2p+1) of row n (r: its bytes), dequantised: fma(code, scale, offset), or
// code * scale with no offset (ggml's own product, -0 included).
template <int Bits>
inline void pair_weights(const QWeight& w, int64_t n, const uint8_t* r, int64_t p, V16& w0, V16& w1) {
  V16 c0, c1;
  pair_codes<Bits>(r, w.K, p, c0, c1);
  const int64_t g0 = w.group == 32 ? p : 2 * p, g1 = w.group == 32 ? p : 2 * p + 1;   // group 16: one per chunk
  const float s0 = w.scale.at(n, g0), s1 = g1 == g0 ? s0 : w.scale.at(n, g1);
  if (!w.offset.empty()) {
    const float o0 = w.offset.at(n, g0), o1 = g1 == g0 ? o0 : w.offset.at(n, g1);
    w0 = skv::fma(c0, skv::splat(s0), skv::splat(o0)), w1 = skv::fma(c1, skv::splat(s1), skv::splat(o1));
  } else {
    w0 = skv::mul(c0, skv::splat(s0)), w1 = skv::mul(c1, skv::splat(s1));
  }
}

// Scales of groups [g0, g0 + n) of row `row` as float32 (exact from every form); float16 ones 8 at a time (F16C).
inline void row_scales(const Table& t, int64_t row, int64_t g0, int n, float* out) {
  int i = 0;
#if SPARSEKV_AVX512 || SPARSEKV_AVX2
  if (t.half != nullptr)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(t.half + row * t.row + g0 + i))));
  if (t.bytes != nullptr && g0 % 8 == 0 && t.per_super % 8 == 0)   // 8 groups at a time share one super-scale d
    for (; i + 8 <= n; i += 8) {
      const uint8_t* r = t.bytes + row * t.row;
      float d;
      std::memcpy(&d, r + t.groups + 4 * ((g0 + i) / t.per_super), sizeof d);
      const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
          reinterpret_cast<const __m128i*>(r + g0 + i))));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_set1_ps(d), m));          // d * m, as Table::at rounds it
    }
#endif
  for (; i < n; ++i) out[i] = t.at(row, g0 + i);
}

constexpr int kScaleChunk = 64;   // groups whose scales are widened at once

template <int M, int Bits, int Per>   // Per: groups per pair, 1 (groups of 32) or 2 (of 16)
void rows(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t groups = w.K / (32 / Per);
  const bool has_offset = !w.offset.empty();
  float s[kScaleChunk], o[kScaleChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* r = w.codes + n * w.row_bytes;
    V16 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int a = 0; a < 4; ++a) acc[m][a] = skv::zero();
    for (int64_t c = 0; c < groups; c += kScaleChunk) {         // kScaleChunk groups: whole pairs, an even count
      const int len = static_cast<int>(std::min<int64_t>(kScaleChunk, groups - c));
      row_scales(w.scale, n, c, len, s);
      if (has_offset) row_scales(w.offset, n, c, len, o);
      const int64_t p0 = c / Per;                                // even, so pair p0 + j has j's parity
      // pair p: w = fma(code, scale, offset) (code * scale with no offset, ggml's own product, -0 included), its
      // chunks 2p, 2p + 1 into accumulators a, a + 1 with a = 2p mod 4 (named, so they stay in registers)
      const auto pair = [&](int j, int a) __attribute__((always_inline)) {
        const int64_t p = p0 + j;
        const int i = j * Per;
        V16 c0, c1, w0, w1;
        pair_codes<Bits>(r, w.K, p, c0, c1);
        const float s0 = s[i], s1 = Per == 2 ? s[i + 1] : s0;
        if (has_offset) {
          const float o0 = o[i], o1 = Per == 2 ? o[i + 1] : o0;
          w0 = skv::fma(c0, skv::splat(s0), skv::splat(o0)), w1 = skv::fma(c1, skv::splat(s1), skv::splat(o1));
        } else {
          w0 = skv::mul(c0, skv::splat(s0)), w1 = skv::mul(c1, skv::splat(s1));
        }
        for (int m = 0; m < M; ++m) {
          const float* xm = x + m * ldx + p * 32;
          acc[m][a] = skv::fma(w0, skv::load(xm), acc[m][a]);
          acc[m][a + 1] = skv::fma(w1, skv::load(xm + kLanes), acc[m][a + 1]);
        }
      };
      const int np = len / Per;
      int j = 0;
      for (; j + 2 <= np; j += 2) pair(j, 0), pair(j + 1, 2);
      if (j < np) pair(j, 0);
    }
    for (int m = 0; m < M; ++m)
      y[m * ldy + n] = skv::hsum(skv::add(skv::add(acc[m][0], acc[m][1]), skv::add(acc[m][2], acc[m][3])));
  }
}

// rows<M, Bits, Per> for a runtime bits and group (one switch per call, outside every loop).
template <int M>
void rows_for(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const bool g16 = w.group == 16;
  switch (w.bits) {
    case 4: rows<M, 4, 1>(w, x, ldx, y, ldy, n0, n1); break;
    case 5: rows<M, 5, 1>(w, x, ldx, y, ldy, n0, n1); break;
    case 6: g16 ? rows<M, 6, 2>(w, x, ldx, y, ldy, n0, n1) : rows<M, 6, 1>(w, x, ldx, y, ldy, n0, n1); break;
    default: g16 ? rows<M, 8, 2>(w, x, ldx, y, ldy, n0, n1) : rows<M, 8, 1>(w, x, ldx, y, ldy, n0, n1); break;
  }
}

template <int Bits>
void dequant_rows(const QWeight& w, float* out, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* r = w.codes + n * w.row_bytes;
    for (int64_t p = 0; p < w.K / 32; ++p) {
      V16 w0, w1;
      pair_weights<Bits>(w, n, r, p, w0, w1);
      skv::store(out + n * w.K + p * 32, w0);
      skv::store(out + n * w.K + p * 32 + kLanes, w1);
    }
  }
}

// ---- int8 activations (qlinear_q8) ------------------------------------------------------------------------
constexpr int kQ8 = 32;   // values of x per int8 scale

// Row x [K] -> q [K] int8 and d [K / 32] (file comment). False if x holds a value that is not finite.
bool quantize_q8(const float* x, int64_t K, int8_t* q, float* d) {
  bool finite = true;
  for (int64_t b = 0; b < K / kQ8; ++b) {
    const float* xb = x + b * kQ8;
    float amax = 0.0f;
    for (int i = 0; i < kQ8; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    d[b] = db;
    for (int i = 0; i < kQ8; ++i)
      q[b * kQ8 + i] = finite ? static_cast<int8_t>(std::nearbyint(xb[i] * id)) : 0;
  }
  return finite;
}

#if SPARSEKV_AVX512 || SPARSEKV_AVX2
struct Lanes8 {
  __m256 v;
};
inline Lanes8 lanes_zero() { return {_mm256_setzero_ps()}; }
// acc + float(dot of 32 codes w with 32 activations q, in 8 lanes) * s
inline Lanes8 dot_fma(const int8_t* w, const int8_t* q, float s, Lanes8 acc) {
  const __m256i cw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i aw = _mm256_sign_epi8(cw, cw);                                     // |code| as uint8
  const __m256i sq = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), cw);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sq);
#elif defined(__AVXVNNI__)
  const __m256i dot = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sq);
#else
  const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sq), _mm256_set1_epi16(1));
#endif
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s), acc.v)};
}
// The 32 codes of pair p of a row (r: its bytes) as unsigned bytes u = nibble + 16 * high bits, 0 .. 2^Bits - 1,
// in element order (code = u - 2^(Bits - 1) for bits 5 and 6, = u for bits 4).
struct U32 {
  __m256i v;
};
template <int Bits>
inline U32 pair_u8(const uint8_t* r, int64_t K, int64_t p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + p * 16));
  const __m128i nib = _mm_set1_epi8(0x0F);
  __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), nib), _mm_and_si128(b, nib));
  if constexpr (Bits == 5) {            // bit i of the pair's 32-bit mask -> 16 in byte i
    uint16_t h[2];
    std::memcpy(h, r + K / 2 + p * 4, sizeof h);
    const uint32_t m = h[0] | (static_cast<uint32_t>(h[1]) << 16);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    u = _mm256_add_epi8(u, _mm256_and_si256(on, _mm256_set1_epi8(16)));
  }
  if constexpr (Bits == 6) {            // the 2-bit field of element i (bits 2i, 2i + 1 of its word) -> 16, 32
    uint32_t h[2];
    std::memcpy(h, r + K / 2 + p * 8, sizeof h);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_setr_epi32(static_cast<int>(h[0]), 0, 0, 0,
                                                                  static_cast<int>(h[1]), 0, 0, 0),
        _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m256i lo = _mm256_set1_epi32(0x40100401), hi = _mm256_set1_epi32(static_cast<int>(0x80200802u));
    const __m256i on_lo = _mm256_cmpeq_epi8(_mm256_and_si256(spread, lo), lo);
    const __m256i on_hi = _mm256_cmpeq_epi8(_mm256_and_si256(spread, hi), hi);
    u = _mm256_add_epi8(u, _mm256_or_si256(_mm256_and_si256(on_lo, _mm256_set1_epi8(16)),
                                           _mm256_and_si256(on_hi, _mm256_set1_epi8(32))));
  }
  return {u};
}
// [a, a, a, a, b, b, b, b]
inline Lanes8 lanes_pair(float a, float b) { return {_mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a))}; }
// acc + float(dot of the unsigned codes u with 32 activations q, in 8 lanes) * s (per lane)
inline Lanes8 dot_u_fma(U32 u, const int8_t* q, Lanes8 s, Lanes8 acc) {
  const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u.v, qv);
#elif defined(__AVXVNNI__)
  const __m256i dot = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u.v, qv);
#else
  const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u.v, qv), _mm256_set1_epi16(1));   // <= 2 * 63 * 127
#endif
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s.v, acc.v)};
}
inline float lanes_sum(Lanes8 a, Lanes8 b) {
  const __m256 s = _mm256_add_ps(a.v, b.v);
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));   // j + (j + 4)
  const __m128 p = _mm_add_ps(h, _mm_movehl_ps(h, h));                                   // (0 + 2), (1 + 3)
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}
#else
struct Lanes8 {
  float v[8];
};
inline Lanes8 lanes_zero() { return {}; }
inline Lanes8 dot_fma(const int8_t* w, const int8_t* q, float s, Lanes8 acc) {
  for (int j = 0; j < 8; ++j) {
    int32_t dot = 0;
    for (int i = 0; i < 4; ++i) dot += static_cast<int32_t>(w[4 * j + i]) * q[4 * j + i];
    acc.v[j] = std::fma(static_cast<float>(dot), s, acc.v[j]);
  }
  return acc;
}
struct U32 {
  uint8_t v[32];
};
template <int Bits>
inline U32 pair_u8(const uint8_t* r, int64_t K, int64_t p) {
  U32 u;
  for (int j = 0; j < 16; ++j) u.v[j] = r[p * 16 + j] & 0x0F, u.v[16 + j] = r[p * 16 + j] >> 4;
  if constexpr (Bits == 5) {
    uint16_t h[2];
    std::memcpy(h, r + K / 2 + p * 4, sizeof h);
    for (int i = 0; i < 32; ++i) u.v[i] += 16 * ((h[i / 16] >> (i % 16)) & 1);
  }
  if constexpr (Bits == 6) {
    uint32_t h[2];
    std::memcpy(h, r + K / 2 + p * 8, sizeof h);
    for (int i = 0; i < 32; ++i) u.v[i] += 16 * ((h[i / 16] >> (2 * (i % 16))) & 3);
  }
  return u;
}
inline Lanes8 lanes_pair(float a, float b) { return {{a, a, a, a, b, b, b, b}}; }
inline Lanes8 dot_u_fma(const U32& u, const int8_t* q, Lanes8 s, Lanes8 acc) {
  for (int j = 0; j < 8; ++j) {
    int32_t dot = 0;
    for (int i = 0; i < 4; ++i) dot += static_cast<int32_t>(u.v[4 * j + i]) * q[4 * j + i];
    acc.v[j] = std::fma(static_cast<float>(dot), s.v[j], acc.v[j]);
  }
  return acc;
}
inline float lanes_sum(Lanes8 a, Lanes8 b) {
  float s[8];
  for (int j = 0; j < 8; ++j) s[j] = a.v[j] + b.v[j];
  float h[4];
  for (int j = 0; j < 4; ++j) h[j] = s[j] + s[j + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}
#endif

#if SPARSEKV_AVX512 && defined(__AVX512VNNI__)
#define SPARSEKV_Q8_ZMM 1
// Two groups per zmm: lanes 0..7 hold group g's 8 lanes, 8..15 group g + 1's, so the low half accumulates the even
// groups and the high half the odd ones, as acc[0] and acc[1] do on the other paths. dpbusd multiplies unsigned
// by signed bytes: with u = code + 128 (code ^ 0x80), lane j = sum (code + 128) q - 128 sum q, and q4x128[j] =
// 128 sum_{i<4} q[4 j + i] is precomputed per row of x; every lane is the same integer as on the other paths.
template <int M>
void rows_q8_zmm(const QWeight& w, const int8_t* q, const int32_t* q4x128, const float* d, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  const int64_t groups = w.K / kQ8;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  float s[kScaleChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* r = reinterpret_cast<const int8_t*>(w.codes + n * w.row_bytes);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < groups; c += kScaleChunk) {
      const int len = static_cast<int>(std::min<int64_t>(kScaleChunk, groups - c));
      row_scales(w.scale, n, c, len, s);
      int i = 0;
      for (; i + 2 <= len; i += 2) {
        const int64_t g = c + i;
        const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(r + g * kQ8), flip);
        for (int m = 0; m < M; ++m) {
          const __m512i qv = _mm512_loadu_si512(q + m * w.K + g * kQ8);
          const __m512i dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, qv),
                                               _mm512_loadu_si512(q4x128 + m * (w.K / 4) + g * 8));
          const __m512 sv = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[i] * d[m * groups + g]),
                                                 _mm512_set1_ps(s[i + 1] * d[m * groups + g + 1]));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sv, acc[m]);
        }
      }
      if (i < len) {                      // an odd group count: the last (even) group into the low half
        const int64_t g = c + i;
        for (int m = 0; m < M; ++m) {
          const Lanes8 low = dot_fma(r + g * kQ8, q + m * w.K + g * kQ8, s[i] * d[m * groups + g],
                                     {_mm512_castps512_ps256(acc[m])});
          acc[m] = _mm512_insertf32x8(acc[m], low.v, 0);
        }
      }
    }
    for (int m = 0; m < M; ++m)
      y[m * ldy + n] = lanes_sum({_mm512_castps512_ps256(acc[m])}, {_mm512_extractf32x8_ps(acc[m], 1)});
  }
}
#else
#define SPARSEKV_Q8_ZMM 0
#endif

template <int M>
void rows_q8(const QWeight& w, const int8_t* q, const float* d, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t groups = w.K / kQ8;
  float s[kScaleChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* r = reinterpret_cast<const int8_t*>(w.codes + n * w.row_bytes);
    Lanes8 acc0[M], acc1[M];                 // even groups, odd groups (named, so they stay in registers)
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = lanes_zero();
    for (int64_t c = 0; c < groups; c += kScaleChunk) {           // c even: group c + i has i's parity
      const int len = static_cast<int>(std::min<int64_t>(kScaleChunk, groups - c));
      row_scales(w.scale, n, c, len, s);
      const auto group = [&](int i, Lanes8* acc) __attribute__((always_inline)) {
        const int64_t g = c + i;
        for (int m = 0; m < M; ++m)
          acc[m] = dot_fma(r + g * kQ8, q + m * w.K + g * kQ8, s[i] * d[m * groups + g], acc[m]);
      };
      int i = 0;
      for (; i + 2 <= len; i += 2) group(i, acc0), group(i + 1, acc1);
      if (i < len) group(i, acc0);
    }
    for (int m = 0; m < M; ++m) y[m * ldy + n] = lanes_sum(acc0[m], acc1[m]);
  }
}

// Unsigned codes (bits 4, 5, 6; group 16 or 32; an offset or none): with u = code + bias (bias 0, 16, 32) and
// w = scale code + offset = scale u + (offset - scale bias), a group's part of y is
//   d (scale sum u q) + (offset - scale bias) d sum q,
// the first in the 8 lanes as the 8-bit path (group 16: lanes 0..3 one group, 4..7 the next), the second a scalar
// per row summed in group order; q16 holds each 16 values' sum of q. y = lanes_sum + that scalar.
template <int M, int Bits, int Per>   // Per: groups per pair, 1 (groups of 32) or 2 (of 16)
void rows_q8u(const QWeight& w, const int8_t* q, const int32_t* q16, const float* d, float* y, int64_t ldy,
              int64_t n0, int64_t n1) {
  const int64_t pairs = w.K / 32, groups = w.K / (32 / Per);
  const float bias = Bits == 4 ? 0.0f : static_cast<float>(1 << (Bits - 1));
  float s[kScaleChunk], o[kScaleChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* r = w.codes + n * w.row_bytes;
    Lanes8 acc0[M], acc1[M];                 // even pairs, odd pairs (named, so they stay in registers)
    float corr[M];
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = lanes_zero(), corr[m] = 0.0f;
    for (int64_t c = 0; c < groups; c += kScaleChunk) {           // kScaleChunk groups: whole pairs, an even count
      const int len = static_cast<int>(std::min<int64_t>(kScaleChunk, groups - c));
      row_scales(w.scale, n, c, len, s);
      if (!w.offset.empty()) row_scales(w.offset, n, c, len, o);
      else std::fill(o, o + len, 0.0f);
      const int64_t p0 = c / Per;                                // even, so pair p0 + j has j's parity
      const auto pair = [&](int j, Lanes8* acc) __attribute__((always_inline)) {
        const int64_t p = p0 + j;
        const int i = j * Per;
        const U32 u = pair_u8<Bits>(r, w.K, p);
        const float s0 = s[i], s1 = Per == 2 ? s[i + 1] : s[i];
        for (int m = 0; m < M; ++m) {
          const float dm = d[m * pairs + p];
          acc[m] = dot_u_fma(u, q + m * w.K + p * 32, lanes_pair(s0 * dm, s1 * dm), acc[m]);
          const int32_t* qs = q16 + m * (w.K / 16) + 2 * p;
          if constexpr (Per == 2) {
            corr[m] = std::fma(o[i] - s0 * bias, dm * static_cast<float>(qs[0]), corr[m]);
            corr[m] = std::fma(o[i + 1] - s1 * bias, dm * static_cast<float>(qs[1]), corr[m]);
          } else {
            corr[m] = std::fma(o[i] - s0 * bias, dm * static_cast<float>(qs[0] + qs[1]), corr[m]);
          }
        }
      };
      const int np = len / Per;
      int j = 0;
      for (; j + 2 <= np; j += 2) pair(j, acc0), pair(j + 1, acc1);
      if (j < np) pair(j, acc0);
    }
    for (int m = 0; m < M; ++m) y[m * ldy + n] = lanes_sum(acc0[m], acc1[m]) + corr[m];
  }
}

Table table(const at::Tensor& t, const char* name, int64_t N, int64_t K, int64_t group) {
  Table tab;
  tab.groups = K / group;
  TORCH_CHECK_VALUE(t.dim() == 2 && t.is_contiguous() && t.size(0) == N,
                    "qlinear: ", name, " must be a contiguous 2-D tensor with N = ", N, " rows, got shape ", t.sizes());
  if (t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf) {
    TORCH_CHECK_VALUE(t.size(1) == tab.groups, "qlinear: a float32 or float16 ", name, " must be [N, K / group] = [",
                      N, ", ", tab.groups, "], got ", t.sizes());
    if (t.scalar_type() == at::kFloat) tab.plain = t.data_ptr<float>();
    else tab.half = reinterpret_cast<const uint16_t*>(t.data_ptr());
    tab.row = tab.groups;
    return tab;
  }
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, "qlinear: ", name,
                   " must be float32 (plain), float16 (half) or uint8 (factored), got ", t.scalar_type());
  TORCH_CHECK_VALUE(K % 256 == 0, "qlinear: a factored ", name, " needs K a multiple of 256, got ", K);
  TORCH_CHECK_VALUE(t.size(1) == tab.groups + 4 * (K / 256), "qlinear: a factored ", name,
                    " must be uint8 [N, K / group + 4 K / 256] = [", N, ", ", tab.groups + 4 * (K / 256), "], got ",
                    t.sizes());
  tab.bytes = static_cast<const uint8_t*>(t.data_ptr()), tab.row = t.size(1), tab.per_super = 256 / group;
  return tab;
}

QWeight check(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
              int64_t group) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 5 || bits == 6 || bits == 8, "qlinear: bits must be 4, 5, 6 or 8, got ",
                    bits);
  TORCH_CHECK_VALUE(group == 32 || (bits >= 6 && group == 16),
                    "qlinear: group must be 32 (or 16 with 6 or 8 bits), got ", group);
  TORCH_CHECK_VALUE(codes.dim() == 2 && codes.is_contiguous() && codes.size(0) > 0 && codes.size(1) > 0,
                    "qlinear: codes must be a contiguous non-empty [N, K'] tensor, got shape ", codes.sizes());
  TORCH_CHECK_TYPE(codes.scalar_type() == (bits == 8 ? at::kChar : at::kByte), "qlinear: codes must be ",
                   bits == 8 ? "int8" : "uint8", ", got ", codes.scalar_type());
  const int64_t N = codes.size(0), row = codes.size(1);
  const int64_t K = bits == 4 ? row * 2 : bits == 5 ? row * 8 / 5 : bits == 6 ? row * 4 / 3 : row;
  TORCH_CHECK_VALUE(K % 32 == 0 && K * bits == row * 8, "qlinear: K must be a multiple of 32, got codes ",
                    codes.sizes(), " for ", bits, " bits");
  QWeight w{static_cast<const uint8_t*>(codes.data_ptr()), table(scale, "scale", N, K, group), Table{}, N, K, row,
            static_cast<int>(bits), static_cast<int>(group)};
  if (offset.numel() > 0) w.offset = table(offset, "offset", N, K, group);
  return w;
}

// qlinear_q8's own rule: 8-bit codes only as GGUF's Q8_0 (rows_q8 has no offset term and one scale per 32).
void check_q8(int64_t bits, int64_t group, const at::Tensor& offset) {
  TORCH_CHECK_VALUE(bits != 8 || (group == 32 && offset.numel() == 0),
                    "qlinear_q8: 8-bit codes need groups of 32 and no offset (GGUF's Q8_0), got group ", group,
                    " and an offset of ", offset.numel(), " values");
}

}  // namespace

std::pair<int64_t, int64_t> check_qlinear(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset,
                                          int64_t bits, int64_t group, bool q8) {
  if (q8) check_q8(bits, group, offset);
  const QWeight w = check(codes, scale, offset, bits, group);
  return {w.N, w.K};
}

at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group) {
  const QWeight w = check(codes, scale, offset, bits, group);
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "qlinear: x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == w.K, "qlinear: x must be [M, K] with K = ", w.K, ", got ",
                    x.sizes());
  x = x.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, w.N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += kBatch) {
      const float* xm = xp + m * w.K;
      float* ym = yp + m * w.N;
      switch (std::min<int64_t>(kBatch, M - m)) {
        case 1: rows_for<1>(w, xm, w.K, ym, w.N, n0, n1); break;
        case 2: rows_for<2>(w, xm, w.K, ym, w.N, n0, n1); break;
        case 3: rows_for<3>(w, xm, w.K, ym, w.N, n0, n1); break;
        default: rows_for<4>(w, xm, w.K, ym, w.N, n0, n1); break;
      }
    }
  });
  return y;
}

at::Tensor qdequant(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits, int64_t group) {
  const QWeight w = check(codes, scale, offset, bits, group);
  at::Tensor out = at::empty({w.N, w.K}, codes.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
    switch (w.bits) {
      case 4: dequant_rows<4>(w, op, n0, n1); break;
      case 5: dequant_rows<5>(w, op, n0, n1); break;
      case 6: dequant_rows<6>(w, op, n0, n1); break;
      default: dequant_rows<8>(w, op, n0, n1); break;
    }
  });
  return out;
}

// y [M, N] = q8(x) W^T for 8-bit codes in groups of 32 with no offset (file comment); x float32 [M, K], finite.
at::Tensor qlinear_q8(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                      int64_t group) {
  check_q8(bits, group, offset);
  const QWeight w = check(codes, scale, offset, bits, group);
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "qlinear_q8: x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == w.K, "qlinear_q8: x must be [M, K] with K = ", w.K, ", got ",
                    x.sizes());
  x = x.contiguous();
  const int64_t M = x.size(0), groups = w.K / kQ8;
  at::Tensor q = at::empty({M, w.K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, groups}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK_VALUE(quantize_q8(xp + m * w.K, w.K, qp + m * w.K, dp + m * groups),
                      "qlinear_q8: x must be finite (row ", m, " is not)");
  at::Tensor y = at::empty({M, w.N}, x.options());
  float* yp = y.data_ptr<float>();
  if (bits != 8) {
    std::vector<int32_t> q16(M * w.K / 16);       // each 16 values' sum of q
    for (int64_t j = 0; j < M * w.K / 16; ++j) {
      int32_t t = 0;
      for (int i = 0; i < 16; ++i) t += qp[16 * j + i];
      q16[j] = t;
    }
    const int32_t* q16p = q16.data();
    at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
      for (int64_t m = 0; m < M; m += kBatch) {
        const int8_t* qm = qp + m * w.K;
        const int32_t* sm = q16p + m * (w.K / 16);
        const float* dm = dp + m * groups;
        float* ym = yp + m * w.N;
        const int b = static_cast<int>(std::min<int64_t>(kBatch, M - m));
        switch ((w.bits * 8 + b) * 2 + (w.group == 16)) {
#define SPARSEKV_Q8U(BITS, B, PER) \
  case (BITS * 8 + B) * 2 + (PER - 1): rows_q8u<B, BITS, PER>(w, qm, sm, dm, ym, w.N, n0, n1); break;
          SPARSEKV_Q8U(4, 1, 1) SPARSEKV_Q8U(4, 2, 1) SPARSEKV_Q8U(4, 3, 1) SPARSEKV_Q8U(4, 4, 1)
          SPARSEKV_Q8U(5, 1, 1) SPARSEKV_Q8U(5, 2, 1) SPARSEKV_Q8U(5, 3, 1) SPARSEKV_Q8U(5, 4, 1)
          SPARSEKV_Q8U(6, 1, 1) SPARSEKV_Q8U(6, 2, 1) SPARSEKV_Q8U(6, 3, 1) SPARSEKV_Q8U(6, 4, 1)
          SPARSEKV_Q8U(6, 1, 2) SPARSEKV_Q8U(6, 2, 2) SPARSEKV_Q8U(6, 3, 2) SPARSEKV_Q8U(6, 4, 2)
#undef SPARSEKV_Q8U
        }
      }
    });
    return y;
  }
#if SPARSEKV_Q8_ZMM
  std::vector<int32_t> q4(M * w.K / 4);          // 128 times each 4 consecutive q's sum (rows_q8_zmm)
  for (int64_t j = 0; j < M * w.K / 4; ++j)
    q4[j] = 128 * (static_cast<int32_t>(qp[4 * j]) + qp[4 * j + 1] + qp[4 * j + 2] + qp[4 * j + 3]);
  const int32_t* q4p = q4.data();
#define SPARSEKV_Q8_ROWS(B) rows_q8_zmm<B>(w, qm, q4p + m * (w.K / 4), dm, ym, w.N, n0, n1)
#else
#define SPARSEKV_Q8_ROWS(B) rows_q8<B>(w, qm, dm, ym, w.N, n0, n1)
#endif
  at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += kBatch) {
      const int8_t* qm = qp + m * w.K;
      const float* dm = dp + m * groups;
      float* ym = yp + m * w.N;
      switch (std::min<int64_t>(kBatch, M - m)) {
        case 1: SPARSEKV_Q8_ROWS(1); break;
        case 2: SPARSEKV_Q8_ROWS(2); break;
        case 3: SPARSEKV_Q8_ROWS(3); break;
        default: SPARSEKV_Q8_ROWS(4); break;
      }
    }
  });
#undef SPARSEKV_Q8_ROWS
  return y;
}

// x [M, K] (K a multiple of 32) -> (q int8 [M, K], d float32 [M, K / 32]): qlinear_q8's activations, for tests.
std::vector<at::Tensor> quantize_q8_rows(at::Tensor x) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "quantize_q8: x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) > 0 && x.size(1) % kQ8 == 0,
                    "quantize_q8: x must be [M, K] with K a positive multiple of 32, got ", x.sizes());
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / kQ8}, x.options());
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK_VALUE(quantize_q8(x.data_ptr<float>() + m * K, K, q.data_ptr<int8_t>() + m * K,
                                  d.data_ptr<float>() + m * (K / kQ8)),
                      "quantize_q8: x must be finite (row ", m, " is not)");
  return {q, d};
}
