// The fixed-order reductions of `invariant.rs` on CUDA (issue 61, deliver 4): each output's
// sums run in an order fixed by that output's own operands alone (never by the number of
// rows in the batch, the grid, or where a row stands in it), so that a token's log-prob is
// the same bits from a decoding step and from a training pass on the same GPU.
//
// Compiled to PTX by `build.rs` (nvcc, when the `cuda` feature is on) and loaded by
// `invariant_cuda.rs`. The bits differ from the CPU's kernels (other lane counts, fused
// multiply-adds where nvcc contracts them); what is fixed is that both sides on the GPU
// compute each value the same way. Plain C types only (bf16 read as its 16 bits), so that no
// toolkit header is needed.

#define WARP 32
#define PRODUCT_WARPS 8 // outputs per block of the products: 8 warps of 32 lanes
#define NORM_THREADS 256
#define ATTENTION_THREADS 128 // keys scored at once; also each thread's output dimensions' stride
#define ATTENTION_MAX_DIM 512

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(unsigned short bits) { return __uint_as_float(((unsigned int)bits) << 16); }

// y[r, o] = Σ_k x[r, k] · w[o, k]: one warp per output element, lane l summing k = l, l + 32,
// … in order, then the 32 lanes by a fixed butterfly. The grid's x is the row (up to 2^31 − 1
// rows), its y the block of PRODUCT_WARPS outputs.
template <typename W>
__device__ void product(const float* x, const W* w, float* y, int rows, int out, int inner) {
    const int r = blockIdx.x;
    const int o = blockIdx.y * PRODUCT_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (r >= rows || o >= out) return; // a whole warp: o is the same for its lanes
    const float* xr = x + (size_t)r * inner;
    const W* wo = w + (size_t)o * inner;
    float acc = 0.0f;
    for (int k = lane; k < inner; k += WARP) acc = fmaf(xr[k], widen(wo[k]), acc);
    for (int offset = WARP / 2; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) y[(size_t)r * out + o] = acc;
}

extern "C" __global__ void fixed_product_f32(const float* x, const float* w, float* y, int rows, int out, int inner) {
    product(x, w, y, rows, out, inner);
}

extern "C" __global__ void fixed_product_bf16(
    const float* x, const unsigned short* w, float* y, int rows, int out, int inner) {
    product(x, w, y, rows, out, inner);
}

// One row's RMS norm per block: y = x · (1 / sqrt(mean(x²) + eps)) · w, the squares summed
// in f64, thread t taking t, t + 256, … in order, then the threads by a fixed tree.
extern "C" __global__ void fixed_rms_norm(const float* x, const float* w, float* y, int rows, int n, double eps) {
    __shared__ double partial[NORM_THREADS];
    const int r = blockIdx.x;
    const int t = threadIdx.x;
    if (r >= rows) return; // the whole block
    const float* row = x + (size_t)r * n;
    double acc = 0.0;
    for (int k = t; k < n; k += NORM_THREADS) acc += (double)row[k] * (double)row[k];
    partial[t] = acc;
    __syncthreads();
    for (int half = NORM_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt(partial[0] / (double)n + eps));
    for (int k = t; k < n; k += NORM_THREADS) y[(size_t)r * n + k] = row[k] * scale * w[k];
}

// One query's score against key t: dot(q, k_t) · scale + mask, the dot summed over the
// dimensions in order; a key the mask hides is −∞ without its dot.
__device__ __forceinline__ float score(const float* query, const float* key, int dim, float scale, float mask) {
    if (mask == -INFINITY) return -INFINITY;
    float dot = 0.0f;
    for (int d = 0; d < dim; ++d) dot = fmaf(query[d], key[d], dot);
    return dot * scale + mask;
}

// Attention of one query (grid x: its position, y: its head, z: its row of the batch) over
// its keys: q [batch, heads, len, dim], k and v [batch, kv_heads, total, dim] (query head h
// reads key/value head h / groups), mask additive [len, total] (per_row_mask 0) or [batch,
// len, total] (1), or none (has_mask 0). As on the CPU: softmax's sum runs key by key in
// position order (in f64), and the values are summed key by key in position order, so a key
// the mask hides adds exactly nothing wherever it stands (a decoding step's left padding, a
// training pass's later positions). A query that sees no key gets zeros.
extern "C" __global__ void fixed_attention(
    const float* q, const float* k, const float* v, const float* mask, float* out, int heads, int len, int total,
    int dim, int groups, int kv_heads, int has_mask, int per_row_mask, float scale) {
    __shared__ float query[ATTENTION_MAX_DIM];
    __shared__ float tile[ATTENTION_THREADS];
    __shared__ float reduce[ATTENTION_THREADS];
    __shared__ double sum;
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
    const float* q_row = q + (((size_t)b * heads + h) * len + i) * dim;
    const size_t kv = ((size_t)b * kv_heads + h / groups) * (size_t)total * dim;
    const float* keys = k + kv;
    const float* values = v + kv;
    const float* m = has_mask ? mask + (((per_row_mask ? (size_t)b * len : 0) + i) * (size_t)total) : 0;
    float* o = out + (((size_t)b * heads + h) * len + i) * dim;
    for (int d = t; d < dim; d += ATTENTION_THREADS) query[d] = q_row[d];
    __syncthreads();

    // The largest score (a max: its order does not matter).
    float largest = -INFINITY;
    for (int key = t; key < total; key += ATTENTION_THREADS)
        largest = fmaxf(largest, score(query, keys + (size_t)key * dim, dim, scale, m ? m[key] : 0.0f));
    reduce[t] = largest;
    __syncthreads();
    for (int half = ATTENTION_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) reduce[t] = fmaxf(reduce[t], reduce[t + half]);
        __syncthreads();
    }
    const float max = reduce[0];
    if (max == -INFINITY) {
        for (int d = t; d < dim; d += ATTENTION_THREADS) o[d] = 0.0f;
        return;
    }

    // Σ exp(s − max), key by key in position order: a tile's terms computed at once, then
    // added by one thread in order.
    if (t == 0) sum = 0.0;
    for (int start = 0; start < total; start += ATTENTION_THREADS) {
        const int key = start + t;
        float term = 0.0f;
        if (key < total) {
            const float s = score(query, keys + (size_t)key * dim, dim, scale, m ? m[key] : 0.0f);
            term = s == -INFINITY ? 0.0f : expf(s - max);
        }
        tile[t] = term;
        __syncthreads();
        if (t == 0) {
            const int count = min(ATTENTION_THREADS, total - start);
            for (int j = 0; j < count; ++j) sum += (double)tile[j];
        }
        __syncthreads();
    }
    const float inverse = (float)(1.0 / sum);

    // Σ wₜ·vₜ key by key in position order, each thread its own output dimensions.
    float acc[ATTENTION_MAX_DIM / ATTENTION_THREADS];
    for (int j = 0; j < ATTENTION_MAX_DIM / ATTENTION_THREADS; ++j) acc[j] = 0.0f;
    for (int start = 0; start < total; start += ATTENTION_THREADS) {
        const int key = start + t;
        float weight = 0.0f;
        if (key < total) {
            const float s = score(query, keys + (size_t)key * dim, dim, scale, m ? m[key] : 0.0f);
            weight = s == -INFINITY ? 0.0f : expf(s - max) * inverse;
        }
        tile[t] = weight;
        __syncthreads();
        const int count = min(ATTENTION_THREADS, total - start);
        for (int j = 0; j < count; ++j) {
            const float w = tile[j];
            if (w == 0.0f) continue; // a hidden key (or one too far below the max): exactly nothing
            const float* value = values + (size_t)(start + j) * dim;
            for (int d = t, slot = 0; d < dim; d += ATTENTION_THREADS, ++slot) acc[slot] = fmaf(w, value[d], acc[slot]);
        }
        __syncthreads();
    }
    for (int d = t, slot = 0; d < dim; d += ATTENTION_THREADS, ++slot) o[d] = acc[slot];
}
