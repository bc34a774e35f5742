/* CPU twins of the Marlin converters in kernels/convert.cu (same index maps, kernels/marlin_index.h). */
#include "../../kernels/marlin_index.h"
#include "reference.h"

static void repack(const int32_t *in, const int32_t *perm, int K, int N, int is_gptq, int32_t *out) {
    for (int kt = 0; kt < K / 16; kt++)
        for (int w = 0; w < 2 * N; w++)
            out[(size_t)kt * 2 * N + w] = (int32_t)w4a16_marlin_word(in, perm, kt, w, N, is_gptq);
}

void w4a16_ref_marlin_repack_awq(const int32_t *awq_qweight, int K, int N, int32_t *out) {
    repack(awq_qweight, NULL, K, N, 0, out);
}

void w4a16_ref_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm, int K, int N, int32_t *out) {
    repack(gptq_qweight, perm, K, N, 1, out);
}

void w4a16_ref_marlin_permute_scales(const uint16_t *scales, int K, int N, int G, uint16_t *out) {
    int channelwise = G <= 0 || G == K;
    int rows = channelwise ? 1 : K / G;
    for (int g = 0; g < rows; g++)
        for (int pos = 0; pos < N; pos++)
            out[(size_t)g * N + pos] = scales[(size_t)g * N + w4a16_marlin_scale_source(pos, channelwise)];
}

void w4a16_ref_marlin_awq_zero_points(const int32_t *awq_qzeros, int K, int N, int G, int32_t *out) {
    int rows = (G <= 0 || G == K) ? 1 : K / G;
    for (int g = 0; g < rows; g++)
        for (int w = 0; w < N / 8; w++) {
            uint32_t res = 0;
            for (int t = 0; t < 8; t++)
                res |= w4a16_source_nibble(awq_qzeros, NULL, g, w4a16_marlin_zero_source(w, t), N, 0) << (4 * t);
            out[(size_t)g * (N / 8) + w] = (int32_t)res;
        }
}

void w4a16_ref_marlin_unpack(const int32_t *marlin, int K, int N, uint8_t *q) {
    for (int kt = 0; kt < K / 16; kt++)
        for (int w = 0; w < 2 * N; w++) {
            uint32_t word = (uint32_t)marlin[(size_t)kt * 2 * N + w];
            for (int t = 0; t < 8; t++) {
                int k, n;
                w4a16_marlin_source(kt, w, t, &k, &n);
                q[(size_t)k * N + n] = (uint8_t)((word >> (4 * t)) & 0xFu);
            }
        }
}
