// The one binding module: a small typed surface over the C kernels, re-exported by
// heteroserve_cpu/__init__.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "kernels.h"
#include "model.h"
#include "sample.h"
#include "threadpool.h"
double hs_read_bandwidth(hs_pool *pool, size_t bytes, int repeats);
}

namespace nb = nanobind;
using u8array = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using f32array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using i32array = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;

static const hs_kernels *kernels_named(const std::string &name) {
    if (name.empty()) return hs_kernels_select();
    const hs_kernels *k = hs_kernels_by_name(name.c_str());
    if (!k) throw std::invalid_argument("kernel variant '" + name + "' is not available on this CPU "
                                        "(available: " + hs_kernels_available() + ")");
    return k;
}

struct Pool {
    hs_pool *pool = nullptr;
    std::vector<int> cpus;
    Pool(const std::vector<int> &cpu_list, int threads, bool pin_caller) {
        if (threads < 1) throw std::invalid_argument("threads must be >= 1");
        if (!cpu_list.empty() && (int)cpu_list.size() != threads)
            throw std::invalid_argument("the thread count must equal the number of bound CPUs");
        cpus = cpu_list;
        pool = hs_pool_create(threads, cpus.empty() ? nullptr : cpus.data(), pin_caller);
        if (!pool) throw std::runtime_error("could not start the thread pool");
    }
    ~Pool() { hs_pool_destroy(pool); }
    int size() const { return hs_pool_size(pool); }
    unsigned long long parks() const { return hs_pool_parks(pool); }
};

// The sampler's scratch: a vocabulary's probabilities, candidates and added-to logits per pool
// thread, left uninitialized so that only the pages a sampler writes become resident (greedy
// rows without additions write none; a zero-filled vector cost 12 MiB of RSS at 16 threads and
// SmolLM2's vocabulary).
struct Scratch {
    std::unique_ptr<char[]> data;
    size_t size = 0;
    void *at_least(size_t bytes) {
        if (size < bytes) {
            data.reset(new char[bytes]);
            size = bytes;
        }
        return data.get();
    }
};

// Per-row sampling parameters as Python passes them. `add_row`/`add_id`/`add_value`: the
// logit additions of every row in one sparse list (row, token id, value); `logprobs`: empty
// (none anywhere), else per row -1 (none) or how many top log-probabilities besides the chosen
// token's.
struct SamplingArgs {
    const std::vector<float> &temperature;
    const std::vector<int> &top_k;
    const std::vector<float> &top_p;
    const std::vector<uint64_t> &state;
    const std::vector<int32_t> &add_row;
    const std::vector<int32_t> &add_id;
    const std::vector<float> &add_value;
    const std::vector<int> &logprobs;

    void check(size_t rows, size_t vocab) const {
        if (temperature.size() != rows || top_k.size() != rows || top_p.size() != rows ||
            state.size() != rows)
            throw std::invalid_argument("temperature, top_k, top_p and state need one entry per "
                                        "row");
        for (float p : top_p)
            if (!(p > 0.0f)) throw std::invalid_argument("top_p must be > 0");
        if (add_id.size() != add_row.size() || add_value.size() != add_row.size())
            throw std::invalid_argument("add_row, add_id and add_value need one entry per "
                                        "addition");
        for (size_t i = 0; i < add_row.size(); i++)
            if (add_row[i] < 0 || (size_t)add_row[i] >= rows || add_id[i] < 0 ||
                (size_t)add_id[i] >= vocab)
                throw std::invalid_argument("a logit addition's row or token id is out of range");
        if (!logprobs.empty() && logprobs.size() != rows)
            throw std::invalid_argument("logprobs needs one entry per row (or none)");
        for (int k : logprobs)
            if (k > HS_MAX_LOGPROBS)
                throw std::invalid_argument("at most 20 top log-probabilities per row");
    }
};

// One token per row of logits[rows][vocab] on the pool's threads. Returns (ids, states) with
// each row's generator state advanced, and, when log-probabilities were asked for, a third
// item: per row None or [(token id, log-probability)], the chosen token first, then the top
// ones. `scratch` grows to what the sampler needs.
static nb::tuple sample_rows(Pool &pool, const float *logits, size_t rows, size_t vocab,
                             const SamplingArgs &a, Scratch &scratch) {
    a.check(rows, vocab);
    void *work = scratch.at_least(hs_sample_scratch_bytes(pool.size(), (int)vocab));
    // The additions grouped by row (a counting sort keeps each row's in the given order).
    std::vector<size_t> start(rows + 1, 0);
    for (int32_t r : a.add_row) start[(size_t)r + 1]++;
    for (size_t r = 0; r < rows; r++) start[r + 1] += start[r];
    std::vector<int32_t> ids_by_row(a.add_row.size());
    std::vector<float> values_by_row(a.add_row.size());
    {
        std::vector<size_t> next(start.begin(), start.end() - 1);
        for (size_t i = 0; i < a.add_row.size(); i++) {
            const size_t at = next[(size_t)a.add_row[i]]++;
            ids_by_row[at] = a.add_id[i];
            values_by_row[at] = a.add_value[i];
        }
    }
    std::vector<float> lp(rows * (1 + HS_MAX_LOGPROBS));
    std::vector<int32_t> lp_id(rows * (1 + HS_MAX_LOGPROBS));
    std::vector<hs_sampling> params(rows);
    for (size_t r = 0; r < rows; r++) {
        const int n_add = (int)(start[r + 1] - start[r]);
        params[r] = {a.temperature[r], a.top_k[r], a.top_p[r], a.state[r],
                     n_add ? ids_by_row.data() + start[r] : nullptr,
                     n_add ? values_by_row.data() + start[r] : nullptr, n_add,
                     a.logprobs.empty() ? -1 : a.logprobs[r],
                     lp.data() + r * (1 + HS_MAX_LOGPROBS),
                     lp_id.data() + r * (1 + HS_MAX_LOGPROBS)};
    }
    std::vector<int32_t> ids(rows);
    int rc;
    {
        nb::gil_scoped_release release;
        rc = hs_sample_rows(pool.pool, logits, (int)rows, (int)vocab, params.data(), ids.data(),
                            work);
    }
    if (rc != 0) throw std::runtime_error("sampling failed: a row of logits has no number");
    std::vector<uint64_t> next(rows);
    for (size_t r = 0; r < rows; r++) next[r] = params[r].state;
    if (a.logprobs.empty()) return nb::make_tuple(ids, next);
    nb::list per_row;
    for (size_t r = 0; r < rows; r++) {
        if (params[r].n_logprobs < 0) {
            per_row.append(nb::none());
            continue;
        }
        nb::list entries;
        const float *v = params[r].logprob;
        const int32_t *t = params[r].logprob_id;
        for (int j = 0; j <= params[r].n_logprobs; j++)
            if (t[j] >= 0) entries.append(nb::make_tuple(t[j], v[j]));
        per_row.append(entries);
    }
    return nb::make_tuple(ids, next, per_row);
}

// NRC: 1, 2 or 4 weight rows per one-token product, 0 to choose by row width.
static int checked_nrc(int nrc) {
    if (nrc != 0 && nrc != 1 && nrc != 2 && nrc != 4)
        throw std::invalid_argument("nrc must be 0 (by row width), 1, 2 or 4, got " +
                                    std::to_string(nrc));
    return nrc;
}

struct Model {
    hs_model *m = nullptr;
    Pool *pool;
    std::vector<float> logits; // sample(): reused from step to step, as is
    Scratch scratch;
    Model(Pool &p, int n_layer, int n_embd, int n_head, int n_head_kv, int head_dim, int n_ff,
          int n_vocab, int rope_neox, float eps, float rope_base, const std::string &kernels,
          int nrc)
        : pool(&p) {
        hs_config c{n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, rope_neox, eps,
                    rope_base};
        m = hs_model_create(&c, p.pool, kernels_named(kernels), checked_nrc(nrc));
        if (!m) throw std::invalid_argument("unsupported model shape (dimensions must be multiples "
                                            "of 32 and heads a multiple of KV heads)");
    }
    ~Model() { hs_model_destroy(m); }
    void set(int which, int layer, int type, int rows, int cols, u8array data) {
        if (data.size() < hs_row_bytes(type, cols) * (size_t)rows)
            throw std::invalid_argument("tensor buffer smaller than rows x row bytes");
        if (hs_model_set(m, which, layer, type, rows, cols, data.data()) != 0)
            throw std::invalid_argument("tensor " + std::to_string(which) + " of layer " +
                                        std::to_string(layer) + ": unexpected shape or type");
    }
    void alloc_kv(int n_blocks, int block_size) {
        if (n_blocks < 1 || block_size < 1 || hs_model_alloc_kv(m, n_blocks, block_size) != 0)
            throw std::runtime_error("could not allocate the KV cache");
    }
    // Runs one step; logits of the logit_index tokens into `out` ([n_logits][n_vocab]).
    void run(i32array tokens, i32array pos, i32array seq, i32array block_tables,
             i32array logit_index, float *out) {
        const int n = (int)tokens.size();
        if ((int)pos.size() != n || (int)seq.size() != n || block_tables.ndim() != 2)
            throw std::invalid_argument("tokens, pos and seq must have one entry per token; "
                                        "block_tables is [n_seqs, max_blocks]");
        int rc;
        {
            nb::gil_scoped_release release;
            rc = hs_model_forward(m, n, tokens.data(), pos.data(), seq.data(), block_tables.data(),
                                  (int)block_tables.shape(0), (int)block_tables.shape(1),
                                  logit_index.data(), (int)logit_index.size(), out);
        }
        if (rc != 0)
            throw std::invalid_argument("forward: a token, position, sequence, block or logit "
                                        "index is out of range");
    }
    nb::ndarray<nb::numpy, float, nb::ndim<2>> forward(i32array tokens, i32array pos, i32array seq,
                                                       i32array block_tables, i32array logit_index) {
        const size_t n_logits = logit_index.size(), vocab = (size_t)hs_model_config(m)->n_vocab;
        float *out = new float[(n_logits ? n_logits : 1) * vocab];
        try {
            run(tokens, pos, seq, block_tables, logit_index, out);
        } catch (...) {
            delete[] out;
            throw;
        }
        nb::capsule owner(out, [](void *p) noexcept { delete[] (float *)p; });
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, {n_logits, vocab}, owner);
    }
    // One step, then one token sampled for each logit_index entry, all in C: the logits stay
    // in a buffer reused from step to step and never reach Python. Per-row parameters; `state`
    // holds each row's generator state and comes back advanced.
    nb::tuple sample(i32array tokens, i32array pos, i32array seq, i32array block_tables,
                     i32array logit_index, const std::vector<float> &temperature,
                     const std::vector<int> &top_k, const std::vector<float> &top_p,
                     const std::vector<uint64_t> &state, const std::vector<int32_t> &add_row,
                     const std::vector<int32_t> &add_id, const std::vector<float> &add_value,
                     const std::vector<int> &logprobs) {
        const size_t rows = logit_index.size(), vocab = (size_t)hs_model_config(m)->n_vocab;
        const SamplingArgs args{temperature, top_k, top_p, state, add_row, add_id, add_value,
                                logprobs};
        args.check(rows, vocab);
        if (logits.size() < rows * vocab) logits.resize(rows * vocab);
        run(tokens, pos, seq, block_tables, logit_index, logits.data());
        return sample_rows(*pool, logits.data(), rows, vocab, args, scratch);
    }
    // The KV hand-off, one layer at a time: rows of the given cache slots as fp16 bytes
    // ([n][n_head_kv * head_dim], K after RoPE).
    size_t kv_row_bytes() const {
        const hs_config *c = hs_model_config(m);
        return (size_t)c->n_head_kv * c->head_dim * 2;
    }
    void write_kv(int layer, i32array slots, u8array k, u8array v) {
        const size_t bytes = slots.size() * kv_row_bytes();
        if (k.size() != bytes || v.size() != bytes)
            throw std::invalid_argument("k and v must hold one fp16 row per slot");
        int rc;
        {
            nb::gil_scoped_release release;
            rc = hs_model_write_kv(m, layer, (int)slots.size(), slots.data(), k.data(), v.data());
        }
        if (rc != 0) throw std::invalid_argument("write_kv: layer or slot out of range");
    }
    std::pair<nb::bytes, nb::bytes> read_kv(int layer, i32array slots) {
        std::string k(slots.size() * kv_row_bytes(), '\0'), v(k.size(), '\0');
        if (hs_model_read_kv(m, layer, (int)slots.size(), slots.data(), k.data(), v.data()) != 0)
            throw std::invalid_argument("read_kv: layer or slot out of range");
        return {nb::bytes(k.data(), k.size()), nb::bytes(v.data(), v.size())};
    }
    // Per-phase wall time of steps (hs_model_set_profiling): on/off zeroes the sums.
    void set_profiling(bool on) { hs_model_set_profiling(m, on); }
    nb::dict profile() const {
        const char *const *names;
        const double *secs;
        const int count = hs_model_profile(m, &names, &secs);
        nb::dict out;
        for (int i = 0; i < count; i++) out[names[i]] = secs[i];
        return out;
    }
    nb::tuple strips() const {
        unsigned long long stolen;
        const unsigned long long total = hs_model_strips(m, &stolen);
        return nb::make_tuple(total, stolen);
    }
    size_t weight_bytes() const { return hs_model_weight_bytes(m); }
    size_t token_bytes() const { return hs_model_token_bytes(m); }
    size_t kv_bytes() const { return hs_model_kv_bytes(m); }
};

static nb::bytes quantize(int type, f32array x) {
    const size_t n = x.size();
    if (n % HS_QK) throw std::invalid_argument("length must be a multiple of 32");
    std::string out(hs_row_bytes(type, (int64_t)n), '\0');
    if (type == HS_Q8_0) hs_quantize_row_q8_0(x.data(), (block_q8_0 *)out.data(), (int)n);
    else if (type == HS_Q4_0) hs_quantize_row_q4_0(x.data(), (block_q4_0 *)out.data(), (int)n);
    else throw std::invalid_argument("quantize supports q8_0 (8) and q4_0 (2)");
    return nb::bytes(out.data(), out.size());
}

static nb::ndarray<nb::numpy, float, nb::ndim<1>> dequantize(int type, u8array data, int n) {
    if (data.size() < hs_row_bytes(type, n)) throw std::invalid_argument("buffer too small");
    float *out = new float[n];
    hs_dequantize_row(type, data.data(), out, n);
    nb::capsule owner(out, [](void *p) noexcept { delete[] (float *)p; });
    return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {(size_t)n}, owner);
}

// out[n][rows] = x[n][cols] @ W^T with W given as `rows` quantized rows.
static nb::ndarray<nb::numpy, float, nb::ndim<2>> matmul(Pool &pool, int type, int rows, int cols,
                                                         u8array w, f32array x,
                                                         const std::string &kernels, int nrc) {
    if (w.size() < hs_row_bytes(type, cols) * (size_t)rows || x.size() % (size_t)cols)
        throw std::invalid_argument("matmul: buffer sizes do not match rows x cols");
    const int n = (int)(x.size() / cols);
    checked_nrc(nrc);
    hs_mat mat{type, rows, cols, hs_row_bytes(type, cols), (void *)w.data()};
    float *out = new float[(size_t)n * rows];
    const hs_kernels *k = kernels_named(kernels);
    {
        nb::gil_scoped_release release;
        hs_matmul(pool.pool, k, nrc, &mat, n, x.data(), out);
    }
    nb::capsule owner(out, [](void *p) noexcept { delete[] (float *)p; });
    return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, {(size_t)n, (size_t)rows}, owner);
}

NB_MODULE(_kernels, mod) {
    mod.doc() = "heteroserve CPU kernels (C), behind heteroserve_cpu's typed API";
    mod.def("selected_variant", [] { return std::string(hs_kernels_select()->name); });
    mod.def("available_variants", [] { return std::string(hs_kernels_available()); });
    mod.def("quantize", &quantize, nb::arg("type"), nb::arg("x"));
    mod.def("read_bandwidth", [](Pool &pool, size_t bytes, int repeats) {
        nb::gil_scoped_release release;
        return hs_read_bandwidth(pool.pool, bytes, repeats);
    }, nb::arg("pool"), nb::arg("bytes") = (size_t)1 << 30, nb::arg("repeats") = 5,
       "best-of-`repeats` read bandwidth in GB/s over a `bytes` buffer on the pool's threads");
    mod.def("sample", [](Pool &pool, f32array logits, const std::vector<float> &temperature,
                         const std::vector<int> &top_k, const std::vector<float> &top_p,
                         const std::vector<uint64_t> &state, const std::vector<int32_t> &add_row,
                         const std::vector<int32_t> &add_id, const std::vector<float> &add_value,
                         const std::vector<int> &logprobs) {
        if (logits.ndim() != 2) throw std::invalid_argument("logits is [rows, n_vocab]");
        Scratch scratch;
        return sample_rows(pool, logits.data(), logits.shape(0), logits.shape(1),
                           {temperature, top_k, top_p, state, add_row, add_id, add_value,
                            logprobs}, scratch);
    }, nb::arg("pool"), nb::arg("logits"), nb::arg("temperature"), nb::arg("top_k"),
       nb::arg("top_p"), nb::arg("state"), nb::arg("add_row") = std::vector<int32_t>(),
       nb::arg("add_id") = std::vector<int32_t>(), nb::arg("add_value") = std::vector<float>(),
       nb::arg("logprobs") = std::vector<int>(),
       "one token per row of logits (greedy when temperature <= 1e-6), as Model.sample draws "
       "them: (ids, states), and per-row [(id, logprob)] (chosen first) when `logprobs` is given");
    mod.def("dequantize", &dequantize, nb::arg("type"), nb::arg("data"), nb::arg("n"));
    mod.def("matmul", &matmul, nb::arg("pool"), nb::arg("type"), nb::arg("rows"), nb::arg("cols"),
            nb::arg("w"), nb::arg("x"), nb::arg("kernels") = "", nb::arg("nrc") = 0);
    nb::class_<Pool>(mod, "Pool")
        .def(nb::init<const std::vector<int> &, int, bool>(), nb::arg("cpus"), nb::arg("threads"),
             nb::arg("pin_caller") = false)
        .def_prop_ro("size", &Pool::size)
        .def_prop_ro("parks", &Pool::parks,
                     "waits that ended parked on a futex so far (workers' and the caller's)")
        .def_ro("cpus", &Pool::cpus);
    nb::class_<Model>(mod, "Model")
        .def(nb::init<Pool &, int, int, int, int, int, int, int, int, float, float,
                      const std::string &, int>(),
             nb::arg("pool"), nb::arg("n_layer"), nb::arg("n_embd"), nb::arg("n_head"),
             nb::arg("n_head_kv"), nb::arg("head_dim"), nb::arg("n_ff"), nb::arg("n_vocab"),
             nb::arg("rope_neox"), nb::arg("eps"), nb::arg("rope_base"), nb::arg("kernels") = "",
             nb::arg("nrc") = 0, nb::keep_alive<1, 2>())
        .def("set", &Model::set)
        .def("alloc_kv", &Model::alloc_kv)
        .def("write_kv", &Model::write_kv, nb::arg("layer"), nb::arg("slots"), nb::arg("k"),
             nb::arg("v"))
        .def("read_kv", &Model::read_kv, nb::arg("layer"), nb::arg("slots"))
        .def("forward", &Model::forward)
        .def("sample", &Model::sample, nb::arg("tokens"), nb::arg("pos"), nb::arg("seq"),
             nb::arg("block_tables"), nb::arg("logit_index"), nb::arg("temperature"),
             nb::arg("top_k"), nb::arg("top_p"), nb::arg("state"),
             nb::arg("add_row") = std::vector<int32_t>(), nb::arg("add_id") = std::vector<int32_t>(),
             nb::arg("add_value") = std::vector<float>(), nb::arg("logprobs") = std::vector<int>())
        .def("set_profiling", &Model::set_profiling, nb::arg("on"),
             "turn per-phase step timing on or off; either way the sums start from zero")
        .def_prop_ro("profile", &Model::profile, "seconds per step phase while profiling")
        .def_prop_ro("strips", &Model::strips,
                     "(strips of batched decode products so far, how many a thread took from "
                     "another's share)")
        .def_prop_ro("weight_bytes", &Model::weight_bytes)
        .def_prop_ro("token_bytes", &Model::token_bytes)
        .def_prop_ro("kv_bytes", &Model::kv_bytes);
}
