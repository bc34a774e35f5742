/* The grid of GEMM calls whose launch decisions tests/plan_recorded.txt holds: every benchmark layer (cases.h) and a
 * few edge shapes, M from 1 to 8192 with odd values and tile edges, every group size, both layouts and dtypes, four
 * workspaces (none, w4a16_workspace_size(), a third of a staged slab, a whole one), on these devices. */
#ifndef W4A16_PLAN_GRID_H
#define W4A16_PLAN_GRID_H
#include "cases.h"

/* name, profile, SMs, sharedMemPerBlockOptin (the SM has 1 KB more), sm_90a wgmma kernels loaded, the warp-specialised
 * tile's image loaded (sm_90a / sm_120a / sm_121a: compute capability 9.0, 12.0, 12.1) */
typedef struct plan_device {
    const char *name, *profile;
    int sms, smem_block, wgmma, ws;
} plan_device;
static const plan_device plan_devices[] = {
    {"h100", "sm90", 132, 232448, 1, 1},       {"h100-sm80", "sm80", 132, 232448, 1, 1},
    {"sm120-132", "sm120", 132, 101376, 0, 1}, {"a100", "sm80", 108, 166912, 0, 0},
    {"rtx5090", "sm120", 170, 101376, 0, 1},   {"rtxpro6000", "sm120", 188, 101376, 0, 1},
    {"gb10", "sm121", 48, 101376, 0, 1},       {"l40s", "sm89", 142, 101376, 0, 0},
    {"b200", "sm100", 148, 232448, 0, 0},      {"sm80-132", "sm80", 132, 166912, 0, 0},
};
#define PLAN_NUM_DEVICES ((int)(sizeof plan_devices / sizeof plan_devices[0]))
static const struct { int K, N; } plan_extra[] = {{128, 64}, {256, 192}, {4096, 128}, {1024, 64 * 397}};
#define PLAN_NUM_EXTRA ((int)(sizeof plan_extra / sizeof plan_extra[0]))
static const int plan_m[] = {1,    2,    3,    4,    5,    7,    8,    9,    12,   15,   16,   17,   24,
                             31,   32,   33,   48,   63,   64,   65,   96,   100,  127,  128,  129,  192,
                             255,  256,  257,  384,  511,  512,  513,  768,  1000, 1023, 1024, 1025, 1536,
                             2047, 2048, 2049, 3000, 4095, 4096, 4097, 6000, 8191, 8192};
#define PLAN_NUM_M ((int)(sizeof plan_m / sizeof plan_m[0]))
static const int plan_g[] = {32, 64, 128, -1};
#define PLAN_NUM_G 4
#endif
