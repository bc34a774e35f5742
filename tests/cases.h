/* The one list of real layer shapes and batch sizes, shared by the GPU tests and the benchmark.
 * K -> N of each linear layer (K = in_features, N = out_features), group size 128 unless a case says otherwise. */
#ifndef W4A16_TEST_CASES_H
#define W4A16_TEST_CASES_H

typedef struct w4a16_layer {
    const char *name;
    int K, N;
    int family; /* 0: the performance targets' layers (llama3-8b, qwen2.5-72b); 1: other full models; 2: TP=2 shards */
} w4a16_layer;

static const w4a16_layer w4a16_layers[] = {
    {"llama3-8b.qkv", 4096, 6144, 0},
    {"llama3-8b.o", 4096, 4096, 0},
    {"llama3-8b.gate_up", 4096, 28672, 0},
    {"llama3-8b.down", 14336, 4096, 0},
    {"qwen2.5-72b.qkv", 8192, 10240, 0},
    {"qwen2.5-72b.o", 8192, 8192, 0},
    {"qwen2.5-72b.gate_up", 8192, 59136, 0},
    {"qwen2.5-72b.down", 29568, 8192, 0},
    {"llama3-70b.qkv", 8192, 10240, 1},
    {"llama3-70b.o", 8192, 8192, 1},
    {"llama3-70b.gate_up", 8192, 57344, 1},
    {"llama3-70b.down", 28672, 8192, 1},
    {"qwen2.5-32b.qkv", 5120, 7168, 1},
    {"qwen2.5-32b.o", 5120, 5120, 1},
    {"qwen2.5-32b.gate_up", 5120, 55296, 1},
    {"qwen2.5-32b.down", 27648, 5120, 1},
    /* TP=2 shards: column-parallel layers halve N, row-parallel layers halve K. Qwen2.5-72B's AWQ release pads
     * the intermediate size to 29696 so that each shard's K (14848) is a multiple of 128. */
    {"llama3-70b.tp2.qkv", 8192, 5120, 2},
    {"llama3-70b.tp2.o", 4096, 8192, 2},
    {"llama3-70b.tp2.gate_up", 8192, 28672, 2},
    {"llama3-70b.tp2.down", 14336, 8192, 2},
    {"qwen2.5-72b.tp2.qkv", 8192, 5120, 2},
    {"qwen2.5-72b.tp2.o", 4096, 8192, 2},
    {"qwen2.5-72b.tp2.gate_up", 8192, 29696, 2},
    {"qwen2.5-72b.tp2.down", 14848, 8192, 2},
};
#define W4A16_NUM_LAYERS ((int)(sizeof w4a16_layers / sizeof w4a16_layers[0]))

/* Batch sizes (M) of the benchmark. */
static const int w4a16_bench_m[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
#define W4A16_NUM_BENCH_M ((int)(sizeof w4a16_bench_m / sizeof w4a16_bench_m[0]))

/* Batch sizes of the GPU correctness tests: tile edges on both sides. */
static const int w4a16_test_m[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 128, 255, 256, 512, 1024, 4096};
#define W4A16_NUM_TEST_M ((int)(sizeof w4a16_test_m / sizeof w4a16_test_m[0]))

#endif
