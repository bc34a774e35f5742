// w4a16 benchmark: AWQ path vs Marlin path vs cuBLAS fp16 on real model layers (tests/cases.h), through the
// public C ABI only, as a Google Benchmark program. Method: random data, weight copies
// rotated past 2 x L2, warm-up, CUDA-event timing of batches of launches, median of the samples (the lower of two
// passes' medians; with --sweeps=N, default 2, the whole list runs N times and each case keeps its lowest). Every row
// reports
// time, TFLOP/s, GB/s, the floor and the ratio to it, and the ratio to cuBLAS fp16; a summary table per layer x M
// and a JSON file close the run (bench/plot draws the PNG).
//
//   build/bench [--full] [--bf16=0|1] [--sm120=0|1] [--settle=0|1] [--pdl=0|1] [--group=128] [--m=1,16,64]
//               [--layers=substr] [--sweeps=2]
//               [--json=build/bench_results.json] [Google Benchmark flags, e.g. --benchmark_filter=marlin]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../tests/cases.h"
#include "../tests/gpu_util.h"
#include "bench_util.h"

namespace {

struct Options {
    bool full = false, bf16 = true, sm120 = true, settle = true, pdl = true;
    int group = 128;
    // Sweeps of the whole case list; each case keeps its lowest time. A pass's disturbance lasts milliseconds and
    // sometimes spans both passes of one case (three make bench runs on one H100 each had 1-4 decode cases at
    // 1.3-4.7x their time in the other runs, a different case each time); sweeps minutes apart do not share one.
    int sweeps = 2;
    std::vector<int> ms;
    std::string layers, json = "build/bench_results.json";
} opt;

struct Device {
    w4a16_device_info info{};
    double copy_tbps = 0, cublas_tflops = 0;
    cublasHandle_t blas = nullptr;
    void *ws = nullptr, *ws_staged = nullptr;
    size_t ws_bytes = 0, ws_staged_bytes = 0; // split-K workspace; + a slab for the largest layer's staged GEMM
} dev;

// One layer's tensors, with enough copies of the weights to rotate past 2 x L2.
struct LayerData {
    int K, N, G, copies_q, copies_dense;
    w4a16_dtype dt;
    std::vector<gpu_layer> q;  // AWQ + Marlin tensors, one per copy
    std::vector<void *> dense; // fp16/bf16 W copies for cuBLAS
    void *A = nullptr, *C = nullptr;
    int max_m = 0;
};

std::map<std::string, std::unique_ptr<LayerData>> cache;
void free_all();

size_t quant_bytes(int K, int N, int G) {
    int groups = G > 0 ? K / G : 1;
    return (size_t)K * N / 2 + (size_t)groups * N * 2 + (size_t)groups * N / 2;
}

LayerData *layer_data(const w4a16_layer &ly, w4a16_dtype dt, int max_m) {
    std::string key = std::string(ly.name) + (dt == W4A16_BF16 ? "/bf16" : "/fp16");
    auto it = cache.find(key);
    if (it != cache.end()) return it->second.get();
    free_all(); // one layer resident at a time: benchmarks run in registration order
    auto d = std::make_unique<LayerData>();
    d->K = ly.K;
    d->N = ly.N;
    d->G = opt.group;
    d->dt = dt;
    d->max_m = max_m;
    size_t l2x2 = 2 * dev.info.l2_bytes;
    d->copies_q = (int)std::min<size_t>(64, l2x2 / quant_bytes(ly.K, ly.N, opt.group) + 1);
    d->copies_dense = (int)std::min<size_t>(16, l2x2 / ((size_t)ly.K * ly.N * 2) + 1);
    uint64_t seed = 0x1234567ull ^ ((uint64_t)ly.K << 20) ^ (uint64_t)ly.N;
    d->q.resize(d->copies_q);
    gpu_layer_make(&d->q[0], ly.K, ly.N, opt.group, dt, 0, 1, &seed);
    size_t nw = (size_t)ly.K * ly.N / 2, groups = d->q[0].groups, ns = groups * ly.N * 2, nz = groups * ly.N / 2;
    for (int c = 1; c < d->copies_q; c++) { // copies of the same data: same cost, different addresses
        gpu_layer &g = d->q[c];
        g = d->q[0];
        g.dense = nullptr;
        g.qweight = (int32_t *)gpu_alloc(nw);
        g.mweight = (int32_t *)gpu_alloc(nw);
        g.scales = (uint16_t *)gpu_alloc(ns);
        g.mscales = (uint16_t *)gpu_alloc(ns);
        g.qzeros = (int32_t *)gpu_alloc(nz);
        g.mzeros = (int32_t *)gpu_alloc(nz);
        GPU_CHECK(cudaMemcpy(g.qweight, d->q[0].qweight, nw, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaMemcpy(g.mweight, d->q[0].mweight, nw, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaMemcpy(g.scales, d->q[0].scales, ns, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaMemcpy(g.mscales, d->q[0].mscales, ns, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaMemcpy(g.qzeros, d->q[0].qzeros, nz, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaMemcpy(g.mzeros, d->q[0].mzeros, nz, cudaMemcpyDeviceToDevice));
    }
    d->dense.push_back(d->q[0].dense);
    for (int c = 1; c < d->copies_dense; c++) {
        void *p = gpu_alloc((size_t)ly.K * ly.N * 2);
        GPU_CHECK(cudaMemcpy(p, d->q[0].dense, (size_t)ly.K * ly.N * 2, cudaMemcpyDeviceToDevice));
        d->dense.push_back(p);
    }
    std::vector<uint16_t> hA((size_t)max_m * ly.K);
    fill_random_half(hA.data(), hA.size(), -1.f, 1.f, dt, &seed);
    d->A = gpu_upload(hA.data(), hA.size() * 2);
    d->C = gpu_alloc((size_t)max_m * ly.N * 2);
    GPU_CHECK(cudaDeviceSynchronize());
    auto *raw = d.get();
    cache[key] = std::move(d);
    return raw;
}

void free_all() {
    for (auto &kv : cache) {
        LayerData *d = kv.second.get();
        for (auto &g : d->q) {
            g.dense = nullptr;
            gpu_layer_free(&g);
        }
        for (void *p : d->dense) cudaFree(p);
        cudaFree(d->A);
        cudaFree(d->C);
    }
    cache.clear();
}

// *_staged: the path given a workspace that holds the layer's dequantised weights (w4a16_workspace_size_staged), so
// that from the profile's staged_min_m on it dequantises, then multiplies densely; measured from M = 4096.
// MARLIN_PLAIN: the Marlin path launched without W4A16_FLAG_PDL (the other w4a16 paths take it unless --pdl=0)
enum Path { AWQ = 0, MARLIN = 1, CUBLAS = 2, AWQ_STAGED = 3, MARLIN_STAGED = 4, MARLIN_PLAIN = 5 };
const char *path_names[] = {"awq", "marlin", "cublas_fp16", "awq_staged", "marlin_staged", "marlin_plain"};
constexpr int STAGED_MIN_M = 4096; // the sm90 profile's staged_min_m

struct Row {
    std::string layer, path, profile, dtype;
    bool forced; // profile forced (the sm120 family)
    int M, K, N, G;
    double us, floor_us, tflops, gbps;
};
std::vector<Row> rows;

double floor_us(int M, int K, int N, int G) {
    double bytes = (double)quant_bytes(K, N, G) + 2.0 * M * K + 2.0 * M * N;
    double flops = 2.0 * M * N * K;
    return std::max(bytes / (dev.copy_tbps * 1e12), flops / (dev.cublas_tflops * 1e12)) * 1e6;
}

void launch(Path p, LayerData *d, int M, int copy) {
    if (p == CUBLAS) {
        cublas_gemm(dev.blas, d->A, d->dense[copy % d->copies_dense], d->C, M, d->N, d->K, d->dt, cuda_type(d->dt));
        return;
    }
    const gpu_layer &g = d->q[copy % d->copies_q];
    const bool staged = p == AWQ_STAGED || p == MARLIN_STAGED;
    void *ws = staged ? dev.ws_staged : dev.ws;
    const size_t ws_bytes = staged ? dev.ws_staged_bytes : dev.ws_bytes;
    const unsigned flags = opt.pdl && p != MARLIN_PLAIN ? W4A16_FLAG_PDL : 0u;
    w4a16_status s = p == AWQ || p == AWQ_STAGED
                         ? w4a16_awq_gemm_ex(d->A, g.qweight, g.scales, g.qzeros, nullptr, d->C, M, d->N, d->K, d->G,
                                             d->dt, ws, ws_bytes, flags, nullptr)
                         : w4a16_marlin_gemm_ex(d->A, g.mweight, g.mscales, g.mzeros, nullptr, d->C, M, d->N, d->K,
                                                d->G, d->dt, ws, ws_bytes, flags, nullptr);
    W4_CHECK(s);
}

Row *find(const std::string &layer, const char *path, const std::string &dtype, int M, bool forced) {
    for (Row &r : rows)
        if (r.layer == layer && r.path == path && r.dtype == dtype && r.M == M && r.forced == forced) return &r;
    return nullptr;
}

// Per-launch time in microseconds: two passes of `samples` batches of `reps` launches each, timed with events; each
// pass gives its median, and the lower of the two is reported. (On the lent GPUs an occasional case ran 1.8-2.6x slow
// in every sample of one pass while its neighbours did not: a pass disturbed as a whole.)
// Sustained tensor-core load lowers the H100's clocks within a second (cuBLAS on llama3-8b.o at M = 4096 took 183,
// 188, 207, 214 us in four back-to-back calls of this function), so a case timed right after a heavy one would run
// on a hotter GPU than the case before it. With --settle=1 (the default) each case first idles for as long as the
// previous one kept the GPU busy (at most 1 s), so every path starts from the same state (the run takes about twice
// as long).
double time_us(Path p, LayerData *d, int M) {
    static double last_busy_s = 0;
    if (opt.settle) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(last_busy_s, 1.0)));
    const auto start = std::chrono::steady_clock::now();
    cudaEvent_t e0, e1;
    GPU_CHECK(cudaEventCreate(&e0));
    GPU_CHECK(cudaEventCreate(&e1));
    int copy = 0;
    for (int i = 0; i < 3; i++) launch(p, d, M, copy++); // warm-up: module load, cuBLAS heuristics
    GPU_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 3; i++) launch(p, d, M, copy++);
    GPU_CHECK(cudaEventRecord(e1));
    GPU_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    double est_us = ms * 1000.0 / 3;
    // about 10 ms more of warm-up, untimed: after an idle the clocks take a few milliseconds to come back up
    const int warm = (int)std::clamp(10000.0 / std::max(est_us, 1.0), 3.0, 5000.0);
    for (int i = 0; i < warm; i++) launch(p, d, M, copy++);
    int reps = (int)std::clamp(2000.0 / std::max(est_us, 1.0), 5.0, 200.0); // about 2 ms a sample
    const double best = time_launches([&] { launch(p, d, M, copy++); }, reps, e0, e1);
    GPU_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    last_busy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return best;
}

// The sm120 family forces its profile for its own cases only; every other case runs under the profile the process
// started with (automatic, or W4A16_PROFILE, so `W4A16_PROFILE=sm80 build/bench` times the mma.sync kernels on Hopper).
void run_case(benchmark::State &state, const w4a16_layer *ly, Path p, int M, w4a16_dtype dt, const char *profile) {
    static const char *start_profile = getenv("W4A16_PROFILE");
    if (p != CUBLAS && profile) W4_CHECK(w4a16_force_profile(profile));
    int max_m = 0;
    for (int m : opt.ms) max_m = std::max(max_m, m);
    LayerData *d = layer_data(*ly, dt, max_m);
    double us = 0;
    for (auto _ : state) {
        us = time_us(p, d, M);
        state.SetIterationTime(us * 1e-6);
    }
    double fl = floor_us(M, ly->K, ly->N, opt.group);
    double bytes = (p == CUBLAS ? 2.0 * ly->K * ly->N : (double)quant_bytes(ly->K, ly->N, opt.group)) +
                   2.0 * M * ly->K + 2.0 * M * ly->N;
    Row r{ly->name,
          path_names[p],
          p == CUBLAS ? "-" : (profile ? profile : dev.info.profile),
          dt == W4A16_BF16 ? "bf16" : "fp16",
          profile != nullptr,
          M,
          ly->K,
          ly->N,
          opt.group,
          us,
          fl,
          2.0 * M * ly->N * ly->K / us * 1e-6,
          bytes / us * 1e-3};
    state.counters["us"] = us;
    state.counters["TFLOPs"] = r.tflops;
    state.counters["GBps"] = r.gbps;
    state.counters["floor_us"] = fl;
    state.counters["x_floor"] = us / fl;
    // Every row carries every counter (--benchmark_format=csv aborts otherwise): 1 on the cuBLAS row, 0 where its
    // cuBLAS row was not measured (filtered out). That row was registered, so measured, first.
    state.counters["x_cublas"] = p == CUBLAS ? 1.0 : 0.0;
    if (p != CUBLAS)
        for (const Row &c : rows)
            if (c.layer == ly->name && c.path == "cublas_fp16" && c.M == M) state.counters["x_cublas"] = us / c.us;
    keep_lowest(rows, find(r.layer, r.path.c_str(), r.dtype, M, r.forced), r);
    if (p != CUBLAS && profile) W4_CHECK(w4a16_force_profile(start_profile));
}

void register_all() {
    std::vector<const w4a16_layer *> layers;
    for (int i = 0; i < W4A16_NUM_LAYERS; i++) {
        const w4a16_layer *ly = &w4a16_layers[i];
        if (!opt.full && ly->family != 0) continue;
        if (!opt.layers.empty() && std::string(ly->name).find(opt.layers) == std::string::npos) continue;
        layers.push_back(ly);
    }
    // the sweeps registered one after another (Google Benchmark runs them in registration order) and run by one
    // RunSpecifiedBenchmarks call: a second call crashed with the packaged library
    for (int sweep = 0; sweep < opt.sweeps; sweep++)
        for (const w4a16_layer *ly : layers) {
            struct Fam {
                w4a16_dtype dt;
                const char *profile;
                std::vector<Path> paths;
                int max_m;
            };
            std::vector<Fam> fams = {{W4A16_FP16, nullptr, {CUBLAS, AWQ, MARLIN}, 1 << 30}};
            // sm120: the profile an sm_120 GPU runs, forced on this one (emulating sm_120's smaller SM where this GPU's
            // is larger), at every M, so its cost against the native profile shows where the two kernel families differ
            if (opt.sm120) fams.push_back({W4A16_FP16, "sm120", {AWQ, MARLIN}, 1 << 30});
            if (opt.bf16) fams.push_back({W4A16_BF16, nullptr, {AWQ, MARLIN}, 1 << 30});
            if (opt.bf16 && opt.sm120)
                fams.push_back({W4A16_BF16, "sm120", {MARLIN}, 1 << 30}); // after bf16: same data
            for (const Fam &f : fams)
                for (int M : opt.ms) {
                    if (M > f.max_m) continue;
                    if (f.dt == W4A16_BF16 && !opt.full && M != 1 && M != 16 && M != 64 && M != 256 && M != 4096)
                        continue;
                    std::vector<Path> paths = f.paths;
                    if (!f.profile && f.dt == W4A16_FP16 && M >= STAGED_MIN_M) {
                        paths.push_back(AWQ_STAGED);
                        paths.push_back(MARLIN_STAGED);
                    }
                    if (!f.profile && f.dt == W4A16_FP16 && opt.pdl && M <= 256) paths.push_back(MARLIN_PLAIN);
                    for (Path p : paths) {
                        std::string name = std::string(path_names[p]) + "/" + ly->name + "/M=" + std::to_string(M) +
                                           "/" + (f.dt == W4A16_BF16 ? "bf16" : "fp16") + "/" +
                                           (p == CUBLAS ? "-"
                                            : f.profile ? f.profile
                                                        : "auto") +
                                           (opt.sweeps > 1 ? "/sweep:" + std::to_string(sweep + 1) : "");
                        benchmark::RegisterBenchmark(name.c_str(), run_case, ly, p, M, f.dt, f.profile)
                            ->UseManualTime()
                            ->Iterations(1)
                            ->Unit(benchmark::kMicrosecond);
                    }
                }
        }
}

void summary() {
    printf("\n== w4a16 summary on %s (profile %s): ceilings measured here: copy %.2f TB/s, cuBLAS fp16 %.0f TFLOP/s\n",
           dev.info.name, dev.info.profile, dev.copy_tbps, dev.cublas_tflops);
    printf("   times in us (median); x_floor = time / floor; awq/marlin and marlin/cublas are time ratios (lower is "
           "better for the first path)\n");
    if (opt.sm120)
        printf("   sm120/na = the Marlin path under the forced sm120 profile / under the native one (where an SM has "
               "more shared memory than sm_120's, it is held to sm_120's: W4A16_LOG=1 prints the carveout); "
               "s120 bf/fp = its bf16 / fp16 time\n");
    printf("   awq_st, mar_st = the paths with a staged workspace (M >= %d); mst/cubl = mar_st / cublas\n",
           STAGED_MIN_M);
    printf("   %s\n", opt.pdl ? "w4a16 GEMMs launched with W4A16_FLAG_PDL (programmatic dependent launch, sm_90+); "
                                "plain/pdl = the Marlin path launched without it / with it (M <= 256)"
                              : "w4a16 GEMMs launched without W4A16_FLAG_PDL (--pdl=0)");
    printf("%-22s %5s %9s %9s %9s %9s %8s %8s %9s %10s %8s %8s %10s %9s %9s %8s %9s\n", "layer", "M", "floor", "cublas",
           "awq", "marlin", "marl/fl", "awq/fl", "awq/marl", "marl/cubl", "sm120/na", "bf16/fp16", "s120 bf/fp",
           "awq_st", "mar_st", "mst/cubl", "plain/pdl");
    std::string last;
    for (const Row &r : rows) {
        if (r.path != "cublas_fp16" || r.dtype != "fp16") continue;
        const Row *a = find(r.layer, "awq", "fp16", r.M, false), *m = find(r.layer, "marlin", "fp16", r.M, false);
        const Row *s = find(r.layer, "marlin", "fp16", r.M, true), *b = find(r.layer, "marlin", "bf16", r.M, false);
        if (!a || !m) continue;
        const Row *as = find(r.layer, "awq_staged", "fp16", r.M, false),
                  *ms = find(r.layer, "marlin_staged", "fp16", r.M, false);
        const Row *mp = find(r.layer, "marlin_plain", "fp16", r.M, false);
        const Row *sb = find(r.layer, "marlin", "bf16", r.M, true);
        char sm[16] = "-", bf[16] = "-", sbf[16] = "-", au[16] = "-", mu[16] = "-", sc[16] = "-", pl[16] = "-";
        if (mp) snprintf(pl, sizeof pl, "%.2f", mp->us / m->us);
        if (s) snprintf(sm, sizeof sm, "%.2f", s->us / m->us);
        if (b) snprintf(bf, sizeof bf, "%.2f", b->us / m->us);
        if (sb && s) snprintf(sbf, sizeof sbf, "%.2f", sb->us / s->us);
        if (as) snprintf(au, sizeof au, "%.1f", as->us);
        if (ms) snprintf(mu, sizeof mu, "%.1f", ms->us);
        if (ms) snprintf(sc, sizeof sc, "%.2f", ms->us / r.us);
        printf("%-22s %5d %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f %9.2f %10.2f %8s %8s %10s %9s %9s %8s %9s\n",
               r.layer.c_str(), r.M, r.floor_us, r.us, a->us, m->us, m->us / r.floor_us, a->us / r.floor_us,
               a->us / m->us, m->us / r.us, sm, bf, sbf, au, mu, sc, pl);
    }
}

void write_json() {
    FILE *f = fopen(opt.json.c_str(), "w");
    if (!f) {
        fprintf(stderr, "bench: cannot write %s\n", opt.json.c_str());
        return;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"profile\": \"%s\",\n  \"w4a16_version\": \"%s\",\n", dev.info.name,
            dev.info.profile, w4a16_version_string());
    fprintf(f,
            "  \"copy_tbps\": %.4f,\n  \"cublas_fp16_tflops\": %.2f,\n  \"group_size\": %d,\n  \"pdl\": %s,\n  "
            "\"rows\": [\n",
            dev.copy_tbps, dev.cublas_tflops, opt.group, opt.pdl ? "true" : "false");
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &r = rows[i];
        fprintf(f,
                "    {\"layer\": \"%s\", \"path\": \"%s\", \"profile\": \"%s\", \"forced\": %s, \"dtype\": \"%s\", "
                "\"M\": %d, \"K\": %d, "
                "\"N\": %d, \"us\": %.3f, \"floor_us\": %.3f, \"tflops\": %.3f, \"gbps\": %.1f}%s\n",
                r.layer.c_str(), r.path.c_str(), r.profile.c_str(), r.forced ? "true" : "false", r.dtype.c_str(), r.M,
                r.K, r.N, r.us, r.floor_us, r.tflops, r.gbps, i + 1 < rows.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("\nwrote %s (%zu rows)\n", opt.json.c_str(), rows.size());
}

bool parse_flag(const char *arg) {
    auto val = [&](const char *name) -> const char * {
        size_t n = strlen(name);
        return strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : nullptr;
    };
    const char *v;
    if (strcmp(arg, "--full") == 0)
        opt.full = true;
    else if ((v = val("--bf16")))
        opt.bf16 = atoi(v) != 0;
    else if ((v = val("--sm120")))
        opt.sm120 = atoi(v) != 0;
    else if ((v = val("--settle")))
        opt.settle = atoi(v) != 0;
    else if ((v = val("--pdl")))
        opt.pdl = atoi(v) != 0;
    else if ((v = val("--group")))
        opt.group = atoi(v);
    else if ((v = val("--sweeps")))
        opt.sweeps = std::max(1, atoi(v));
    else if ((v = val("--layers")))
        opt.layers = v;
    else if ((v = val("--json")))
        opt.json = v;
    else if ((v = val("--m"))) {
        opt.ms.clear();
        for (const char *p = v; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) opt.ms.push_back(atoi(p));
    } else
        return false;
    return true;
}

} // namespace

int main(int argc, char **argv) {
    std::vector<char *> rest = {argv[0]};
    for (int i = 1; i < argc; i++)
        if (!parse_flag(argv[i])) rest.push_back(argv[i]);
    if (opt.ms.empty()) opt.ms.assign(w4a16_bench_m, w4a16_bench_m + W4A16_NUM_BENCH_M);
    w4a16_status s = w4a16_get_device_info(0, &dev.info);
    if (s != W4A16_OK || !dev.info.supported) {
        fprintf(stderr, "bench: no usable CUDA GPU found: %s\n",
                s != W4A16_OK ? w4a16_last_error_message() : dev.info.reason);
        return 1;
    }
    BLAS_CHECK(cublasCreate(&dev.blas));
    W4_CHECK(w4a16_workspace_size(&dev.ws_bytes));
    dev.ws = gpu_alloc(dev.ws_bytes);
    GPU_CHECK(cudaMemset(dev.ws, 0, dev.ws_bytes));
    for (int i = 0; i < W4A16_NUM_LAYERS; i++) {
        size_t b;
        W4_CHECK(w4a16_workspace_size_staged(w4a16_layers[i].N, w4a16_layers[i].K, &b));
        dev.ws_staged_bytes = std::max(dev.ws_staged_bytes, b);
    }
    dev.ws_staged = gpu_alloc(dev.ws_staged_bytes);
    GPU_CHECK(cudaMemset(dev.ws_staged, 0, dev.ws_staged_bytes));
    const Ceilings ceil = measure_ceilings(dev.blas);
    dev.copy_tbps = ceil.copy_tbps;
    dev.cublas_tflops = ceil.cublas_tflops;
    printf("w4a16 %s on %s: %s\n", w4a16_version_string(), dev.info.name, dev.info.reason);
    register_all();
    int n = (int)rest.size();
    benchmark::Initialize(&n, rest.data());
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    free_all();
    summary();
    write_json();
    cudaFree(dev.ws);
    cudaFree(dev.ws_staged);
    cublasDestroy(dev.blas);
    return 0;
}
