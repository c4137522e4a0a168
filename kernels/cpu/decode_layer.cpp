// One decoder layer of a decode step (one sequence, one new token) in one call, so that a step's per-layer work
// leaves Python: sparsekv/model/fused.py calls it once per layer with arguments laid out once per engine.
//
//   h = norm_in(x)                                        RMSNorm: x / sqrt(mean(x^2) + eps) * (offset + w)
//   q, k, v = qlinear(h)                                  q [Hq, D], k, v [H, D] (one fused projection or three)
//   q, k = qk_norm(q), qk_norm(k)                         per head, when the layer has one (Gemma 3)
//   q, k = rope(q), rope(k)                               HF's rotate-half with the step's cos, sin [D]
//   q = q * q_gain                                        when the model scales queries (Gemma 3)
//   K[h, block, row], V[h, block, row] = k, v             the store's pool, in its dtype (float32 or bf16, nearest)
//   summaries[s][h, block] extended by the stored row     kmin (min, rounded down) / kmax (max, rounded up)
//   blocks = route_topk(q, kmin, kmax) or as given        route.cpp's minmax routing, or every block (dense)
//   o = paged_decode(q, K, V, table, blocks)              paged_decode.cpp
//   prenorm   x = x + o_proj(o);  x = x + mlp(norm_post(x))
//   sandwich  x = x + norm_post(o_proj(o));  x = x + norm_post_ff(mlp(norm_pre_ff(x)))
//   mlp(h) = down(act(gate h) * up h), act silu or tanh-GELU
//
// Every step is what sparsekv/model/model.py computes (Attention.qkv, Attention.step, DecoderLayer.residual) and
// what BlockStore.write stores (codec.write, then each summary's `extend` and `cast`), in float32, with these
// choices of its own: the norm's sum of squares in float64, one loop order; exp from simd.h. With
// -ffp-contract=off every operation is IEEE, so the result is the same bits for any instruction set and thread
// count (qlinear and paged_decode keep the same promise).
//
// Arguments (fused.py builds them; every one is checked before anything is computed or written: checks.h):
//   x       [1, dim] float32
//   w       norm weights, then linears: [norm_in [dim], norm_post [dim], norm_pre_ff [dim] | empty, norm_post_ff
//           [dim] | empty (both given with sandwich 1, both empty with 0), q_norm [D] | empty, k_norm [D] | empty]
//           + for each linear (codes, scale, offset): the qkv parts (1 or 3), o, the gate/up parts (1 or 2), down,
//           each of the shape its place needs (qkv [(Hq + 2 H) D, dim], o [dim, Hq D], gate_up [2 I, dim], down
//           [dim, I])
//   meta    [Hq, H, D, n_qkv, n_gu, sandwich (0 or 1), act (0 silu, 1 gelu_tanh), then (bits, group, int8) per
//           linear; int8 1: its input quantised to int8 per 32 values first (qlinear_q8), 0: float32 (qlinear)]
//   fmeta   [eps, norm offset, q_gain (0: none)]
//   k, v    the layer's pool [H, NB, bs, D] contiguous, float32 or bfloat16 (written at [h, block, row], block in
//           [0, NB), row in [0, bs))
//   sums    the summaries the store keeps, each [H, NB, D] contiguous float32 or bfloat16; kinds: 0 kmin, 1 kmax
//   table   [nb] int64 physical block of each logical block, in [0, NB); blocks [H, K] int64 in [-1, nb) (read
//           when route_kind is -1); num_tokens, min_token, splits as paged_decode takes them
//   route_kind  -1: attend `blocks`; 0: minmax routing over sums of kinds 0 and 1 (top_k, sink, local)
// Returns {x' [1, dim] float32, the routed selection [H, K] int64 (empty when route_kind < 0)}.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "checks.h"
#include "simd.h"

at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group);
at::Tensor qlinear_q8(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                      int64_t group);
std::vector<at::Tensor> paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                        at::Tensor blocks, int64_t num_tokens, int64_t splits, int64_t min_token);
std::vector<at::Tensor> route_topk(at::Tensor q, at::Tensor a, at::Tensor b, at::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local);

namespace {

constexpr int kNorms = 6;         // norm slots at the head of `w`
constexpr int kMetaFixed = 7;     // meta entries before the per-linear (bits, group, int8)
constexpr int kMetaLinear = 3;    // meta entries per linear

struct Linear {
  at::Tensor codes, scale, offset;
  int64_t bits, group, int8;
  at::Tensor operator()(const at::Tensor& x) const {
    return int8 ? qlinear_q8(x, codes, scale, offset, bits, group) : qlinear(x, codes, scale, offset, bits, group);
  }
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * (offset + w[i]); out may alias x.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps, float offset) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * (offset + w[i]);
}

// HF's rotate-half, in place on one head: x*cos + rot(x)*sin with rot = (-x[h:], x[:h]).
void rope(float* x, const float* cos, const float* sin, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] + (-b) * sin[i];
    x[i + h] = b * cos[i + h] + a * sin[i + h];
  }
}

// e[i] = exp(min(x[i], 88)) with simd.h's exp (one algorithm on every instruction set).
void exp_clamped(const float* x, float* e, int64_t n) {
  float buf[skv::kLanes];
  for (int64_t i = 0; i < n; i += skv::kLanes) {
    const int m = static_cast<int>(std::min<int64_t>(skv::kLanes, n - i));
    for (int j = 0; j < skv::kLanes; ++j) buf[j] = j < m ? std::min(x[i + j], 88.0f) : 0.0f;
    skv::store(buf, skv::exp(skv::load(buf)));
    std::memcpy(e + i, buf, m * sizeof(float));
  }
}

// gate[i] = act(gate[i]) * up[i]: silu(g) = g / (1 + e^-g); tanh-GELU 0.5 g (1 + tanh(c (g + 0.044715 g^3))),
// tanh(z) = 1 - 2 / (1 + e^{2z}).
void gated(float* gate, const float* up, int64_t n, int64_t act) {
  std::vector<float> t(n), e(n);
  const float c = 0.7978845608028654f;                        // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    t[i] = act == 0 ? -g : 2.0f * (c * (g + 0.044715f * g * g * g));
  }
  exp_clamped(t.data(), e.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float a = act == 0 ? g / (1.0f + e[i]) : 0.5f * g * (1.0f + (1.0f - 2.0f / (1.0f + e[i])));
    gate[i] = a * up[i];
  }
}

// bfloat16 `x` rounded to nearest (as torch's .to(bfloat16)), then moved one step down (dir < 0) or up (dir > 0)
// where that rounding went the wrong way: summaries.cast's directed rounding.
uint16_t bf16_directed(float x, int dir) {
  const uint16_t y = c10::BFloat16(x).x;
  const float yf = skv::bf16_to_float(y);
  if (dir == 0 || std::isnan(x) || (dir < 0 ? !(yf > x) : !(yf < x))) return y;
  // nextafter(y, -inf) / nextafter(y, +inf) on the bit pattern (y finite here: x is finite and yf overshot it)
  const bool neg = (y & 0x8000) != 0, zero = (y & 0x7fff) == 0;
  if (zero) return dir < 0 ? 0x8001 : 0x0001;
  return (dir < 0) == neg ? static_cast<uint16_t>(y + 1) : static_cast<uint16_t>(y - 1);
}

// min (dir < 0) or max of a stored summary and a new row value, a NaN in either giving NaN (torch.minimum's rule)
inline float extend(float old, float r, int dir) {
  if (std::isnan(old) || std::isnan(r)) return std::numeric_limits<float>::quiet_NaN();
  return dir < 0 ? std::min(old, r) : std::max(old, r);
}

void check_pool(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 4 && t.is_contiguous(), "decode_layer: ", name,
                    " must be a contiguous [H, NB, bs, D] pool, got shape ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, "decode_layer: ", name,
                   " must be float32 or bfloat16, got ", t.scalar_type());
}

// Norm weight slot i of `w`: contiguous float32 [n], or empty where `optional` (a layer without that norm).
void check_norm(const at::Tensor& t, int i, int64_t n, bool optional) {
  if (optional && t.numel() == 0) return;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "decode_layer: norm weight w[", i, "] must be float32, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() == n && t.is_contiguous(), "decode_layer: norm weight w[", i,
                    "] must be a contiguous [", n, "]", optional ? " (or empty)" : "", ", got shape ", t.sizes());
}

// The weight of linear j of a layer must be [N, K]: its codes give (got.first, got.second).
void check_linear_shape(int64_t j, const std::pair<int64_t, int64_t>& got, int64_t N, int64_t K, const char* what) {
  TORCH_CHECK_VALUE(got.first == N && got.second == K, "decode_layer: linear ", j, " (", what, ") must be [N, K] = [",
                    N, ", ", K, "], got [", got.first, ", ", got.second, "]");
}

}  // namespace

std::vector<at::Tensor> decode_layer(at::Tensor x, std::vector<at::Tensor> w, std::vector<int64_t> meta,
                                     std::vector<double> fmeta, at::Tensor cos, at::Tensor sin, at::Tensor k_pool,
                                     at::Tensor v_pool, std::vector<at::Tensor> sums, std::vector<int64_t> kinds,
                                     at::Tensor table, at::Tensor blocks, int64_t block, int64_t row,
                                     int64_t num_tokens, int64_t min_token, int64_t splits, int64_t route_kind,
                                     int64_t top_k, int64_t sink, int64_t local) {
  // -- every argument checked before anything is computed or written (checks.h) --
  TORCH_CHECK_VALUE(meta.size() >= kMetaFixed && fmeta.size() == 3, "decode_layer: meta must hold at least ",
                    kMetaFixed, " entries and fmeta 3, got ", meta.size(), " and ", fmeta.size());
  const int64_t Hq = meta[0], H = meta[1], D = meta[2], n_qkv = meta[3], n_gu = meta[4], sandwich = meta[5],
                act = meta[6];
  TORCH_CHECK_VALUE((n_qkv == 1 || n_qkv == 3) && (n_gu == 1 || n_gu == 2) && (act == 0 || act == 1) &&
                        (sandwich == 0 || sandwich == 1),
                    "decode_layer: n_qkv must be 1 or 3, n_gu 1 or 2, sandwich 0 or 1 and act 0 or 1, got ", n_qkv,
                    ", ", n_gu, ", ", sandwich, ", ", act);
  const int64_t n_lin = n_qkv + 1 + n_gu + 1;
  TORCH_CHECK_VALUE(static_cast<int64_t>(meta.size()) == kMetaFixed + kMetaLinear * n_lin &&
                        static_cast<int64_t>(w.size()) == kNorms + 3 * n_lin,
                    "decode_layer: w must hold ", kNorms + 3 * n_lin, " tensors and meta ",
                    kMetaFixed + kMetaLinear * n_lin, " entries, got ", w.size(), " and ", meta.size());
  TORCH_CHECK_VALUE(Hq >= 1 && H >= 1 && D >= 1 && Hq % H == 0,
                    "decode_layer: meta's Hq, H, D must be >= 1 with Hq a multiple of H, got ", Hq, ", ", H, ", ", D);
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) == 1 && x.size(1) >= 1 && x.is_contiguous(),
                    "decode_layer: x must be a contiguous [1, dim] tensor, got shape ", x.sizes());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "decode_layer: x must be float32, got ", x.scalar_type());
  const int64_t dim = x.size(1);
  TORCH_CHECK_TYPE(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
                   "decode_layer: cos and sin must be float32, got ", cos.scalar_type(), " and ", sin.scalar_type());
  TORCH_CHECK_VALUE(cos.numel() == D && sin.numel() == D && cos.is_contiguous() && sin.is_contiguous(),
                    "decode_layer: cos and sin must be contiguous [D] with D = ", D, ", got shapes ", cos.sizes(),
                    " and ", sin.sizes());
  check_pool(k_pool, "k");
  check_pool(v_pool, "v");
  TORCH_CHECK_TYPE(k_pool.scalar_type() == v_pool.scalar_type(), "decode_layer: k and v must have one dtype, got ",
                   k_pool.scalar_type(), " and ", v_pool.scalar_type());
  TORCH_CHECK_VALUE(k_pool.sizes() == v_pool.sizes() && k_pool.size(0) == H && k_pool.size(3) == D &&
                        k_pool.size(1) >= 1 && k_pool.size(2) >= 1,
                    "decode_layer: k and v must both be [H, NB, bs, D] with H = ", H, ", D = ", D,
                    " and NB, bs >= 1, got ", k_pool.sizes(), " and ", v_pool.sizes());
  const int64_t NB = k_pool.size(1), bs = k_pool.size(2);
  TORCH_CHECK_VALUE(block >= 0 && block < NB && row >= 0 && row < bs, "decode_layer: block must be in [0, NB = ", NB,
                    ") and row in [0, bs = ", bs, "), got ", block, " and ", row);
  TORCH_CHECK_VALUE(sums.size() == kinds.size(), "decode_layer: one kind per summary, got ", sums.size(),
                    " summaries and ", kinds.size(), " kinds");
  const at::Tensor* kmin = nullptr;
  const at::Tensor* kmax = nullptr;
  for (size_t i = 0; i < sums.size(); ++i) {
    const at::Tensor& t = sums[i];
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, "decode_layer: summary ", i,
                     " must be float32 or bfloat16, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 3 && t.is_contiguous() && t.size(0) == H && t.size(1) == NB && t.size(2) == D,
                      "decode_layer: summary ", i, " must be a contiguous [H, NB, D] = [", H, ", ", NB, ", ", D,
                      "], got ", t.sizes());
    TORCH_CHECK_VALUE(kinds[i] == 0 || kinds[i] == 1, "decode_layer: summary kinds must be 0 (kmin) or 1 (kmax), got ",
                      kinds[i]);
    (kinds[i] == 0 ? kmin : kmax) = &t;
  }
  for (int i = 0; i < kNorms; ++i)          // input, post-attention, pre-/post-MLP (sandwich), q and k norms
    check_norm(w[i], i, i < 4 ? dim : D, i >= 4 || (i >= 2 && !sandwich));
  TORCH_CHECK_VALUE(sandwich || (w[2].numel() == 0 && w[3].numel() == 0),
                    "decode_layer: a prenorm layer (sandwich 0) must leave w[2] and w[3] empty");
  std::vector<Linear> lin;
  std::vector<std::pair<int64_t, int64_t>> nk;          // each linear's (N, K)
  for (int64_t j = 0; j < n_lin; ++j) {
    const int64_t* m = meta.data() + kMetaFixed + kMetaLinear * j;
    TORCH_CHECK_VALUE(m[2] == 0 || m[2] == 1, "decode_layer: linear ", j, "'s int8 flag (meta[",
                      kMetaFixed + kMetaLinear * j + 2, "]) must be 0 or 1, got ", m[2]);
    try {                                          // qlinear's own checks, the linear named in their message
      nk.push_back(check_qlinear(w[kNorms + 3 * j], w[kNorms + 3 * j + 1], w[kNorms + 3 * j + 2], m[0], m[1], m[2]));
    } catch (const c10::TypeError& e) {
      TORCH_CHECK_TYPE(false, "decode_layer: linear ", j, " (w[", kNorms + 3 * j, "..", kNorms + 3 * j + 2, "]): ",
                       e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      TORCH_CHECK_VALUE(false, "decode_layer: linear ", j, " (w[", kNorms + 3 * j, "..", kNorms + 3 * j + 2, "]): ",
                        e.what_without_backtrace());
    }
    lin.push_back({w[kNorms + 3 * j], w[kNorms + 3 * j + 1], w[kNorms + 3 * j + 2], m[0], m[1], m[2]});
  }
  // q's rows from the first projection's N (a division: a huge Hq in meta cannot overflow Hq * D), then the chain
  const int64_t q_rows = nk[0].first % D ? -1 : nk[0].first / D - (n_qkv == 1 ? 2 * H : 0);
  TORCH_CHECK_VALUE(q_rows == Hq, "decode_layer: the ", n_qkv == 1 ? "qkv" : "q", " projection must give ",
                    n_qkv == 1 ? "(Hq + 2 H) D" : "Hq D", " outputs with Hq = ", Hq, ", H = ", H, ", D = ", D,
                    ", got ", nk[0].first);
  check_linear_shape(0, nk[0], nk[0].first, dim, n_qkv == 1 ? "qkv" : "q");
  if (n_qkv == 3) check_linear_shape(1, nk[1], H * D, dim, "k"), check_linear_shape(2, nk[2], H * D, dim, "v");
  check_linear_shape(n_qkv, nk[n_qkv], dim, Hq * D, "o");
  const int64_t g0 = n_qkv + 1;                                    // gate (and up), then down
  const int64_t I = n_gu == 1 ? nk[g0].first / 2 : nk[g0].first;
  if (n_gu == 1) {
    TORCH_CHECK_VALUE(nk[g0].first % 2 == 0, "decode_layer: the fused gate/up projection must give an even width, "
                      "got ", nk[g0].first);
    check_linear_shape(g0, nk[g0], 2 * I, dim, "gate_up");
  } else {
    check_linear_shape(g0, nk[g0], I, dim, "gate"), check_linear_shape(g0 + 1, nk[g0 + 1], I, dim, "up");
  }
  check_linear_shape(g0 + n_gu, nk[g0 + n_gu], dim, I, "down");
  TORCH_CHECK_VALUE(route_kind == -1 || route_kind == 0,
                    "decode_layer: route_kind must be -1 (attend blocks) or 0 (minmax routing), got ", route_kind);
  if (route_kind == 0) {
    TORCH_CHECK_VALUE(kmin != nullptr && kmax != nullptr,
                      "decode_layer: minmax routing (route_kind 0) needs the kmin and kmax summaries");
    check_route_args(0, top_k, sink, local, "decode_layer");
  }
  const float eps = static_cast<float>(fmeta[0]), noff = static_cast<float>(fmeta[1]),
              gain = static_cast<float>(fmeta[2]);
  const float* xp = x.data_ptr<float>();

  // attention input and projections
  at::Tensor h = at::empty({1, dim}, x.options());
  rms_norm(xp, w[0].data_ptr<float>(), h.data_ptr<float>(), dim, eps, noff);
  at::Tensor q = at::empty({Hq, D}, x.options());
  std::vector<float> k(H * D), v(H * D);
  if (n_qkv == 1) {
    const at::Tensor y = lin[0](h);
    const float* yp = y.data_ptr<float>();
    std::memcpy(q.data_ptr<float>(), yp, Hq * D * sizeof(float));
    std::memcpy(k.data(), yp + Hq * D, H * D * sizeof(float));
    std::memcpy(v.data(), yp + (Hq + H) * D, H * D * sizeof(float));
  } else {
    const at::Tensor yq = lin[0](h), yk = lin[1](h), yv = lin[2](h);
    std::memcpy(q.data_ptr<float>(), yq.data_ptr<float>(), Hq * D * sizeof(float));
    std::memcpy(k.data(), yk.data_ptr<float>(), H * D * sizeof(float));
    std::memcpy(v.data(), yv.data_ptr<float>(), H * D * sizeof(float));
  }
  float* qp = q.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  for (int64_t i = 0; i < Hq; ++i) {
    if (w[4].numel()) rms_norm(qp + i * D, w[4].data_ptr<float>(), qp + i * D, D, eps, noff);
    rope(qp + i * D, cp, sp, D);
    if (gain != 0.0f)
      for (int64_t d = 0; d < D; ++d) qp[i * D + d] = qp[i * D + d] * gain;
  }
  for (int64_t i = 0; i < H; ++i) {
    if (w[5].numel()) rms_norm(k.data() + i * D, w[5].data_ptr<float>(), k.data() + i * D, D, eps, noff);
    rope(k.data() + i * D, cp, sp, D);
  }

  // the attention's arguments, checked as paged_decode and route_topk check them, before the store is written
  check_paged_decode(q, k_pool, v_pool, table, num_tokens, splits, min_token, "decode_layer");
  if (route_kind == 0) check_summaries(q, *kmin, *kmax, table, "decode_layer");
  else check_blocks(blocks, H, table.numel(), "decode_layer");

  // the store: K and V rows in the pool's dtype, then each summary extended by the row as stored
  const bool bf = k_pool.scalar_type() == at::kBFloat16;
  std::vector<float> stored(H * D);
  for (int64_t i = 0; i < H; ++i) {
    const int64_t at_row = ((i * NB + block) * bs + row) * D;
    for (int64_t d = 0; d < D; ++d) {
      if (bf) {
        const c10::BFloat16 kb(k[i * D + d]), vb(v[i * D + d]);
        k_pool.data_ptr<at::BFloat16>()[at_row + d] = kb;
        v_pool.data_ptr<at::BFloat16>()[at_row + d] = vb;
        stored[i * D + d] = static_cast<float>(kb);
      } else {
        k_pool.data_ptr<float>()[at_row + d] = k[i * D + d];
        v_pool.data_ptr<float>()[at_row + d] = v[i * D + d];
        stored[i * D + d] = k[i * D + d];
      }
    }
  }
  for (size_t s = 0; s < sums.size(); ++s) {
    const int dir = kinds[s] == 0 ? -1 : 1;
    const bool sbf = sums[s].scalar_type() == at::kBFloat16;
    for (int64_t i = 0; i < H; ++i) {
      const int64_t at_sum = (i * NB + block) * D;
      for (int64_t d = 0; d < D; ++d) {
        const float r = stored[i * D + d];
        if (sbf) {
          uint16_t* p = reinterpret_cast<uint16_t*>(sums[s].data_ptr<at::BFloat16>()) + at_sum + d;
          const float old = skv::bf16_to_float(*p);
          *p = bf16_directed(row == 0 ? r : extend(old, r, dir), dir);
        } else {
          float* p = sums[s].data_ptr<float>() + at_sum + d;
          *p = row == 0 ? r : extend(*p, r, dir);
        }
      }
    }
  }

  // attention over every block or the routed ones
  at::Tensor sel = at::empty({0}, at::TensorOptions().dtype(at::kLong));   // returned: the routed selection, else empty
  if (route_kind == 0) sel = route_topk(q, *kmin, *kmax, table, 0, top_k, sink, local)[0];
  const at::Tensor o = paged_decode(q, k_pool, v_pool, table, route_kind == 0 ? sel : blocks, num_tokens, splits,
                                    min_token)[0];
  at::Tensor y = lin[n_qkv](o.reshape({1, Hq * D}));

  // residual and MLP
  at::Tensor out = at::empty({1, dim}, x.options());
  float* op = out.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (sandwich) rms_norm(yp, w[1].data_ptr<float>(), yp, dim, eps, noff);
  for (int64_t i = 0; i < dim; ++i) op[i] = xp[i] + yp[i];
  rms_norm(op, w[sandwich ? 2 : 1].data_ptr<float>(), h.data_ptr<float>(), dim, eps, noff);
  at::Tensor gate, up;
  if (n_gu == 1) {
    const at::Tensor gu = lin[g0](h);
    gate = gu.narrow(1, 0, I).contiguous(), up = gu.narrow(1, I, I).contiguous();
  } else {
    gate = lin[g0](h), up = lin[g0 + 1](h);
  }
  gated(gate.data_ptr<float>(), up.data_ptr<float>(), gate.size(1), act);
  at::Tensor m = lin[g0 + n_gu](gate);
  float* mp = m.data_ptr<float>();
  if (sandwich) rms_norm(mp, w[3].data_ptr<float>(), mp, dim, eps, noff);
  for (int64_t i = 0; i < dim; ++i) op[i] = op[i] + mp[i];
  return {out, sel};
}
