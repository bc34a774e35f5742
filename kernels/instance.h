// What a per-(dtype, layout) instance file needs: the Makefile compiles each such file once per pair with
// -DW4A16_INST_DTYPE=0|1 (fp16 | bf16) -DW4A16_INST_LAYOUT=0|1 (AWQ | Marlin) so that make -j builds them in parallel;
// W4A16_T_ is the element type and W4A16_NAME_(prefix) names the pair's entry points prefix<dtype>_<layout>.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(W4A16_INST_DTYPE) || !defined(W4A16_INST_LAYOUT)
#error "compile with -DW4A16_INST_DTYPE and -DW4A16_INST_LAYOUT"
#endif
#if W4A16_INST_DTYPE == 0
#define W4A16_T_ __half
#else
#define W4A16_T_ __nv_bfloat16
#endif
#define W4A16_CAT3_(a, b, c) a##b##_##c
#define W4A16_NAME2_(prefix, d, l) W4A16_CAT3_(prefix, d, l)
#define W4A16_NAME_(prefix) W4A16_NAME2_(prefix, W4A16_INST_DTYPE, W4A16_INST_LAYOUT)
