// Every operator of the CPU extension but the float32 prefill, in one translation unit (a unity build). ATen's
// headers cost about 7 of the 9-12 CPU-seconds each file took to compile alone, so six files compiled as one
// take about 25 CPU-seconds instead of about 60 (g++ -O3, 2026-12-05), for every build: `make kernels`, the
// wheel's test, and the second CPU configuration's. Each file stays whole and readable on its own; the
// files share this unit, so no two may define the same name in their anonymous namespaces (shared constants
// live in simd.h). prefill_attn_f32.cpp is the extension's second unit: it keeps names of its own.
#include "decode_layer.cpp"
#include "paged_decode.cpp"
#include "prefill_attn.cpp"
#include "qlinear.cpp"
#include "route.cpp"
#include "register.cpp"
