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
// The same bits at any thread count and for any instruction set (simd.h's rules).
//
// qdequant writes W as float32 [N, K] with the same fma.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

template <int M, int Bits>
void rows(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t pairs = w.K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* r = w.codes + n * w.row_bytes;
    V16 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int a = 0; a < 4; ++a) acc[m][a] = skv::zero();
    for (int64_t p = 0; p < pairs; ++p) {
      V16 w0, w1;
      pair_weights<Bits>(w, n, r, p, w0, w1);
      const int a = static_cast<int>((2 * p) & 3);          // chunks 2p, 2p+1 -> accumulators a, a+1
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + p * 32;
        acc[m][a] = skv::fma(w0, skv::load(xm), acc[m][a]);
        acc[m][a + 1] = skv::fma(w1, skv::load(xm + kLanes), acc[m][a + 1]);
      }
    }
    for (int m = 0; m < M; ++m)
      y[m * ldy + n] = skv::hsum(skv::add(skv::add(acc[m][0], acc[m][1]), skv::add(acc[m][2], acc[m][3])));
  }
}

// rows<M, Bits> for a runtime bits (one switch per call, outside every loop).
template <int M>
void rows_for(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  switch (w.bits) {
    case 4: rows<M, 4>(w, x, ldx, y, ldy, n0, n1); break;
    case 5: rows<M, 5>(w, x, ldx, y, ldy, n0, n1); break;
    case 6: rows<M, 6>(w, x, ldx, y, ldy, n0, n1); break;
    default: rows<M, 8>(w, x, ldx, y, ldy, n0, n1); break;
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

Table table(const at::Tensor& t, const char* name, int64_t N, int64_t K, int64_t group) {
  Table tab;
  tab.groups = K / group;
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.size(0) == N,
              "qlinear: ", name, " must be a contiguous 2-D tensor with N = ", N, " rows");
  if (t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf) {
    TORCH_CHECK(t.size(1) == tab.groups, "qlinear: a float32 or float16 ", name, " must be [N, K / group] = [", N,
                ", ", tab.groups, "], got ", t.sizes());
    if (t.scalar_type() == at::kFloat) tab.plain = t.data_ptr<float>();
    else tab.half = reinterpret_cast<const uint16_t*>(t.data_ptr());
    tab.row = tab.groups;
    return tab;
  }
  TORCH_CHECK(t.scalar_type() == at::kByte, "qlinear: ", name,
              " must be float32 (plain), float16 (half) or uint8 (factored), got ", t.scalar_type());
  TORCH_CHECK(K % 256 == 0, "qlinear: a factored ", name, " needs K a multiple of 256, got ", K);
  TORCH_CHECK(t.size(1) == tab.groups + 4 * (K / 256), "qlinear: a factored ", name,
              " must be uint8 [N, K / group + 4 K / 256] = [", N, ", ", tab.groups + 4 * (K / 256), "], got ",
              t.sizes());
  tab.bytes = static_cast<const uint8_t*>(t.data_ptr()), tab.row = t.size(1), tab.per_super = 256 / group;
  return tab;
}

QWeight check(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
              int64_t group) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "qlinear: bits must be 4, 5, 6 or 8, got ", bits);
  TORCH_CHECK(group == 32 || (bits >= 6 && group == 16), "qlinear: group must be 32 (or 16 with 6 or 8 bits), got ",
              group);
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous(), "qlinear: codes must be a contiguous [N, K'] tensor");
  TORCH_CHECK(codes.scalar_type() == (bits == 8 ? at::kChar : at::kByte), "qlinear: codes must be ",
              bits == 8 ? "int8" : "uint8", ", got ", codes.scalar_type());
  const int64_t N = codes.size(0), row = codes.size(1);
  const int64_t K = bits == 4 ? row * 2 : bits == 5 ? row * 8 / 5 : bits == 6 ? row * 4 / 3 : row;
  TORCH_CHECK(K % 32 == 0 && K * bits == row * 8, "qlinear: K must be a multiple of 32, got codes ", codes.sizes(),
              " for ", bits, " bits");
  QWeight w{static_cast<const uint8_t*>(codes.data_ptr()), table(scale, "scale", N, K, group), Table{}, N, K, row,
            static_cast<int>(bits), static_cast<int>(group)};
  if (offset.numel() > 0) w.offset = table(offset, "offset", N, K, group);
  return w;
}

}  // namespace

at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group) {
  const QWeight w = check(codes, scale, offset, bits, group);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == w.K,
              "qlinear: x must be float32 [M, K] with K = ", w.K);
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
