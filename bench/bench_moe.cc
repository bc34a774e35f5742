// w4a16 MoE benchmark: the grouped GEMMs of four mixture-of-experts models' expert layers, through the public C ABI,
// as a Google Benchmark program (the method of bench/bench.cc: random data, warm-up, CUDA-event timing of batches of
// launches, median of 9 samples, the lower of two passes; with --sweeps=N, default 2, the whole list runs N times and
// each case keeps its lowest, as bench/bench.cc does against a GPU whose other tenants disturb single cases).
//
// Per model, T tokens routed uniformly at random (top_k distinct experts per token), two GEMMs: w13 (gate and up,
// K = hidden, N = 2 x expert width, A = the T tokens) and w2 (down, K = expert width, N = hidden, A = the T x top_k
// activated rows, weighted by topk_weights). Launches cycle through 16 different routings, so consecutive launches
// touch mostly different experts (the layers are larger than L2; an expert reused by the next routing is the only
// cache help). floor = max(bytes / copy bandwidth, FLOPs / cuBLAS fp16 peak), both measured in the same run, with
// bytes = the packed weights, scales and zero points of the experts the routings touch (averaged) + A + C.
//
//   build/bench_moe [--t=1,4,16,64,256,1024,4096] [--models=qwen3] [--sm120=0|1] [--awq=0|1] [--sweeps=2]
//                   [--json=build/bench_moe_results.json] [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../tests/gpu_util.h"
#include "bench_util.h"

namespace {

struct Model {
    const char *name;
    int E, top_k, hidden, inter;
};
const Model models[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768},
    {"qwen3-next-80b-a3b", 512, 10, 2048, 512},
    {"glm-4.5-air", 128, 8, 4096, 1408},
    {"mixtral-8x7b", 8, 2, 4096, 14336},
};

struct Options {
    std::vector<int> ts = {1, 4, 16, 64, 256, 1024, 4096};
    std::string models, json = "build/bench_moe_results.json";
    bool sm120 = true, awq = true;
    int sweeps = 2;
} opt;

struct Device {
    w4a16_device_info info{};
    double copy_tbps = 0, cublas_tflops = 0;
} dev;

constexpr int G = 128, ROUTINGS = 16;

size_t expert_bytes(int K, int N) { return (size_t)K * N / 2 + (size_t)(K / G) * N * 2 + (size_t)(K / G) * N / 2; }

// One GEMM's stacked experts on the device: AWQ tensors as stored and their Marlin conversion.
struct Stack {
    int E, K, N;
    int32_t *qweight = nullptr, *qzeros = nullptr, *mweight = nullptr, *mzeros = nullptr;
    uint16_t *scales = nullptr, *mscales = nullptr;
    void make(int E_, int K_, int N_, uint64_t *seed) {
        E = E_;
        K = K_;
        N = N_;
        const size_t nw = (size_t)E * K * N / 8, nz = (size_t)E * (K / G) * N / 8, ns = (size_t)E * (K / G) * N;
        std::vector<uint32_t> h(std::max(nw, nz));
        std::vector<uint16_t> hs(ns);
        fill_random_words(h.data(), nw, seed);
        qweight = (int32_t *)gpu_upload(h.data(), nw * 4);
        fill_random_words(h.data(), nz, seed);
        qzeros = (int32_t *)gpu_upload(h.data(), nz * 4);
        fill_random_half(hs.data(), ns, 0.005f, 0.015f, W4A16_FP16, seed);
        scales = (uint16_t *)gpu_upload(hs.data(), ns * 2);
        mweight = (int32_t *)gpu_alloc(nw * 4);
        mzeros = (int32_t *)gpu_alloc(nz * 4);
        mscales = (uint16_t *)gpu_alloc(ns * 2);
        W4_CHECK(w4a16_moe_marlin_repack_awq(qweight, mweight, E, K, N, nullptr));
        W4_CHECK(w4a16_moe_marlin_awq_zero_points(qzeros, mzeros, E, K, N, G, nullptr));
        W4_CHECK(w4a16_moe_marlin_permute_scales(scales, mscales, E, K, N, G, W4A16_FP16, nullptr));
        GPU_CHECK(cudaDeviceSynchronize());
    }
    void release() {
        cudaFree(qweight);
        cudaFree(qzeros);
        cudaFree(scales);
        cudaFree(mweight);
        cudaFree(mzeros);
        cudaFree(mscales);
    }
};

struct Routing {
    int32_t *sorted = nullptr, *eids = nullptr, *npp = nullptr;
    float *tw = nullptr;
    int cap = 0, bcap = 0, bs = 0, touched = 0;
};

// A model at one T: its two stacks (kept across T), routings, activations and outputs.
struct ModelData {
    const Model *m = nullptr;
    Stack w13, w2;
    int T = 0;
    std::vector<Routing> routes;
    void *x = nullptr, *h = nullptr, *a2 = nullptr, *y = nullptr;
    double touched_avg = 0;
};
std::unique_ptr<ModelData> cur;
void *g_ws = nullptr; // the split-K workspace (w4a16_moe_workspace_size), zeroed once
size_t g_ws_bytes = 0;

void free_routes(ModelData *d) {
    for (Routing &r : d->routes) {
        cudaFree(r.sorted);
        cudaFree(r.eids);
        cudaFree(r.npp);
        cudaFree(r.tw);
    }
    d->routes.clear();
    cudaFree(d->x);
    cudaFree(d->h);
    cudaFree(d->a2);
    cudaFree(d->y);
    d->x = d->h = d->a2 = d->y = nullptr;
}

// w4a16.moe.choose_block_size: the smallest of 16 / 32 / 64 the average expert's pairs fill to less than 90%
int block_size_for(int T, int top_k, int E) {
    const double avg = (double)T * top_k / E;
    return avg < 0.9 * 16 ? 16 : avg < 0.9 * 32 ? 32 : 64;
}

ModelData *model_data(const Model *m, int T) {
    if (!cur || cur->m != m) {
        if (cur) {
            free_routes(cur.get());
            cur->w13.release();
            cur->w2.release();
        }
        cur = std::make_unique<ModelData>();
        cur->m = m;
        uint64_t seed = 0xC0FFEEull ^ (uint64_t)m->E;
        cur->w13.make(m->E, m->hidden, 2 * m->inter, &seed);
        cur->w2.make(m->E, m->inter, m->hidden, &seed);
    }
    ModelData *d = cur.get();
    if (d->T == T) return d;
    free_routes(d);
    d->T = T;
    uint64_t seed = 0xABCDEFull ^ (uint64_t)T;
    const int n = T * m->top_k, bs = block_size_for(T, m->top_k, m->E);
    std::vector<int32_t> ids(n);
    std::vector<float> tw(n);
    double touched = 0;
    int32_t *d_ids = (int32_t *)gpu_alloc((size_t)n * 4);
    for (int r = 0; r < ROUTINGS; r++) {
        std::set<int> used;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < m->top_k; k++) {
                int e, again;
                do { // distinct experts per token, uniform
                    e = (int)(w4a16_ref_rand_u64(&seed) % m->E);
                    again = 0;
                    for (int j = 0; j < k; j++) again |= ids[(size_t)t * m->top_k + j] == e;
                } while (again);
                ids[(size_t)t * m->top_k + k] = e;
                tw[(size_t)t * m->top_k + k] = w4a16_ref_rand_uniform(&seed, 0.f, 1.f);
                used.insert(e);
            }
        Routing R;
        R.bs = bs;
        R.touched = (int)used.size();
        touched += R.touched;
        W4_CHECK(w4a16_moe_align_sizes(T, m->top_k, m->E, bs, &R.cap, &R.bcap));
        R.sorted = (int32_t *)gpu_alloc((size_t)R.cap * 4);
        R.eids = (int32_t *)gpu_alloc((size_t)R.bcap * 4);
        R.npp = (int32_t *)gpu_alloc(4);
        R.tw = (float *)gpu_upload(tw.data(), (size_t)n * 4);
        GPU_CHECK(cudaMemcpy(d_ids, ids.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
        W4_CHECK(
            w4a16_moe_align_block_size(d_ids, T, m->top_k, m->E, bs, R.sorted, R.cap, R.eids, R.bcap, R.npp, nullptr));
        GPU_CHECK(cudaDeviceSynchronize());
        d->routes.push_back(R);
    }
    cudaFree(d_ids);
    d->touched_avg = touched / ROUTINGS;
    std::vector<uint16_t> hx((size_t)n * std::max(m->hidden, m->inter));
    fill_random_half(hx.data(), hx.size(), -1.f, 1.f, W4A16_FP16, &seed);
    d->x = gpu_upload(hx.data(), (size_t)T * m->hidden * 2);
    d->a2 = gpu_upload(hx.data(), (size_t)n * m->inter * 2);
    d->h = gpu_alloc((size_t)n * 2 * m->inter * 2);
    d->y = gpu_alloc((size_t)n * m->hidden * 2);
    return d;
}

enum Path { MARLIN = 0, AWQ = 1 };
const char *path_names[] = {"moe_marlin", "moe_awq"};

void launch(Path p, ModelData *d, bool down, int i) {
    const Routing &R = d->routes[i % ROUTINGS];
    const Model *m = d->m;
    const Stack &s = down ? d->w2 : d->w13;
    const void *A = down ? d->a2 : d->x;
    void *C = down ? d->y : d->h;
    const int M = down ? d->T * m->top_k : d->T, tk = down ? 1 : m->top_k;
    const float *tw = down ? R.tw : nullptr;
    w4a16_status st =
        p == MARLIN
            ? w4a16_moe_marlin_gemm(A, s.mweight, s.mscales, s.mzeros, nullptr, tw, C, R.sorted, R.eids, R.npp, R.cap,
                                    R.bcap, R.bs, M, tk, m->E, s.N, s.K, G, W4A16_FP16, g_ws, g_ws_bytes, nullptr)
            : w4a16_moe_awq_gemm(A, s.qweight, s.scales, s.qzeros, nullptr, tw, C, R.sorted, R.eids, R.npp, R.cap,
                                 R.bcap, R.bs, M, tk, m->E, s.N, s.K, G, W4A16_FP16, g_ws, g_ws_bytes, nullptr);
    W4_CHECK(st);
}

double time_us(Path p, ModelData *d, bool down) {
    cudaEvent_t e0, e1;
    GPU_CHECK(cudaEventCreate(&e0));
    GPU_CHECK(cudaEventCreate(&e1));
    int i = 0;
    for (int w = 0; w < 3; w++) launch(p, d, down, i++);
    float ms = 0;
    GPU_CHECK(cudaEventRecord(e0));
    for (int w = 0; w < 3; w++) launch(p, d, down, i++);
    GPU_CHECK(cudaEventRecord(e1));
    GPU_CHECK(cudaEventSynchronize(e1));
    GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double est = ms * 1000.0 / 3;
    const int warm = (int)std::clamp(10000.0 / std::max(est, 1.0), 3.0, 2000.0);
    for (int w = 0; w < warm; w++) launch(p, d, down, i++);
    const int reps = (int)std::clamp(2000.0 / std::max(est, 1.0), 5.0, 200.0);
    const double best = time_launches([&] { launch(p, d, down, i++); }, reps, e0, e1);
    GPU_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

struct Row {
    std::string model, gemm, path, profile;
    int T, E, top_k, K, N;
    double us, floor_us, touched;
};
std::vector<Row> rows;

void run_case(benchmark::State &state, const Model *m, int T, bool down, Path p, const char *profile) {
    static const char *start_profile = getenv("W4A16_PROFILE");
    if (profile) W4_CHECK(w4a16_force_profile(profile));
    ModelData *d = model_data(m, T);
    double us = 0;
    for (auto _ : state) {
        us = time_us(p, d, down);
        state.SetIterationTime(us * 1e-6);
    }
    const int K = down ? m->inter : m->hidden, N = down ? m->hidden : 2 * m->inter, n = T * m->top_k;
    const double bytes = d->touched_avg * expert_bytes(K, N) + 2.0 * (down ? n : T) * K + 2.0 * n * N;
    const double flops = 2.0 * n * N * K;
    const double fl = std::max(bytes / (dev.copy_tbps * 1e12), flops / (dev.cublas_tflops * 1e12)) * 1e6;
    state.counters["us"] = us;
    state.counters["floor_us"] = fl;
    state.counters["x_floor"] = us / fl;
    state.counters["experts"] = d->touched_avg;
    const Row r{
        m->name, down ? "w2" : "w13", path_names[p], profile ? profile : dev.info.profile, T, m->E, m->top_k, K, N, us,
        fl,      d->touched_avg};
    const auto seen = std::find_if(rows.begin(), rows.end(), [&](const Row &o) {
        return o.model == r.model && o.gemm == r.gemm && o.path == r.path && o.profile == r.profile && o.T == r.T;
    });
    keep_lowest(rows, seen == rows.end() ? nullptr : &*seen, r);
    if (profile) W4_CHECK(w4a16_force_profile(start_profile));
}

void register_all() {
    // the sweeps one after another in one RunSpecifiedBenchmarks call (a second call crashed with the packaged library)
    for (int sweep = 0; sweep < opt.sweeps; sweep++)
        for (const Model &m : models) {
            if (!opt.models.empty() && std::string(m.name).find(opt.models) == std::string::npos) continue;
            for (int T : opt.ts)
                for (int down = 0; down < 2; down++) {
                    struct V {
                        Path p;
                        const char *profile;
                    };
                    std::vector<V> vs = {{MARLIN, nullptr}};
                    if (opt.awq) vs.push_back({AWQ, nullptr});
                    if (opt.sm120) vs.push_back({MARLIN, "sm120"});
                    for (const V &v : vs) {
                        std::string name = std::string(path_names[v.p]) + "/" + m.name + "." + (down ? "w2" : "w13") +
                                           "/T=" + std::to_string(T) + "/" + (v.profile ? v.profile : "auto") +
                                           (opt.sweeps > 1 ? "/sweep:" + std::to_string(sweep + 1) : "");
                        benchmark::RegisterBenchmark(name.c_str(), run_case, &m, T, (bool)down, v.p, v.profile)
                            ->UseManualTime()
                            ->Iterations(1)
                            ->Unit(benchmark::kMicrosecond);
                    }
                }
        }
}

void summary() {
    printf("\n%-20s %-4s %5s %-11s %-6s %9s %9s %8s %8s\n", "model", "gemm", "T", "path", "prof", "us", "floor",
           "x_floor", "experts");
    for (const Row &r : rows)
        printf("%-20s %-4s %5d %-11s %-6s %9.1f %9.1f %8.2f %8.1f\n", r.model.c_str(), r.gemm.c_str(), r.T,
               r.path.c_str(), r.profile.c_str(), r.us, r.floor_us, r.us / r.floor_us, r.touched);
    FILE *f = fopen(opt.json.c_str(), "w");
    if (!f) {
        fprintf(stderr, "bench_moe: cannot write %s\n", opt.json.c_str());
        return;
    }
    fprintf(f, "{\"device\": \"%s\", \"copy_tbps\": %.3f, \"cublas_tflops\": %.1f, \"rows\": [\n", dev.info.name,
            dev.copy_tbps, dev.cublas_tflops);
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &r = rows[i];
        fprintf(f,
                "  {\"model\": \"%s\", \"gemm\": \"%s\", \"path\": \"%s\", \"profile\": \"%s\", \"T\": %d, "
                "\"E\": %d, "
                "\"top_k\": %d, \"K\": %d, \"N\": %d, \"us\": %.3f, \"floor_us\": %.3f, \"experts\": %.2f}%s\n",
                r.model.c_str(), r.gemm.c_str(), r.path.c_str(), r.profile.c_str(), r.T, r.E, r.top_k, r.K, r.N, r.us,
                r.floor_us, r.touched, i + 1 < rows.size() ? "," : "");
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("\nwrote %s (%zu rows)\n", opt.json.c_str(), rows.size());
}

void parse(int &argc, char **argv) {
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        auto val = [&](const char *key) -> const char * {
            size_t n = strlen(key);
            return strncmp(a, key, n) == 0 && a[n] == '=' ? a + n + 1 : nullptr;
        };
        const char *v;
        if ((v = val("--t"))) {
            opt.ts.clear();
            for (const char *p = v; *p;) {
                opt.ts.push_back(atoi(p));
                while (*p && *p != ',') p++;
                if (*p) p++;
            }
        } else if ((v = val("--models")))
            opt.models = v;
        else if ((v = val("--sm120")))
            opt.sm120 = atoi(v) != 0;
        else if ((v = val("--awq")))
            opt.awq = atoi(v) != 0;
        else if ((v = val("--json")))
            opt.json = v;
        else if ((v = val("--sweeps")))
            opt.sweeps = std::max(1, atoi(v));
        else
            argv[out++] = argv[i];
    }
    argc = out;
}

} // namespace

int main(int argc, char **argv) {
    parse(argc, argv);
    if (w4a16_get_device_info(0, &dev.info) != W4A16_OK || !dev.info.supported) {
        fprintf(stderr, "bench_moe: no usable CUDA GPU: %s\n",
                dev.info.reason[0] ? dev.info.reason : w4a16_last_error_message());
        return 1;
    }
    W4_CHECK(w4a16_moe_workspace_size(&g_ws_bytes));
    g_ws = gpu_alloc(g_ws_bytes);
    GPU_CHECK(cudaMemset(g_ws, 0, g_ws_bytes));
    cublasHandle_t blas;
    BLAS_CHECK(cublasCreate(&blas));
    const Ceilings ceilings = measure_ceilings(blas);
    cublasDestroy(blas);
    dev.copy_tbps = ceilings.copy_tbps;
    dev.cublas_tflops = ceilings.cublas_tflops;
    printf("bench_moe: %s; copy %.2f TB/s, cuBLAS fp16 %.0f TFLOP/s\n", dev.info.reason, dev.copy_tbps,
           dev.cublas_tflops);
    benchmark::Initialize(&argc, argv);
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    summary();
    if (cur) {
        free_routes(cur.get());
        cur->w13.release();
        cur->w2.release();
    }
    cudaFree(g_ws);
    return 0;
}
