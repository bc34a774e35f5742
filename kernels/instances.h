/* The (dtype, layout) pairs the GEMM kernels are compiled for, one object file each so that make -j builds them in
 * parallel: the Makefile reads this list (every X(dtype, layout) in this file) and kernels/dispatch.cu declares and
 * calls each pair's entry points from it. dtype: 0 fp16, 1 bf16; layout: W4A16_LAYOUT_AWQ (0), W4A16_LAYOUT_MARLIN (1).
 */
#ifndef W4A16_KERNEL_INSTANCES_H
#define W4A16_KERNEL_INSTANCES_H
// clang-format off
#define W4A16_GEMM_INSTANCES(X) \
    X(0, 0)                     \
    X(0, 1)                     \
    X(1, 0)                     \
    X(1, 1)
// clang-format on
#endif
