// Seconds per ggml op kind of one prompt's prefill, through llama.cpp's own scheduler: the
// context's eval callback (llama_context_params.cb_eval, ggml_backend_sched_eval_callback)
// observes every node, so the scheduler computes the graph one node at a time and synchronizes
// before each report (ggml/src/ggml-backend.cpp:1814-1850); the time between two reports is that
// node's. Each node costs a thread-pool start and stop more than in a whole graph, and fused ops
// (rms_norm + mul) run apart: the split is what the kernels take, not the engine's total.
//
// Build against a llama.cpp tree (ground_truth.md §1.15 "Reproduce"):
//   g++ -O2 -std=c++17 -I$LC/include -I$LC/ggml/include op_times.cpp -L$LC/build/bin \
//       -lllama -lggml -lggml-base -Wl,-rpath,$LC/build/bin -o op_times
// Run: op_times MODEL.gguf THREADS PROMPT_TOKENS UBATCH REPEATS [GEN_TOKENS]
// Prints one JSON line per repeat after the first (a warm-up): {"phase": "prefill", "total": s,
// "op": seconds, ...} by op kind, MUL_MAT_ID and MUL_MAT split by the weight's name without its
// layer ("ffn_moe_up", ...); with GEN_TOKENS, a second line per repeat for that many one-token
// decode steps after the prompt ({"phase": "decode", ...}, summed over the steps); "nodes" counts
// the nodes of each kind observed.
#include "ggml.h"
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

using clock_type = std::chrono::steady_clock;

struct Times {
    clock_type::time_point last;
    std::map<std::string, double> seconds;
    std::map<std::string, int> nodes;
};

static std::string kind_of(const ggml_tensor * t) {
    std::string op = ggml_op_desc(t);
    if (t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_MUL_MAT_ID) {
        std::string name = t->name;
        const auto dash = name.rfind('-');  // "ffn_moe_up-3": the layer's index after the dash
        if (dash != std::string::npos) name = name.substr(0, dash);
        op += ":" + name;
    }
    return op;
}

static bool observe(ggml_tensor * t, bool ask, void * user_data) {
    if (ask) return true;  // every node: computed alone, then reported here
    auto * times = static_cast<Times *>(user_data);
    const auto now = clock_type::now();
    const std::string kind = kind_of(t);
    times->seconds[kind] += std::chrono::duration<double>(now - times->last).count();
    times->nodes[kind] += 1;
    times->last = now;
    return true;
}

int main(int argc, char ** argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS PROMPT_TOKENS UBATCH REPEATS [GEN_TOKENS]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[2]), prompt = atoi(argv[3]), ubatch = atoi(argv[4]), repeats = atoi(argv[5]);
    const int gen = argc == 7 ? atoi(argv[6]) : 0;
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    Times times;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = 2048; cp.n_ubatch = ubatch;
    cp.n_threads = threads; cp.n_threads_batch = threads;
    cp.cb_eval = observe; cp.cb_eval_user_data = &times;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::mt19937 rng(1);
    std::vector<llama_token> tokens(prompt);
    for (auto & tok : tokens) tok = (llama_token) (rng() % vocab);  // random ids, as llama-bench feeds them
    auto report = [&](const char * phase, double total) {
        printf("{\"phase\": \"%s\", \"total\": %.6f", phase, total);
        for (const auto & kv : times.seconds) printf(", \"%s\": %.6f", kv.first.c_str(), kv.second);
        printf(", \"nodes\": {");
        const char * sep = "";
        for (const auto & kv : times.nodes) { printf("%s\"%s\": %d", sep, kv.first.c_str(), kv.second); sep = ", "; }
        printf("}}\n");
        fflush(stdout);
    };
    for (int r = 0; r <= repeats; r++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        times.seconds.clear();
        times.nodes.clear();
        auto start = clock_type::now();
        times.last = start;
        if (llama_decode(ctx, llama_batch_get_one(tokens.data(), prompt)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        const double prefill = std::chrono::duration<double>(clock_type::now() - start).count();
        if (r > 0) report("prefill", prefill);  // the first repeat is a warm-up
        if (gen == 0) continue;
        times.seconds.clear();
        times.nodes.clear();
        double decode = 0.0;
        for (int i = 0; i < gen; i++) {
            llama_token next = (llama_token) (rng() % vocab);  // one sequence's next token, random as llama-bench's tg
            start = clock_type::now();
            times.last = start;
            if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
            decode += std::chrono::duration<double>(clock_type::now() - start).count();
        }
        if (r > 0) report("decode", decode);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
