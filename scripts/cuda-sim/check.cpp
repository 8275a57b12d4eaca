// `invariant.cu`'s kernels run on the CPU by `sim.h`, checked as `invariant_check.rs` checks
// them on a device — a row alone and among others, a decoding step's query against a training
// pass's, behind left padding — bit for bit, and against a plain f64 reference within
// rounding; also a query that sees no key, a mask per row of the batch, grouped-query heads.
// Run by scripts/cuda-sim/run. Exit 0 when every check passes.
#include "sim.h"

#include "../../host/model/src/invariant.cu"

#include <cstdint>
#include <cstdio>
#include <string>

static int failures = 0;

static void expect(bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
    if (!ok) ++failures;
}

// wirl_model::test_values: the same inputs as the Rust check.
static std::vector<float> values(uint32_t seed, size_t n) {
    std::vector<float> out(n);
    uint32_t state = seed;
    for (auto& v : out) {
        state = state * 1664525u + 1013904223u;
        v = (float)(state >> 8) / (float)(1 << 24) - 0.5f;
    }
    return out;
}

static std::string shown(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2e", v);
    return text;
}

static bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

static double worst_relative(const std::vector<float>& got, const std::vector<double>& want) {
    double scale = 1.0, worst = 0.0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs((double)got[i] - want[i]);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst / scale;
}

static uint16_t to_bf16(float v) {  // round to nearest even, as half::bf16::from_f32
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

static void products() {
    const int rows = 32, out = 72, inner = 576;
    const auto x = values(11, rows * inner), w = values(12, out * inner);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = to_bf16(w[i]);
    for (int bf16 = 0; bf16 < 2; ++bf16) {
        const std::string kind = bf16 ? "product (bf16 weights)" : "product (f32 weights)";
        auto run = [&](const float* xs, int n) {
            std::vector<float> y(n * out);
            const dim3 grid{(unsigned)n, (unsigned)((out + PRODUCT_WARPS - 1) / PRODUCT_WARPS), 1};
            if (bf16)
                launch(grid, dim3{PRODUCT_WARPS * 32, 1, 1}, fixed_product_bf16, xs, (const unsigned short*)w16.data(),
                       y.data(), n, out, inner);
            else
                launch(grid, dim3{PRODUCT_WARPS * 32, 1, 1}, fixed_product_f32, xs, w.data(), y.data(), n, out, inner);
            return y;
        };
        const auto all = run(x.data(), rows);
        for (int n : {1, 3, 8}) expect(same_bits(run(x.data(), n).data(), all.data(), n * out), kind + ": the first " + std::to_string(n) + " rows of 32");
        for (int r : {5, rows - 1}) expect(same_bits(run(x.data() + r * inner, 1).data(), all.data() + r * out, out), kind + ": row " + std::to_string(r) + " alone");
        std::vector<double> want(rows * out);
        for (int r = 0; r < rows; ++r)
            for (int o = 0; o < out; ++o) {
                double s = 0;
                for (int k = 0; k < inner; ++k) {
                    const float wk = bf16 ? __uint_as_float((unsigned)w16[o * inner + k] << 16) : w[o * inner + k];
                    s += (double)x[r * inner + k] * wk;
                }
                want[r * out + o] = s;
            }
        const double worst = worst_relative(all, want);
        expect(worst < 1e-5, kind + ": within 1e-5 of f64 (" + shown(worst) + ")");
    }
}

static void norms() {
    const int rows = 32, n = 576;
    const double eps = 1e-5;
    const auto x = values(21, rows * n), w = values(22, n);
    auto run = [&](const float* xs, int count) {
        std::vector<float> y(count * n);
        launch(dim3{(unsigned)count, 1, 1}, dim3{NORM_THREADS, 1, 1}, fixed_rms_norm, xs, w.data(), y.data(), count, n, eps);
        return y;
    };
    const auto all = run(x.data(), rows);
    for (int r : {0, 17}) expect(same_bits(run(x.data() + r * n, 1).data(), all.data() + r * n, n), "rms norm: row " + std::to_string(r) + " alone");
    std::vector<double> want(rows * n);
    for (int r = 0; r < rows; ++r) {
        double sq = 0;
        for (int k = 0; k < n; ++k) sq += (double)x[r * n + k] * x[r * n + k];
        const double scale = 1.0 / std::sqrt(sq / n + eps);
        for (int k = 0; k < n; ++k) want[r * n + k] = x[r * n + k] * scale * w[k];
    }
    const double worst = worst_relative(all, want);
    expect(worst < 1e-6, "rms norm: within 1e-6 of f64 (" + shown(worst) + ")");
}

// Attention by the kernel: q [batch, heads, len, dim], k and v [batch, kv, total, dim].
static std::vector<float> attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                 const float* mask, int batch, int heads, int kv, int len, int total, int dim,
                                 bool per_row, float scale) {
    std::vector<float> out(batch * heads * len * dim, NAN);
    launch(dim3{(unsigned)len, (unsigned)heads, (unsigned)batch}, dim3{ATTENTION_THREADS, 1, 1}, fixed_attention, q.data(),
           k.data(), v.data(), mask ? mask : q.data(), out.data(), heads, len, total, dim, heads / kv, kv, mask ? 1 : 0,
           per_row ? 1 : 0, scale);
    return out;
}

// Keys [kv, total, dim] cut to their first `keep`, with `pad` slots of junk before them.
static std::vector<float> keys_so_far(const std::vector<float>& k, int kv, int total, int dim, int keep, int pad) {
    const auto junk = values(77, kv * pad * dim);
    std::vector<float> out;
    for (int h = 0; h < kv; ++h) {
        out.insert(out.end(), junk.begin() + h * pad * dim, junk.begin() + (h + 1) * pad * dim);
        out.insert(out.end(), k.begin() + h * total * dim, k.begin() + h * total * dim + keep * dim);
    }
    return out;
}

static void attention() {
    const int heads = 4, kv = 2, len = 150, dim = 64;
    const float scale = 0.125f;
    const auto q = values(31, heads * len * dim), k = values(32, kv * len * dim), v = values(33, kv * len * dim);
    std::vector<float> causal(len * len, 0.0f);
    for (int i = 0; i < len; ++i)
        for (int t = i + 1; t < len; ++t) causal[i * len + t] = -INFINITY;
    const auto pass = attend(q, k, v, causal.data(), 1, heads, kv, len, len, dim, false, scale);
    for (int p : {0, 40, 127, 128, len - 1}) {
        std::vector<float> query;
        for (int h = 0; h < heads; ++h) query.insert(query.end(), q.begin() + (h * len + p) * dim, q.begin() + (h * len + p + 1) * dim);
        std::vector<float> want;
        for (int h = 0; h < heads; ++h) want.insert(want.end(), pass.begin() + (h * len + p) * dim, pass.begin() + (h * len + p + 1) * dim);
        const auto step = attend(query, keys_so_far(k, kv, len, dim, p + 1, 0), keys_so_far(v, kv, len, dim, p + 1, 0), nullptr, 1, heads, kv, 1, p + 1, dim, false, scale);
        expect(same_bits(step.data(), want.data(), want.size()), "attention: position " + std::to_string(p) + ", a decoding step against the pass");
        const int pad = 3;
        std::vector<float> hidden(pad + p + 1, 0.0f);
        for (int t = 0; t < pad; ++t) hidden[t] = -INFINITY;
        const auto padded = attend(query, keys_so_far(k, kv, len, dim, p + 1, pad), keys_so_far(v, kv, len, dim, p + 1, pad), hidden.data(), 1, heads, kv, 1, pad + p + 1, dim, false, scale);
        expect(same_bits(padded.data(), want.data(), want.size()), "attention: position " + std::to_string(p) + ", behind left padding against the pass");
    }
    // The pass against f64, grouped-query heads included (head h reads kv head h / 2).
    std::vector<double> want(heads * len * dim);
    for (int h = 0; h < heads; ++h)
        for (int i = 0; i < len; ++i) {
            const int g = h / (heads / kv);
            std::vector<double> s(i + 1);
            double max = -INFINITY, sum = 0;
            for (int t = 0; t <= i; ++t) {
                double dot = 0;
                for (int d = 0; d < dim; ++d) dot += (double)q[(h * len + i) * dim + d] * k[(g * len + t) * dim + d];
                s[t] = dot * scale;
                max = std::max(max, s[t]);
            }
            for (double& x : s) sum += (x = std::exp(x - max));
            for (int d = 0; d < dim; ++d) {
                double o = 0;
                for (int t = 0; t <= i; ++t) o += s[t] / sum * v[(g * len + t) * dim + d];
                want[(h * len + i) * dim + d] = o;
            }
        }
    const double worst = worst_relative(pass, want);
    expect(worst < 1e-5, "attention: the causal pass within 1e-5 of f64 (" + shown(worst) + ")");

    // Two rows of a batch, a mask each [2, len, total]: row 1 the causal mask, row 0 sees
    // nothing at query 2 (zeros), as the CPU's op.
    const int small = 9;
    const auto q2 = values(41, 2 * heads * small * dim), k2 = values(42, 2 * kv * small * dim), v2 = values(43, 2 * kv * small * dim);
    std::vector<float> masks(2 * small * small, 0.0f);
    for (int i = 0; i < small; ++i)
        for (int t = i + 1; t < small; ++t) masks[small * small + i * small + t] = -INFINITY;
    for (int t = 0; t < small; ++t) masks[2 * small + t] = -INFINITY;
    const auto both = attend(q2, k2, v2, masks.data(), 2, heads, kv, small, small, dim, true, scale);
    bool zeros = true;
    for (int h = 0; h < heads; ++h)
        for (int d = 0; d < dim; ++d) zeros &= both[((0 * heads + h) * small + 2) * dim + d] == 0.0f;
    expect(zeros, "attention: a query that sees no key gets zeros");
    std::vector<float> q1(q2.begin() + heads * small * dim, q2.end()), k1(k2.begin() + kv * small * dim, k2.end()),
        v1(v2.begin() + kv * small * dim, v2.end());
    const auto alone = attend(q1, k1, v1, masks.data() + small * small, 1, heads, kv, small, small, dim, false, scale);
    expect(same_bits(alone.data(), both.data() + heads * small * dim, alone.size()), "attention: row 1 of a batch with masks per row against it alone");
}

int main() {
    products();
    norms();
    attention();
    std::printf("%s: %d failed\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
