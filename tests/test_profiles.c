/* The architecture profiles as data (csrc/profiles.c, compiled into this test with the kernel launches stubbed; and the
 * staged path's slab width from csrc/plan.c): every
 * profile's tiles fit the shared memory its architecture offers per block (the 99 KB of sm_86/89/120/121 is the trap:
 * a Hopper tile fails to launch there), every config it names exists, and every fallback chain ends. */
#include "../csrc/internal.h"
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* after setjmp.h, stdarg.h and stddef.h, which cmocka.h needs but does not include */
#include <cmocka.h>

/* sharedMemPerBlockOptin of the parts each profile is for (CUDA programming guide, compute capability tables). */
static const struct {
    const char *profile;
    int bytes;
} limits[] = {
    {"sm80", 166912},  /* A100: 163 KB */
    {"sm86", 101376},  /* RTX 30xx / A-series: 99 KB */
    {"sm89", 101376},  /* RTX 40xx / L40: 99 KB */
    {"sm90", 232448},  /* H100 / H200: 227 KB */
    {"sm100", 232448}, /* B200: 227 KB */
    {"sm120", 101376}, /* RTX 5090 / RTX PRO 6000: 99 KB */
    {"sm121", 101376}, /* DGX Spark GB10: 99 KB */
};

static void test_profiles_fit_their_architecture(void **state) {
    (void)state;
    const char *const *names = w4a16_profile_names();
    int n = 0;
    for (; names[n]; n++) {
        const w4a16_profile *p = w4a16_find_profile(names[n]);
        assert_non_null(p);
        int limit = 0;
        for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
            if (strcmp(limits[i].profile, names[n]) == 0) limit = limits[i].bytes;
        if (limit == 0) fail_msg("profile %s has no shared-memory limit in this test", names[n]);
        int need = w4a16_profile_smem_bytes(p);
        if (need > limit)
            fail_msg("profile %s needs %d bytes of shared memory per block; its parts allow %d", names[n], need, limit);
        print_message("  %-6s needs %6d of %6d bytes per block\n", names[n], need, limit);
    }
    assert_int_equal(n, (int)(sizeof limits / sizeof limits[0]));
}

static void test_profiles_are_well_formed(void **state) {
    (void)state;
    for (const char *const *name = w4a16_profile_names(); *name; name++) {
        const w4a16_profile *p = w4a16_find_profile(*name);
        const w4a16_tile_choice *all[] = {&p->small,     &p->mid,         &p->mid2,     &p->large,
                                          &p->large_awq, &p->small_split, &p->mid_wide, &p->mid32};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            if (all[i] == &p->mid32 && p->mid32_max_m == 0) continue;
            const w4a16_gemm_config *c = w4a16_config(all[i]->cfg);
            assert_non_null(c);
            assert_in_range(all[i]->stages, 2, 6);
            /* a choice the tile kernel runs (every config but the 16-token ones, which the decode kernel runs) must be
             * compiled with its stage count: the tile kernel's stage count is a template parameter */
            if (!w4a16_cfg_is_decode(c))
                if (!w4a16_tile_stages_compiled(all[i]->cfg, all[i]->stages))
                    fail_msg("profile %s: tile config %d with %d stages is not in W4A16_TILE_STAGES", *name,
                             all[i]->cfg, all[i]->stages);
        }
        assert_true(p->small_max_m < p->mid_max_m && p->mid_max_m < p->mid2_max_m);
        if (p->wgmma_min_m) assert_int_equal(p->arch, 90); /* the sm_90a kernel belongs to the sm90 profile only */
        int hops = 0; /* the fallback chain ends, and never climbs to a newer architecture */
        for (const w4a16_profile *q = p; q->fallback; hops++) {
            const w4a16_profile *next = w4a16_find_profile(q->fallback);
            assert_non_null(next);
            assert_true(next->arch < q->arch);
            q = next;
            assert_true(hops < 8);
        }
    }
}

/* The staged path's slab width (csrc/api.c) for the workspaces test_gpu uses, checked by hand on a 132-SM GPU: the
 * whole layer when it fits, a multiple of the dense tile otherwise, nothing when a slab would leave SMs without a tile
 * or the workspace holds no slab. */
static void test_staged_slab_width(void **state) {
    (void)state;
    const int sms = 132;
    const size_t off = w4a16_workspace_slab_offset(sms), big = off + (size_t)4096 * 4096 * 2;
    assert_int_equal(off % 256, 0);
    assert_true(off >= w4a16_workspace_bytes_for(sms));
    assert_int_equal(w4a16_staged_slab_channels(2100, 4096, 4096, big, sms), 4096); /* 9 x 32 tiles */
    assert_int_equal(w4a16_staged_slab_channels(1024, 4096, 4096, big, sms), 0);    /* 4 x 32 < 132 */
    assert_int_equal(w4a16_staged_slab_channels(4096, 5632, 2048, off + (size_t)2048 * 2048 * 2, sms), 2048);
    assert_int_equal(w4a16_staged_slab_channels(4096, 5632, 2048, off + (size_t)2100 * 2048 * 2, sms),
                     2048); /* rounded */
    assert_int_equal(w4a16_staged_slab_channels(2500, 8192, 1024, off + (size_t)1792 * 1024 * 2, sms),
                     1792);                                                                                /* 10 x 14 */
    assert_int_equal(w4a16_staged_slab_channels(2500, 8192, 1024, off + (size_t)1664 * 1024 * 2, sms), 0); /* 10 x 13 */
    assert_int_equal(w4a16_staged_slab_channels(4096, 4096, 4096, off, sms), 0); /* no room for a slab */
    assert_int_equal(w4a16_staged_slab_channels(4096, 4096, 4096, 0, sms), 0);   /* no workspace */
    assert_int_equal(w4a16_staged_slab_channels(4096, 4096, 4096, off + 127 * 4096 * 2, sms), 0); /* < one tile */
}

/* K splits (csrc/plan.c): the cases of docs/PERFORMANCE.md v18 on the H100 (132 SMs, 2 blocks of the deep decode tile
 * per SM, 256 k per k-tile), then the invariants over a grid of shapes: never more blocks than slots (the workspace
 * holds that many partial tiles), at most 16 splits, every split at least min_kt k-tiles. */
static void test_choose_splits(void **state) {
    (void)state;
    assert_int_equal(w4a16_choose_splits(2, 48, 16, 132, 4), 4);  /* llama3-8b.qkv: 5 slots' worth, 4 by k */
    assert_int_equal(w4a16_choose_splits(2, 32, 16, 132, 4), 4);  /* llama3-8b.o: 8 slots' worth, 4 by k */
    assert_int_equal(w4a16_choose_splits(2, 32, 56, 132, 4), 8);  /* llama3-8b.down: K = 14336 keeps 8 */
    assert_int_equal(w4a16_choose_splits(2, 64, 116, 132, 4), 4); /* qwen2.5-72b.down */
    assert_int_equal(w4a16_choose_splits(2, 462, 32, 132, 4), 1); /* qwen2.5-72b.gate_up fills the SMs */
    assert_int_equal(w4a16_choose_splits(4, 8, 256, 132, 2), 16); /* capped at 16 */
    assert_int_equal(w4a16_choose_splits(4, 1, 3, 132, 2), 1);    /* one k-tile per split is not enough */
    for (int bps = 1; bps <= 4; bps++)
        for (int tiles = 1; tiles <= 600; tiles += 7)
            for (int kt = 1; kt <= 300; kt += 11)
                for (int min_kt = 2; min_kt <= 4; min_kt += 2) {
                    const int s = w4a16_choose_splits(bps, tiles, kt, 132, min_kt);
                    assert_in_range(s, 1, 16);
                    if (s > 1) {
                        assert_true((long)s * tiles <= 132L * bps);
                        assert_true(kt / s >= min_kt);
                    }
                }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profiles_fit_their_architecture),
        cmocka_unit_test(test_profiles_are_well_formed),
        cmocka_unit_test(test_staged_slab_width),
        cmocka_unit_test(test_choose_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
