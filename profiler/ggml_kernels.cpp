// hrm profile's ggml CPU kernel probe: the seconds a ggml CPU matmul takes per weight element,
// for one weight type, thread count and rows per weight (tokens per matrix), with the weights
// placed where llama.cpp places them (an extra "repack" buffer type when the CPU backend takes
// the op there, else the plain CPU buffer) and cycled through a pool of `pool_mib` so that each
// graph reads its weights as a model's step does. Built by profiler/ggml_cpu.py against the
// user's own llama.cpp tree (headers + build/bin libraries); hrm's own code, no ggml source.
//
//   ggml_kernels TYPE THREADS OP POOL_MIB REPEATS ROWS[,ROWS...]
//     OP: mm   (MUL_MAT, weights [K, N], ROWS tokens)
//         mmid (MUL_MAT_ID, experts [K, N, E], each expert given exactly ROWS tokens)
//         node (a chain of ROWS tiny ADDs of K floats: the fixed cost of one graph node, the
//               threads' barrier after it; TYPE and POOL_MIB are ignored)
//         ew:KIND (ew_ops(ROWS) independent copies of one elementwise op of a layer's graph over ROWS tokens,
//               each on its own f32 input of magnitude 0.5-1.5 (a chain drifts toward denormals):
//               norm  RMS_NORM then MUL by a weight [K] (the CPU backend fuses the pair), on [K, ROWS]
//               add   ADD of two [K, ROWS] (residuals, the routed experts' sum)
//               mulw  MUL of [K, TOPK, ROWS] by the router weights [1, TOPK, ROWS] (a broadcast per row)
//               glu   SWIGLU of gate and up [K, ROWS] (the experts' and FFN's activation)
//               kv16  SET_ROWS of [K, ROWS] f32 into an f16 cache of 4096 rows (the K/V store)
//               rope  ROPE (NEOX) of [128, K/128, ROWS]
//               softmax  SOFT_MAX of router logits [EW_ROUTER_EXPERTS, ROWS]
//               concat   CONCAT of a permuted [K/16, 16, ROWS] and a [32, 16, ROWS] (MLA's Q and K)
//               seconds per output element; TYPE and POOL_MIB are ignored)
//         fa1, fat (flash attention of 1 or FA_TILE_ROWS query rows per head over ROWS cached tokens,
//               FA_HEADS query heads on FA_KV_HEADS f16 K/V heads of FA_DIM: seconds per
//               (query row x head x cached token x (dk + dv)); TYPE and POOL_MIB are ignored)
//         clock (ROWS dependent register adds, one cycle each: seconds per cycle of one core under load;
//               TYPE, THREADS and POOL_MIB are ignored)
//   prints one line per ROWS: "rows <r> s_per_elem <median> spread <(max-min)/median> nodes <M>"
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// the weight shape: [K, N] per matrix (per expert), E experts of which TOPK per token; K and N
// may be set by HRM_PROBE_K / HRM_PROBE_N (a model's own tensor shape); HRM_PROBE_NO_REPACK=1
// keeps the weights in the plain CPU buffer (no repacked layout); HRM_PROBE_HEADS=H makes a MUL_MAT
// weight one [K, N] matrix per head, [K, N, H], multiplied by activations [K, H, rows] permuted to
// [K, rows, H], as MLA's absorbed k_b / v_b are (src/models/deepseek2.cpp:556-560,
// src/llama-graph.cpp:2678-2679; a 3-D weight stays out of the repack buffer, repack.cpp:5191-5196)
static int K = 1024, N = 1024, HEADS = 1;
static int E = 8, TOPK = 2;
// elementwise ops per graph: enough that the graph's own start (waking the threads) is a small
// share of a one-row point, few enough that a 512-row point's inputs stay near the caches; and
// the cells of the f16 cache the K/V store writes into
static int ew_ops(int rows) { return std::min(256, std::max(8, 4096 / std::max(1, rows))); }
static const int EW_CACHE_ROWS = 4096;
// the router's row the softmax probe normalizes (HRM_PROBE_E overrides): 64 experts, between
// Mixtral's 8 and DeepSeek-V3's 256; its cost per element falls as rows lengthen
static const int EW_ROUTER_EXPERTS = 64;
static const int FA_HEADS = 16, FA_KV_HEADS = 4, FA_DIM = 128, FA_TILE_ROWS = 64, FA_LAYERS = 8;

static ggml_type type_by_name(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && strcmp(n, name) == 0 && ggml_blck_size((ggml_type) t) > 0) return (ggml_type) t;
    }
    fprintf(stderr, "unknown ggml type %s\n", name);
    exit(2);
}

// the median seconds of `repeats` computations of `gf` after one warm-up; `spread` gets (max - min) / median
static double median_time(ggml_backend_t backend, ggml_cgraph * gf, int repeats, double * spread) {
    std::vector<double> times;
    for (int r = 0; r < repeats + 1; r++) {
        auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, gf);
        auto t1 = std::chrono::steady_clock::now();
        if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    *spread = (times.back() - times.front()) / med;
    return med;
}

int main(int argc, char ** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TYPE THREADS mm|mmid POOL_MIB REPEATS ROWS[,ROWS...]\n", argv[0]);
        return 2;
    }
    if (getenv("HRM_PROBE_K")) K = atoi(getenv("HRM_PROBE_K"));
    if (getenv("HRM_PROBE_N")) N = atoi(getenv("HRM_PROBE_N"));
    if (getenv("HRM_PROBE_E")) E = atoi(getenv("HRM_PROBE_E"));
    if (getenv("HRM_PROBE_TOPK")) TOPK = atoi(getenv("HRM_PROBE_TOPK"));
    if (getenv("HRM_PROBE_HEADS")) HEADS = atoi(getenv("HRM_PROBE_HEADS"));
    const ggml_type type = type_by_name(argv[1]);
    const int threads = atoi(argv[2]);
    const bool mmid = strcmp(argv[3], "mmid") == 0;
    const double pool_mib = atof(argv[4]);
    const int repeats = atoi(argv[5]);
    std::vector<int> rows_list;
    for (char * s = strtok(argv[6], ","); s; s = strtok(nullptr, ",")) rows_list.push_back(atoi(s));

    if (strcmp(argv[3], "clock") == 0) {
        // the core's clock under load: ROWS dependent 64-bit adds (one cycle each on every x86 core
        // since the P6: Agner Fog's instruction tables, ADD r,r latency 1), seconds per add = 1 / Hz;
        // what converts this host's per-element kernel times to cycles (hrm.machine.ggml_prior)
        for (int n : rows_list) {
            std::vector<double> times;
            for (int r = 0; r < atoi(argv[5]) + 1; r++) {
                uint64_t x = 1;
                auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < n; i++) {
                    asm volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                                 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"((uint64_t) i));
                }
                auto t1 = std::chrono::steady_clock::now();
                if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count() / (8.0 * n));
            }
            std::sort(times.begin(), times.end());
            const double med = times[times.size() / 2];
            printf("rows %d s_per_elem %.6e spread %.4f nodes %d buffer %s\n", n, med,
                   (times.back() - times.front()) / med, 1, "CPU");
        }
        return 0;
    }
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    ggml_backend_cpu_set_n_threads(backend, threads);
    if (strncmp(argv[3], "fa1", 3) == 0 || strncmp(argv[3], "fat", 3) == 0) {
        // fa1[:DK:DV:HEADS:KV_HEADS]: the head shape, FA_DIM/FA_HEADS/FA_KV_HEADS by default
        int DK = FA_DIM, DV = FA_DIM, HQ = FA_HEADS, HKV = FA_KV_HEADS;
        if (argv[3][3] == ':') sscanf(argv[3] + 4, "%d:%d:%d:%d", &DK, &DV, &HQ, &HKV);
        const int nq = strncmp(argv[3], "fa1", 3) == 0 ? 1 : FA_TILE_ROWS;
        for (int nkv : rows_list) {
            const int n = FA_LAYERS * 4 + 16;
            ggml_init_params gp = {ggml_tensor_overhead() * n + ggml_graph_overhead_custom(n, false), nullptr, true};
            ggml_context * gctx = ggml_init(gp);
            ggml_cgraph * gf = ggml_new_graph_custom(gctx, n, false);
            ggml_tensor * q = ggml_new_tensor_3d(gctx, GGML_TYPE_F32, DK, nq, HQ);
            ggml_set_input(q);
            ggml_tensor * mask = nullptr;
            if (nq > 1) { mask = ggml_new_tensor_2d(gctx, GGML_TYPE_F16, nkv, nq); ggml_set_input(mask); }
            std::vector<ggml_tensor *> kv;
            for (int l = 0; l < FA_LAYERS; l++) {  // one K and V per layer, as a model's cache
                // the cache as llama.cpp lays it out: one row of every KV head's values per cell
                // ([DK*HKV, cells]), attended through views whose rows of one head are a whole
                // cell apart (src/llama-kv-cache.cpp:1276-1293 get_k, :1296-1316 get_v without
                // v_trans, permuted in build_attn_mha; ggml-org/llama.cpp@0c1e5709). Contiguous
                // per-head K/V ran 1.1-2.8x faster per element here (docs/validation/ground_truth.md §1.4).
                ggml_tensor * kc = ggml_new_tensor_2d(gctx, GGML_TYPE_F16, DK * HKV, nkv);
                ggml_tensor * vc = ggml_new_tensor_2d(gctx, GGML_TYPE_F16, DV * HKV, nkv);
                ggml_set_input(kc); ggml_set_input(vc);
                kv.push_back(kc); kv.push_back(vc);
                ggml_tensor * k = ggml_view_3d(gctx, kc, DK, nkv, HKV, kc->nb[1], ggml_row_size(GGML_TYPE_F16, DK), 0);
                ggml_tensor * v = ggml_view_3d(gctx, vc, DV, nkv, HKV, vc->nb[1], ggml_row_size(GGML_TYPE_F16, DV), 0);
                ggml_tensor * y = ggml_flash_attn_ext(gctx, q, k, v, mask, 0.088f, 0.0f, 0.0f);
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
            }
            ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
            ggml_gallocr_alloc_graph(galloc, gf);
            std::vector<float> qv((size_t) DK * nq * HQ, 0.01f);
            ggml_backend_tensor_set(q, qv.data(), 0, qv.size() * sizeof(float));
            std::vector<ggml_fp16_t> kvv((size_t) std::max(DK, DV) * nkv * HKV, ggml_fp32_to_fp16(0.01f));
            for (auto * t : kv) ggml_backend_tensor_set(t, kvv.data(), 0, ggml_nbytes(t));
            if (mask) {
                std::vector<ggml_fp16_t> mv((size_t) nkv * nq, ggml_fp32_to_fp16(0.0f));
                ggml_backend_tensor_set(mask, mv.data(), 0, mv.size() * sizeof(ggml_fp16_t));
            }
            double spread = 0.0;
            const double med = median_time(backend, gf, repeats, &spread);
            const double elems = (double) FA_LAYERS * nq * HQ * nkv * (double) (DK + DV);
            printf("rows %d s_per_elem %.6e spread %.4f nodes %d buffer CPU\n", nkv, med / elems,
                   spread, FA_LAYERS);
            fflush(stdout);
            ggml_gallocr_free(galloc);
            ggml_free(gctx);
        }
        ggml_backend_free(backend);
        return 0;
    }
    if (strncmp(argv[3], "ew:", 3) == 0) {
        const std::string kind = argv[3] + 3;
        static const char * kinds[] = {"norm", "add", "mulw", "glu", "kv16", "rope", "softmax", "concat"};
        if (std::none_of(std::begin(kinds), std::end(kinds), [&](const char * k) { return kind == k; })) {
            fprintf(stderr, "unknown elementwise kind %s\n", kind.c_str());
            return 2;
        }
        for (int rows : rows_list) {
            const int EW_OPS = ew_ops(rows);
            const int n = EW_OPS * 4 + 32;
            ggml_init_params gp = {ggml_tensor_overhead() * n + ggml_graph_overhead_custom(n, false), nullptr, true};
            ggml_context * gctx = ggml_init(gp);
            ggml_cgraph * gf = ggml_new_graph_custom(gctx, n, false);
            std::vector<ggml_tensor *> inputs;
            auto input = [&](ggml_type t, int64_t a, int64_t b, int64_t c) {
                ggml_tensor * x = ggml_new_tensor_3d(gctx, t, a, b, c);
                ggml_set_input(x);
                inputs.push_back(x);
                return x;
            };
            double elems = 0.0;
            if (kind == "norm" || kind == "add" || kind == "glu") {
                ggml_tensor * g = kind == "norm" ? input(GGML_TYPE_F32, K, 1, 1) : input(GGML_TYPE_F32, K, rows, 1);
                for (int i = 0; i < EW_OPS; i++) {  // independent ops: a chain drifts its values
                    ggml_tensor * x = input(GGML_TYPE_F32, K, rows, 1);
                    ggml_tensor * y = kind == "norm" ? ggml_mul(gctx, ggml_rms_norm(gctx, x, 1e-6f), g)
                                    : kind == "add"  ? ggml_add(gctx, x, g) : ggml_swiglu_split(gctx, x, g);
                    ggml_set_output(y);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) K * rows;
            } else if (kind == "mulw") {
                ggml_tensor * w = input(GGML_TYPE_F32, 1, TOPK, rows);
                for (int i = 0; i < EW_OPS; i++) {
                    ggml_tensor * y = ggml_mul(gctx, input(GGML_TYPE_F32, K, TOPK, rows), w);
                    ggml_set_output(y);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) K * TOPK * rows;
            } else if (kind == "kv16") {
                ggml_tensor * idx = input(GGML_TYPE_I64, rows, 1, 1);
                ggml_tensor * cache = input(GGML_TYPE_F16, K, EW_CACHE_ROWS, 1);
                for (int i = 0; i < EW_OPS; i++) {
                    ggml_tensor * y = ggml_set_rows(gctx, cache, input(GGML_TYPE_F32, K, rows, 1), idx);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) K * rows;
            } else if (kind == "rope") {
                ggml_tensor * pos = input(GGML_TYPE_I32, rows, 1, 1);
                for (int i = 0; i < EW_OPS; i++) {
                    ggml_tensor * y = ggml_rope_ext(gctx, input(GGML_TYPE_F32, 128, std::max(1, K / 128), rows), pos,
                                                    nullptr, 128, GGML_ROPE_TYPE_NEOX, 4096, 10000.0f, 1.0f, 0.0f,
                                                    1.0f, 32.0f, 1.0f);
                    ggml_set_output(y);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) 128 * std::max(1, K / 128) * rows;
            } else if (kind == "softmax") {
                const int experts = getenv("HRM_PROBE_E") ? E : EW_ROUTER_EXPERTS;
                for (int i = 0; i < EW_OPS; i++) {
                    ggml_tensor * y = ggml_soft_max(gctx, input(GGML_TYPE_F32, experts, rows, 1));
                    ggml_set_output(y);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) experts * rows;
            } else {  // concat
                const int heads = 16, width = std::max(1, K / heads), rope = 32;
                for (int i = 0; i < EW_OPS; i++) {
                    ggml_tensor * a = ggml_permute(gctx, input(GGML_TYPE_F32, width, rows, heads), 0, 2, 1, 3);
                    ggml_tensor * b = input(GGML_TYPE_F32, rope, heads, rows);
                    ggml_tensor * y = ggml_concat(gctx, a, b, 0);
                    ggml_set_output(y);
                    ggml_build_forward_expand(gf, y);
                }
                elems = (double) (width + rope) * heads * rows;
            }
            ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
            ggml_gallocr_alloc_graph(galloc, gf);
            for (ggml_tensor * t : inputs) {
                std::vector<uint8_t> bytes(ggml_nbytes(t), 0);
                if (t->type == GGML_TYPE_F32) {
                    float * f = (float *) bytes.data();
                    // activations of magnitude 0.5-1.5, alternating sign: a chain of ops keeps
                    // them normal floats (values shrinking toward denormals ran 6x slower here)
                    for (size_t j = 0; j < bytes.size() / 4; j++)
                        f[j] = (j % 2 ? 1.0f : -1.0f) * (0.5f + (float) (j % 97) / 97.0f);
                } else if (t->type == GGML_TYPE_I64) {
                    int64_t * r = (int64_t *) bytes.data();
                    for (size_t j = 0; j < bytes.size() / 8; j++) r[j] = (int64_t) j;
                } else if (t->type == GGML_TYPE_I32) {
                    int32_t * r = (int32_t *) bytes.data();
                    for (size_t j = 0; j < bytes.size() / 4; j++) r[j] = (int32_t) j;
                }
                ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
            }
            double spread = 0.0;
            const double med = median_time(backend, gf, repeats, &spread);
            printf("rows %d s_per_elem %.6e spread %.4f nodes %d buffer CPU\n", rows, med / (elems * EW_OPS),
                   spread, EW_OPS);
            fflush(stdout);
            ggml_gallocr_free(galloc);
            ggml_free(gctx);
        }
        ggml_backend_free(backend);
        return 0;
    }
    if (strcmp(argv[3], "node") == 0) {
        for (int nodes : rows_list) {
            ggml_init_params gp = {ggml_tensor_overhead() * (nodes + 8) + ggml_graph_overhead_custom(nodes + 8, false),
                                   nullptr, true};
            ggml_context * gctx = ggml_init(gp);
            ggml_cgraph * gf = ggml_new_graph_custom(gctx, nodes + 8, false);
            ggml_tensor * x = ggml_new_tensor_1d(gctx, GGML_TYPE_F32, K);
            ggml_set_input(x);
            ggml_tensor * y = x;
            for (int i = 0; i < nodes; i++) y = ggml_add(gctx, y, x);
            ggml_set_output(y);
            ggml_build_forward_expand(gf, y);
            ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
            ggml_gallocr_alloc_graph(galloc, gf);
            std::vector<float> xv(K, 0.01f);
            ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));
            double spread = 0.0;
            const double med = median_time(backend, gf, repeats, &spread);
            printf("rows %d s_per_elem %.6e spread %.4f nodes %d buffer CPU\n", nodes, med / nodes,
                   spread, nodes);
            ggml_gallocr_free(galloc);
            ggml_free(gctx);
        }
        ggml_backend_free(backend);
        return 0;
    }

    const int64_t experts = mmid ? E : HEADS;
    const size_t mat_bytes = ggml_row_size(type, K) * N * experts;
    const int pool = std::max<int>(1, (int) (pool_mib * 1024 * 1024 / mat_bytes));

    // weights: one context, allocated in the first buffer type the CPU device runs the op from
    ggml_init_params wp = {ggml_tensor_overhead() * (pool + 8), nullptr, true};
    ggml_context * wctx = ggml_init(wp);
    std::vector<ggml_tensor *> w(pool);
    for (int i = 0; i < pool; i++) w[i] = ggml_new_tensor_3d(wctx, type, K, N, experts);

    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    const char * placed = "CPU";
    auto reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    // HRM_PROBE_NO_REPACK=1: the plain CPU buffer, where llama.cpp keeps CPU weights when a GPU's
    // host buffer type comes first (src/llama-model.cpp make_cpu_buft_list: ACCEL, GPU host, CPU extra)
    if (get_extra && !getenv("HRM_PROBE_NO_REPACK")) {
        for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; b++) {
            // probe as llama.cpp's loader does: a dummy buffer of that type, then supports_op
            ggml_init_params pp = {ggml_tensor_overhead() * 8, nullptr, true};
            ggml_context * pctx = ggml_init(pp);
            ggml_tensor * pw = ggml_new_tensor_3d(pctx, type, K, N, experts);
            ggml_tensor * px = ggml_new_tensor_3d(pctx, GGML_TYPE_F32, K, mmid ? TOPK : 8, mmid ? 8 : experts);
            ggml_tensor * op;
            if (mmid) {
                ggml_tensor * ids = ggml_new_tensor_2d(pctx, GGML_TYPE_I32, TOPK, 8);
                op = ggml_mul_mat_id(pctx, pw, px, ids);
            } else {
                op = ggml_mul_mat(pctx, pw, px);
            }
            ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
            pw->buffer = dummy;
            const bool ok = ggml_backend_dev_supports_op(dev, op);
            ggml_backend_buffer_free(dummy);
            ggml_free(pctx);
            if (ok) { buft = *b; placed = ggml_backend_buft_name(*b); break; }
        }
    }
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    {
        std::mt19937 rng(1);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> src((size_t) K * N * experts);
        for (auto & v : src) v = u(rng);
        std::vector<uint8_t> q(mat_bytes);
        ggml_quantize_init(type);
        // one quantized matrix copied to every slot of the pool: the kernels' speed does not
        // depend on the values, and quantizing a GiB of K-quants would take minutes
        if (type == GGML_TYPE_F32) memcpy(q.data(), src.data(), mat_bytes);
        else {
            // the i-quants' quantizers want an importance matrix (ggml.c ggml_quantize_requires_imatrix):
            // a uniform one, as if every column mattered equally; the kernels' speed does not depend on it
            std::vector<float> imatrix(K, 1.0f);
            ggml_quantize_chunk(type, src.data(), q.data(), 0, N * experts, K,
                                ggml_quantize_requires_imatrix(type) ? imatrix.data() : nullptr);
        }
        for (int i = 0; i < pool; i++) ggml_backend_tensor_set(w[i], q.data(), 0, mat_bytes);
    }
    fprintf(stderr, "type %s threads %d op %s pool %d x %.2f MiB in %s\n", argv[1], threads, argv[3], pool,
            mat_bytes / 1048576.0, placed);

    for (int rows : rows_list) {
        const int tokens = mmid ? rows * E / TOPK : rows;  // every expert gets exactly `rows` tokens
        // past 8 rows a matmul is compute-bound and no longer streams: fewer matrices keep each
        // point near the same time (at least 4, so a graph still crosses several weights, but
        // never more than the pool holds: a small pool of large matrices cycles fewer)
        const int used = std::min(pool, std::max(4, std::min(pool, pool * 8 / std::max(8, rows))));
        ggml_init_params gp = {ggml_tensor_overhead() * (4 * pool + 16) + ggml_graph_overhead_custom(4 * pool + 16, false),
                               nullptr, true};
        ggml_context * gctx = ggml_init(gp);
        ggml_cgraph * gf = ggml_new_graph_custom(gctx, 4 * pool + 16, false);
        ggml_tensor * x = mmid ? ggml_new_tensor_3d(gctx, GGML_TYPE_F32, K, TOPK, tokens)
                        : experts == 1 ? ggml_new_tensor_3d(gctx, GGML_TYPE_F32, K, tokens, 1)
                                       : ggml_new_tensor_3d(gctx, GGML_TYPE_F32, K, experts, tokens);
        ggml_set_input(x);
        ggml_tensor * xin = mmid || experts == 1 ? x : ggml_permute(gctx, x, 0, 2, 1, 3);
        ggml_tensor * ids = nullptr;
        if (mmid) { ids = ggml_new_tensor_2d(gctx, GGML_TYPE_I32, TOPK, tokens); ggml_set_input(ids); }
        for (int i = 0; i < used; i++) {
            ggml_tensor * y = mmid ? ggml_mul_mat_id(gctx, w[i], x, ids) : ggml_mul_mat(gctx, w[i], xin);
            ggml_set_output(y);
            ggml_build_forward_expand(gf, y);
        }
        ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        ggml_gallocr_alloc_graph(galloc, gf);
        std::vector<float> xv((size_t) K * (mmid ? TOPK : experts) * tokens, 0.01f);
        ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));
        if (mmid) {
            std::vector<int32_t> iv((size_t) TOPK * tokens);
            for (int t = 0; t < tokens; t++)
                for (int j = 0; j < TOPK; j++) iv[(size_t) t * TOPK + j] = (t * TOPK + j) % E;
            ggml_backend_tensor_set(ids, iv.data(), 0, iv.size() * sizeof(int32_t));
        }
        double spread = 0.0;
        const double med = median_time(backend, gf, repeats, &spread);
        const double elems = (double) K * N * experts * used;
        printf("rows %d s_per_elem %.6e spread %.4f nodes %d buffer %s\n", rows, med / elems,
               spread, used, placed);
        fflush(stdout);
        ggml_gallocr_free(galloc);
        ggml_free(gctx);
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(backend);
    return 0;
}
