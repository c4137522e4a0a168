// Sixteen float32 lanes, the one vector type the CPU kernels are written in.
//
// With AVX-512 a V16 is one zmm register: loads of float32 or bfloat16 storage (bfloat16 widened by a
// 16-bit shift, exact), fused multiply-add, max, a horizontal sum, masked loads for a head dim that is
// not a multiple of 16, and exp. With AVX2 and FMA (most AMD CPUs, older Intel ones) it is two ymm
// registers, lanes 0..7 and 8..15, with the same operations. Elsewhere the same operations run on a
// 16-float array in loops, so the kernels have one algorithm and several instruction sets. (The AVX2 path
// exists because those loops did not vectorise: qlinear read 1 GB/s of codes on an AMD EPYC whose memory
// reads 20 GB/s.)
//
// Reproducibility: every operation gives bit-identical results on both paths, so a kernel's output does
// not depend on the instruction set it was built for (tests/test_cpu_kernel.py builds both and compares).
// That needs three things, which the kernels keep to:
//   1. fused multiply-add only where written (`fma`: one rounding on both paths); the extension is built
//      with -ffp-contract=off and without -ffast-math, so the compiler neither fuses nor reorders;
//   2. one order for every horizontal reduction (`hsum`, `hsum4`: the tree written below);
//   3. one exp (`exp`, `exp1`): a polynomial in these operations, not libm's or libmvec's, whose results
//      differ between their scalar, AVX2 and AVX-512 variants.
// A sum over a loop is accumulated in lanes (element i into lane i % 16) and reduced by `hsum`.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SPARSEKV_AVX512 1
#define SPARSEKV_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPARSEKV_AVX512 0
#define SPARSEKV_AVX2 1
#else
#define SPARSEKV_AVX512 0
#define SPARSEKV_AVX2 0
#endif

namespace skv {

constexpr int kLanes = 16;

// A finite "minus infinity" for a running maximum or a masked score: exp(kNegBig - x) is exactly 0 for every finite
// score x (skv::exp), and no infinity ever enters the arithmetic. One definition for every kernel, so that the files
// can share one translation unit (kernels/cpu/ops.cpp).
constexpr float kNegBig = -3.0e38f;

// bfloat16 as its raw 16 bits: the float with those bits on top.
inline float bf16_to_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bf16_to_float(x); }

#if SPARSEKV_AVX512

struct V16 {
  __m512 v;
};
inline V16 zero() { return {_mm512_setzero_ps()}; }
inline V16 splat(float x) { return {_mm512_set1_ps(x)}; }
inline V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 load(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
// The first n lanes from p, the rest 0 (reads only those n elements).
inline V16 load_n(const float* p, int n) { return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p)}; }
inline V16 load_n(const uint16_t* p, int n) {
  const __m256i h = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline void store(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
// 32 consecutive elements as two V16 (see pair_lane): float32 in order; bfloat16 split into its even- and
// odd-indexed elements by one shift and one mask, with no cross-lane shuffle. The first n (1..32) only in
// load2_n, the rest 0.
inline void load2(const float* p, V16& a, V16& b) { a.v = _mm512_loadu_ps(p), b.v = _mm512_loadu_ps(p + kLanes); }
inline void load2_n(const float* p, int n, V16& a, V16& b) {
  a.v = _mm512_maskz_loadu_ps(static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1), p);
  b.v = _mm512_maskz_loadu_ps(static_cast<__mmask16>(n >= 32 ? 0xFFFFu : n > 16 ? (1u << (n - 16)) - 1 : 0u),
                              p + kLanes);
}
inline void split_bf16(__m512i x, V16& a, V16& b) {
  a.v = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));                              // elements 0, 2, ..., 30
  b.v = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));   // 1, ..., 31
}
inline void load2(const uint16_t* p, V16& a, V16& b) { split_bf16(_mm512_loadu_si512(p), a, b); }
inline void load2_n(const uint16_t* p, int n, V16& a, V16& b) {
  split_bf16(_mm512_maskz_loadu_epi16(static_cast<__mmask32>(n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1), p), a, b);
}
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 add(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 mul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 max(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
// The sum tree (both paths): t_k = (x[4k] + x[4k+2]) + (x[4k+1] + x[4k+3]) per 128-bit lane k, then
// (t_0 + t_2) + (t_1 + t_3). Float addition commutes exactly, so each shuffle-add below keeps that order.
inline float hsum(V16 a) {
  __m512 x = _mm512_add_ps(a.v, _mm512_permute_ps(a.v, _MM_SHUFFLE(1, 0, 3, 2)));   // x0+x2, x1+x3 per lane
  x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));              // t_k
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));        // t0+t2, t1+t3
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(x);
}
inline float hmax(V16 a) { return _mm512_reduce_max_ps(a.v); }       // exact in any order
inline V16 sub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
// The first n lanes of a (n in 0..16), the rest 0.
inline V16 first_n(V16 a, int n) { return {_mm512_maskz_mov_ps(static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1), a.v)}; }
inline void store_n(float* p, V16 a, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1), a.v);
}
// Lanes of a where a >= lo, 0 elsewhere.
inline V16 zero_below(V16 a, V16 test, float lo) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(test.v, _mm512_set1_ps(lo), _CMP_GE_OQ), a.v)};
}
// round-to-nearest-even of |x| < 2^22, through the 1.5 * 2^23 shifter (an add and a subtract), and 2^n
// for the integer-valued float n in [-126, 127] (the exponent field written directly).
inline V16 shift_round(V16 x) {
  const __m512 c = _mm512_set1_ps(12582912.0f);
  return {_mm512_sub_ps(_mm512_add_ps(x.v, c), c)};
}
inline V16 pow2(V16 n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// out[0..3] = hsum(a), hsum(b), hsum(c), hsum(d): one transpose-and-add instead of four reductions.
inline void hsum4(V16 a, V16 b, V16 c, V16 d, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a.v, b.v), _mm512_unpackhi_ps(a.v, b.v));   // per 128-bit lane
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c.v, d.v), _mm512_unpackhi_ps(c.v, d.v));
  const __m512 lo = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
  const __m512 hi = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
  const __m512 s = _mm512_add_ps(lo, hi);                  // each 128-bit lane: partial [a, b, c, d]
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
}
template <typename T>
inline void prefetch_l2(const T* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
// Quantised weight codes (qlinear.cpp), widened exactly: 16 int8 codes; or 16 bytes of 4-bit codes, the
// low nibbles as lanes 0..15 of lo and the high nibbles as lanes 0..15 of hi; or the 2-bit fields of a word.
inline V16 load_i8(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline void load_u4(const uint8_t* p, V16& lo, V16& hi) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo.v = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  hi.v = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
// 16 W-bit fields of one word (W = 1 or 2), field i (bits W i .. W i + W - 1) as lane i.
template <int W>
inline V16 load_fields(uint32_t word) {
  const __m512i shifts = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(W));
  const __m512i f = _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)), shifts);
  return {_mm512_cvtepi32_ps(_mm512_and_si512(f, _mm512_set1_epi32((1 << W) - 1)))};
}

#elif SPARSEKV_AVX2

struct V16 {
  __m256 lo, hi;  // lanes 0..7, 8..15
};
inline V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline V16 load(const uint16_t* p) {
  return {widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
// all-ones in lanes j < n of the ymm holding lanes first .. first + 7
inline __m256i lanes_below(int n, int first) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// The first n lanes from p, the rest 0 (reads only those n elements).
inline V16 load_n(const float* p, int n) {
  return {_mm256_maskload_ps(p, lanes_below(n, 0)), _mm256_maskload_ps(p + 8, lanes_below(n, 8))};
}
inline V16 load_n(const uint16_t* p, int n) {
  uint16_t buf[kLanes] = {};
  std::memcpy(buf, p, sizeof(uint16_t) * (n < kLanes ? n : kLanes));
  return load(buf);
}
inline void store(float* p, V16 a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
// 32 consecutive bfloat16 as two V16, in the AVX-512 path's lane order (pair_lane).
inline void split_bf16(__m256i x, __m256& even, __m256& odd) {
  even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void load2(const uint16_t* p, V16& a, V16& b) {
  split_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), a.lo, b.lo);          // elements 0..15
  split_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)), a.hi, b.hi);     // 16..31
}
inline void load2_n(const uint16_t* p, int n, V16& a, V16& b) {
  uint16_t buf[2 * kLanes] = {};
  std::memcpy(buf, p, sizeof(uint16_t) * (n < 2 * kLanes ? n : 2 * kLanes));
  load2(buf, a, b);
}
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 mul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 max(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 sub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
// The AVX-512 path's sum tree: t_k per 128-bit lane k (lo holds k = 0, 1; hi k = 2, 3), then (t0 + t2) + (t1 + t3).
inline float hsum(V16 a) {
  __m256 x = _mm256_add_ps(a.lo, _mm256_permute_ps(a.lo, _MM_SHUFFLE(1, 0, 3, 2)));
  __m256 y = _mm256_add_ps(a.hi, _mm256_permute_ps(a.hi, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm256_add_ps(x, _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));              // t0 | t1
  y = _mm256_add_ps(y, _mm256_permute_ps(y, _MM_SHUFFLE(2, 3, 0, 1)));              // t2 | t3
  const __m256 s = _mm256_add_ps(x, y);                                             // t0 + t2 | t1 + t3
  return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
}
inline float hmax(V16 a) {                                             // exact in any order
  __m256 m = _mm256_max_ps(a.lo, a.hi);
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  x = _mm_max_ps(x, _mm_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_max_ps(x, _mm_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(x);
}
// The first n lanes of a (n in 0..16), the rest 0.
inline V16 first_n(V16 a, int n) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(lanes_below(n, 0))),
          _mm256_and_ps(a.hi, _mm256_castsi256_ps(lanes_below(n, 8)))};
}
inline void store_n(float* p, V16 a, int n) {
  _mm256_maskstore_ps(p, lanes_below(n, 0), a.lo), _mm256_maskstore_ps(p + 8, lanes_below(n, 8), a.hi);
}
// Lanes of a where test >= lo, 0 elsewhere.
inline V16 zero_below(V16 a, V16 test, float lo) {
  const __m256 l = _mm256_set1_ps(lo);
  return {_mm256_and_ps(a.lo, _mm256_cmp_ps(test.lo, l, _CMP_GE_OQ)),
          _mm256_and_ps(a.hi, _mm256_cmp_ps(test.hi, l, _CMP_GE_OQ))};
}
inline V16 shift_round(V16 x) {
  const __m256 c = _mm256_set1_ps(12582912.0f);
  return {_mm256_sub_ps(_mm256_add_ps(x.lo, c), c), _mm256_sub_ps(_mm256_add_ps(x.hi, c), c)};
}
inline __m256 pow2_8(__m256 n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline V16 pow2(V16 n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
template <typename T>
inline void prefetch_l2(const T* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
inline __m256 widen_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline V16 load_i8(const int8_t* p) { return {widen_i8(p), widen_i8(p + 8)}; }
inline void load_u4(const uint8_t* p, V16& lo, V16& hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i b0 = _mm256_cvtepu8_epi32(b), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
  const __m256i m = _mm256_set1_epi32(15);
  lo.lo = _mm256_cvtepi32_ps(_mm256_and_si256(b0, m)), lo.hi = _mm256_cvtepi32_ps(_mm256_and_si256(b1, m));
  hi.lo = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), hi.hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
}
template <int W>
inline V16 load_fields(uint32_t word) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), w = _mm256_set1_epi32(static_cast<int>(word));
  const __m256i m = _mm256_set1_epi32((1 << W) - 1);
  const __m256i s0 = _mm256_mullo_epi32(iota, _mm256_set1_epi32(W));
  const __m256i s1 = _mm256_add_epi32(s0, _mm256_set1_epi32(8 * W));
  return {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s0), m)),
          _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s1), m))};
}

#else

struct V16 {
  float v[kLanes];
};
inline V16 zero() { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = 0.f; return r; }
inline V16 splat(float x) { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = x; return r; }
template <typename T>
inline V16 load(const T* p) { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = to_float(p[i]); return r; }
template <typename T>
inline V16 load_n(const T* p, int n) { V16 r = zero(); for (int i = 0; i < n; ++i) r.v[i] = to_float(p[i]); return r; }
inline void store(float* p, V16 a) { for (int i = 0; i < kLanes; ++i) p[i] = a.v[i]; }
inline void load2_n(const uint16_t* p, int n, V16& a, V16& b) {       // even- and odd-indexed, as with AVX-512
  a = zero(), b = zero();
  for (int i = 0; i < n; ++i) (i % 2 ? b : a).v[i / 2] = bf16_to_float(p[i]);
}
inline void load2(const uint16_t* p, V16& a, V16& b) { load2_n(p, 2 * kLanes, a, b); }
// One rounding, as _mm512_fmadd_ps (a machine without FMA computes it in software, exactly).
inline V16 fma(V16 a, V16 b, V16 c) { for (int i = 0; i < kLanes; ++i) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]); return c; }
inline V16 add(V16 a, V16 b) { for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i]; return a; }
inline V16 sub(V16 a, V16 b) { for (int i = 0; i < kLanes; ++i) a.v[i] -= b.v[i]; return a; }
inline V16 mul(V16 a, V16 b) { for (int i = 0; i < kLanes; ++i) a.v[i] *= b.v[i]; return a; }
inline V16 max(V16 a, V16 b) { for (int i = 0; i < kLanes; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
// The sum tree of the AVX-512 path, written out.
inline float hsum(V16 a) {
  float t[4];
  for (int k = 0; k < 4; ++k) t[k] = (a.v[4 * k] + a.v[4 * k + 2]) + (a.v[4 * k + 1] + a.v[4 * k + 3]);
  return (t[0] + t[2]) + (t[1] + t[3]);
}
inline float hmax(V16 a) { float m = a.v[0]; for (int i = 1; i < kLanes; ++i) m = a.v[i] > m ? a.v[i] : m; return m; }
inline V16 first_n(V16 a, int n) { for (int i = n < 0 ? 0 : n; i < kLanes; ++i) a.v[i] = 0.f; return a; }
inline void store_n(float* p, V16 a, int n) { for (int i = 0; i < n && i < kLanes; ++i) p[i] = a.v[i]; }
inline V16 zero_below(V16 a, V16 test, float lo) { for (int i = 0; i < kLanes; ++i) a.v[i] = test.v[i] >= lo ? a.v[i] : 0.f; return a; }
inline V16 shift_round(V16 x) {
  for (int i = 0; i < kLanes; ++i) {
    x.v[i] = (x.v[i] + 12582912.0f) - 12582912.0f;     // two roundings: no -ffast-math folds them
  }
  return x;
}
inline V16 pow2(V16 n) {
  V16 r;
  for (int i = 0; i < kLanes; ++i) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n.v[i]) + 127) << 23;
    std::memcpy(&r.v[i], &bits, sizeof(float));
  }
  return r;
}
template <typename T>
inline void prefetch_l2(const T* p) { __builtin_prefetch(p, 0, 2); }
inline V16 load_i8(const int8_t* p) { V16 r; for (int i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(p[i]); return r; }
inline void load_u4(const uint8_t* p, V16& lo, V16& hi) {
  for (int i = 0; i < kLanes; ++i) lo.v[i] = static_cast<float>(p[i] & 15), hi.v[i] = static_cast<float>(p[i] >> 4);
}
template <int W>
inline V16 load_fields(uint32_t word) {
  V16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>((word >> (W * i)) & ((1u << W) - 1));
  return r;
}

#endif

#if !SPARSEKV_AVX512
// 32 consecutive float32 as two V16 (lanes 0..15, 16..31: the AVX-512 path's order for float32); load2_n reads
// only the first n, the rest 0.
inline void load2_n(const float* p, int n, V16& a, V16& b) {
  a = load_n(p, n < kLanes ? n : kLanes), b = n > kLanes ? load_n(p + kLanes, n - kLanes) : zero();
}
inline void load2(const float* p, V16& a, V16& b) { load2_n(p, 2 * kLanes, a, b); }
// Four sums, each in hsum's order (the AVX-512 path computes the same four with shared shuffles).
inline void hsum4(V16 a, V16 b, V16 c, V16 d, float* out) { out[0] = hsum(a), out[1] = hsum(b), out[2] = hsum(c), out[3] = hsum(d); }
#endif

// exp(x) for float32 lanes, the same bits on every path: x = n ln2 + r with n = round(x log2 e) and |r| <=
// ln2 / 2 (ln2 split in two for an exact product), exp(r) by Cephes' degree-6 polynomial (about 1 ulp), times
// 2^n. Inputs are clamped to [-87.3, 88.7]; below -87.3 (a score far under the maximum, or the kNegBig
// sentinel) the result is exactly 0.
inline V16 exp(V16 x) {
  const V16 lo = splat(-87.3f);
  const V16 xc = max(x, lo), c = splat(88.7f);
  V16 y = sub(xc, max(sub(xc, c), zero()));                  // min(x, 88.7) in the ops above
  const V16 n = shift_round(mul(y, splat(1.44269504088896341f)));
  V16 r = fma(n, splat(-0.693359375f), y);
  r = fma(n, splat(2.12194440e-4f), r);
  V16 p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  const V16 e = add(fma(p, mul(r, r), r), splat(1.f));
  return zero_below(mul(e, pow2(n)), x, -87.3f);
}
// The same exp for one float (a lane of `exp`, bit for bit).
inline float exp1(float x) {
  float buf[kLanes] = {x};
  store(buf, exp(load(buf)));
  return buf[0];
}
// sum of exp(s[r] - mx) over r < n, each term written back into s (the softmax numerator in place), the
// terms accumulated in lanes and reduced by hsum: one order on every path.
inline float exp_sum(float* s, int64_t n, float mx) {
  const V16 m = splat(mx);
  V16 acc = zero();
  int64_t r = 0;
  for (; r + kLanes <= n; r += kLanes) {
    const V16 e = exp(sub(load(s + r), m));
    store(s + r, e);
    acc = add(acc, e);
  }
  if (r < n) {
    const int rest = static_cast<int>(n - r);
    const V16 e = first_n(exp(sub(load_n(s + r, rest), m)), rest);
    store_n(s + r, e, rest);
    acc = add(acc, e);
  }
  return hsum(acc);
}
// max of s[r] over r < n (at least -3e38).
inline float max_of(const float* s, int64_t n, float init) {
  V16 acc = splat(init);
  int64_t r = 0;
  for (; r + kLanes <= n; r += kLanes) acc = max(acc, load(s + r));
  float m = hmax(acc);
  for (; r < n; ++r) m = s[r] > m ? s[r] : m;
  return m;
}

// Where lane i (0..31) of a load2 pair comes from in its 32 elements: the identity for float32, even
// then odd elements for bfloat16. Vectors multiplied with such pairs (queries, accumulators) are laid
// out in the same order.
template <typename T>
constexpr int pair_lane(int i) {
  if constexpr (sizeof(T) == 2) return i < kLanes ? 2 * i : 2 * (i - kLanes) + 1;
  else return i;
}

// Where lane x of a zero-padded row of pairs (x = 32 * pair + lane) comes from in the natural row: how a
// query is laid out for, and an accumulator read back from, pair loads of T.
template <typename T>
constexpr int64_t pair_index(int64_t x) {
  return x / (2 * kLanes) * 2 * kLanes + pair_lane<T>(static_cast<int>(x % (2 * kLanes)));
}

// Query heads whose accumulators share one pass over a row (kernels dispatch 1..4 at compile time).
constexpr int kHeadsPerPass = 4;

// Pair pc of a row of D elements, for P = ceil(D / 32) pairs; the last holds D - 32 (P - 1) elements.
template <typename T>
inline void load_pair(const T* row, int64_t pc, int64_t P, int last, V16& a, V16& b) {
  if (pc + 1 < P || last == 2 * kLanes) load2(row + pc * 2 * kLanes, a, b);
  else load2_n(row + pc * 2 * kLanes, last, a, b);
}

// The i-th 16-lane chunk of a row of D elements: full chunks load 16, the last one n = D % 16.
template <typename T>
inline V16 load_chunk(const T* row, int64_t c, int64_t full, int tail) {
  return c < full ? load(row + c * kLanes) : load_n(row + c * kLanes, tail);
}

}  // namespace skv
