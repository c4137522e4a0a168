// The operators of the CPU extension, registered once with torch.library as torch.ops.sparsekv_cpu.*.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

std::vector<at::Tensor> paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                        at::Tensor blocks, int64_t num_tokens, int64_t splits, int64_t min_token);
at::Tensor minmax_scores(at::Tensor q, at::Tensor kmin, at::Tensor kmax, at::Tensor table);
std::vector<at::Tensor> route_topk(at::Tensor q, at::Tensor a, at::Tensor b, at::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local);
at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group);
at::Tensor qlinear_q8(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                      int64_t group);
std::vector<at::Tensor> quantize_q8_rows(at::Tensor x);
at::Tensor qdequant(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits, int64_t group);
std::vector<at::Tensor> decode_layer(at::Tensor x, std::vector<at::Tensor> w, std::vector<int64_t> meta,
                                     std::vector<double> fmeta, at::Tensor cos, at::Tensor sin, at::Tensor k_pool,
                                     at::Tensor v_pool, std::vector<at::Tensor> sums, std::vector<int64_t> kinds,
                                     at::Tensor table, at::Tensor blocks, int64_t block, int64_t row,
                                     int64_t num_tokens, int64_t min_token, int64_t splits, int64_t route_kind,
                                     int64_t top_k, int64_t sink, int64_t local);
bool bf16_prefill_available();
at::Tensor prefill_attn_bf16(at::Tensor q, at::Tensor k, at::Tensor v, int64_t q0, int64_t k0, int64_t window,
                             double scale);
bool f32_prefill_vectorized();
at::Tensor prefill_attn_f32(at::Tensor q, at::Tensor k, at::Tensor v, int64_t q0, int64_t k0, int64_t window,
                            double scale);

TORCH_LIBRARY(sparsekv_cpu, lib) {
  lib.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor table, Tensor blocks, int num_tokens, int splits, "
          "int min_token=0) -> Tensor[]");
  lib.def("minmax_scores(Tensor q, Tensor kmin, Tensor kmax, Tensor table) -> Tensor");
  lib.def("route_topk(Tensor q, Tensor a, Tensor b, Tensor table, int kind, int top_k, int sink, int local) "
          "-> Tensor[]");
  lib.def("qlinear(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, int group) -> Tensor");
  lib.def("qlinear_q8(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, int group) -> Tensor");
  lib.def("quantize_q8(Tensor x) -> Tensor[]");
  lib.def("qdequant(Tensor codes, Tensor scale, Tensor offset, int bits, int group) -> Tensor");
  lib.def("prefill_attn_bf16(Tensor q, Tensor k, Tensor v, int q0, int k0, int window, float scale) -> Tensor");
  lib.def("bf16_prefill_available() -> bool", &bf16_prefill_available);   // how it was built
  lib.def("prefill_attn_f32(Tensor q, Tensor k, Tensor v, int q0, int k0, int window, float scale) -> Tensor");
  lib.def("f32_prefill_vectorized() -> bool", &f32_prefill_vectorized);   // AVX2 + FMA or AVX-512
  lib.def("decode_layer(Tensor x, Tensor[] w, int[] meta, float[] fmeta, Tensor cos, Tensor sin, Tensor(a!) k, "
          "Tensor(b!) v, Tensor(c!)[] sums, int[] kinds, Tensor table, Tensor blocks, int block, int row, "
          "int num_tokens, int min_token, int splits, int route_kind, int top_k, int sink, int local) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(sparsekv_cpu, CPU, lib) {
  lib.impl("paged_decode", &paged_decode);
  lib.impl("minmax_scores", &minmax_scores);
  lib.impl("route_topk", &route_topk);
  lib.impl("qlinear", &qlinear);
  lib.impl("qlinear_q8", &qlinear_q8);
  lib.impl("quantize_q8", &quantize_q8_rows);
  lib.impl("qdequant", &qdequant);
  lib.impl("decode_layer", &decode_layer);
  lib.impl("prefill_attn_bf16", &prefill_attn_bf16);
  lib.impl("prefill_attn_f32", &prefill_attn_f32);
}
