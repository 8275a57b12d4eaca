//! The trainable policy: the engine's weights as variables, and a forward pass built only of
//! differentiable ops (candle's fused softmax, rms_norm and rope carry no gradients).
//!
//! A group's G completions share one prompt, so the prompt runs once and the completions
//! attend to its keys and values (broadcast over the group); the gradient through the shared
//! prefix is the sum over the group, as it would be with G copies. Completions are
//! right-padded: under the causal mask no real token attends to padding, so no padding mask
//! is needed, and padding positions get zero loss weight.
//!
//! Memory: backward through the whole forward keeps every layer's attention scores, which
//! grow with the square of the prompt (`[layers, heads, P, P]`: gigabytes at 1,000 tokens).
//! [`Policy::loss_and_grads`] therefore goes layer by layer above a memory estimate: each
//! layer's input is a leaf, so its graph ends at its output; the top layers keep their graphs
//! from the forward as far as a budget allows, the others run without a graph, keeping only
//! their input, and are rebuilt one at a time in the backward from the top. Each kept layer
//! saves one layer's forward; each rebuilt one holds only its own graph.
//!
//! The head's vocabulary-wide tensors (`[rows, positions, vocab]` logits, log-softmax,
//! probabilities: ~100 MB each for 8 rows of 64 positions over 49,152 tokens) are computed a
//! chunk of positions at a time (Liger's fused linear loss is the anchor): the token stats
//! first, without a graph; the loss's gradient with respect to them; then each chunk again,
//! its share of that gradient pulled through the head. Only one chunk's tensors are alive.

use crate::grads::{Gradients, with_f32};
use crate::head;
use crate::positions::{Kept, Part};
use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Result, Tensor, Var};
use std::collections::HashMap;
use wirl_model::Config;
use wirl_model::config::Activation;
use wirl_model::decoder::{self, Heads, LayerOps, NormAt, Sublayer};
use wirl_model::family::{self, EMBEDDING, FINAL_NORM, OUTPUT_WEIGHT, Projection};
use wirl_model::layer::Frames;
use wirl_model::lora::{Adapter, LoraSpec};
use wirl_model::ops::LoraPair;
use wirl_model::ops::{local_rope_tables, repeat_kv, rope_tables};

/// Weights by HF name, and the forward math over them. The same code runs the trainable
/// policy (variables: gradients flow) and the frozen reference (plain tensors).
pub struct Net {
    config: Config,
    weights: HashMap<String, Tensor>,
    /// With LoRA adapters among `weights` (`wirl_model::lora`'s names): their scale. None:
    /// any adapter tensors are ignored (the base alone: the KL reference).
    lora_scale: Option<f64>,
    cos: Tensor,
    sin: Tensor,
    /// Gemma 3's sliding layers' rope tables.
    local_rope: Option<(Tensor, Tensor)>,
    /// Take the CPU's hand-written ops (fused head, softmax, norm, rope, frozen products)
    /// where they apply (f32 on the CPU); false: candle's composed ops everywhere, the path
    /// other devices take.
    fast_paths: bool,
    /// The dtype the products (projections, attention, the head) are computed in: f32, or
    /// bf16 (mixed precision: both operands rounded for the product, the result widened
    /// back; weights, norms, softmax, log-probs and the loss stay f32 — autocast's rule).
    compute: DType,
}

/// Per-token results for one group's completions, `[G, width]`.
pub struct TokenStats {
    /// Log-probability of each completion token.
    pub logp: Tensor,
    /// Entropy of each position's distribution.
    pub entropy: Tensor,
}

impl Net {
    pub fn new(config: &Config, weights: HashMap<String, Tensor>, device: &Device) -> Result<Self> {
        let dtype = weights.get(EMBEDDING).map_or(DType::F32, |t| t.dtype());
        let (cos, sin) = rope_tables(config, device, dtype).map_err(candle_core::Error::wrap)?;
        let local_rope = local_rope_tables(config, device, dtype).map_err(candle_core::Error::wrap)?;
        Ok(Net {
            config: config.clone(),
            weights,
            lora_scale: None,
            cos,
            sin,
            local_rope,
            fast_paths: true,
            compute: DType::F32,
        })
    }

    /// Compute the products in `dtype` (F32, or BF16 for mixed precision): see
    /// [`Net::compute`]. The CPU's fused head and frozen products are f32 ops: with BF16
    /// products the composed ops run instead.
    pub fn set_compute_dtype(&mut self, dtype: DType) {
        self.compute = dtype;
    }

    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// `a · b` (broadcast over leading dims) in the compute dtype, returned in `a`'s dtype.
    fn product(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.compute == a.dtype() {
            return a.broadcast_matmul(b);
        }
        a.to_dtype(self.compute)?.broadcast_matmul(&b.to_dtype(self.compute)?)?.to_dtype(a.dtype())
    }

    /// Whether the CPU's hand-written ops are taken where they apply (the default), or
    /// candle's composed ops everywhere (what CUDA runs; on the CPU, to test that path).
    pub fn set_fast_paths(&mut self, on: bool) {
        self.fast_paths = on;
    }

    /// Whether this net's forward is the engine's to the bit (`wirl_model::invariant`): on a
    /// CPU with the fixed-order kernels, in f32, on the hand-written ops.
    pub fn computes_as_the_engine(&self) -> bool {
        self.fast_paths && self.compute == DType::F32 && self.device().is_cpu() && wirl_model::invariant::available()
    }

    /// Where the net computes.
    pub fn device(&self) -> &Device {
        self.cos.device()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn weights(&self) -> &HashMap<String, Tensor> {
        &self.weights
    }

    fn w(&self, name: &str) -> Result<&Tensor> {
        self.weights.get(name).ok_or_else(|| candle_core::Error::Msg(format!("no weight `{name}`")))
    }

    fn linear(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        let y = self.times_transposed(x, self.w(&format!("{name}.weight"))?)?;
        let y = match self.weights.get(&format!("{name}.bias")) {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        // An adapter's scale · (x Aᵀ) Bᵀ (the engine's own math), through the rank-wide
        // product, never a full-size ΔW; looked up only in a LoRA policy.
        let Some(scale) = self.lora_scale else { return Ok(y) };
        let Some(a) = self.weights.get(&LoraPair::a_name(name)) else { return Ok(y) };
        // `LoraPair::forward`'s `scale · (x·Aᵀ)·Bᵀ`, through the same products as the base
        // (with gradients for A and B; on the CPU in f32 the engine's bits).
        let low = self.times_transposed(x, a)?;
        y + (self.times_transposed(&low, self.w(&LoraPair::b_name(name))?)? * scale)?
    }

    /// `x · weightᵀ`: on the CPU in f32, the engine's product to the bit (trained or frozen,
    /// `fused.rs`); otherwise in the compute dtype.
    fn times_transposed(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        if self.compute != DType::F32 {
            return self.product(x, &weight.t()?);
        }
        if !weight.is_variable() {
            return crate::fused::frozen_linear(x, weight, self.fast_paths);
        }
        match crate::fused::trained_linear(x, weight, self.fast_paths)? {
            Some(y) => Ok(y),
            None => self.product(x, &weight.t()?),
        }
    }

    fn rms_norm(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        // Gemma's `1 + w` (the sum carries the gradient to `w`).
        let weight = wirl_model::layer::norm_weight(self.w(name)?, self.config.norm_offset())?;
        crate::fused::rms_norm(x, &weight, self.config.rms_norm_eps, self.fast_paths)
    }

    /// The parts of `x`'s projections `declared` (of layer `l`), in order: a product per
    /// module, its output split where it holds several parts (a fused `qkv_proj`).
    fn projections<const N: usize>(&self, x: &Tensor, l: &str, declared: &[Projection]) -> Result<[Tensor; N]> {
        let mut parts = Vec::with_capacity(N);
        for projection in declared {
            let y = self.linear(x, &format!("{l}.{}", projection.module))?;
            if let [_] = projection.parts {
                parts.push(y);
                continue;
            }
            let (mut start, sizes) = (0, self.config.sizes());
            for part in projection.parts {
                let width = part.width(&sizes);
                parts.push(y.narrow(D::Minus1, start, width)?);
                start += width;
            }
        }
        parts.try_into().map_err(|parts: Vec<Tensor>| {
            candle_core::Error::Msg(format!("{} parts declared where {N} are read", parts.len()))
        })
    }

    /// Log-probabilities and entropies of `completions` after `prompt`.
    pub fn completion_stats(&self, prompt: &[u32], completions: &[Vec<u32>]) -> Result<TokenStats> {
        let batch = self.batch(prompt, completions)?;
        let hidden = self.forward(batch.prefix, &batch.inputs)?;
        self.head_stats(&hidden, &batch.targets)
    }

    /// [`Net::completion_stats`] with the head computed `chunk_bytes` at a time (see
    /// [`Net::head_chunk`]); for passes that only read (old and reference log-probs).
    pub fn completion_stats_chunked(
        &self,
        prompt: &[u32],
        completions: &[Vec<u32>],
        chunk_bytes: u64,
    ) -> Result<TokenStats> {
        let mut stats = self.parts_stats_chunked(prompt, &[Part::every_position(completions)], chunk_bytes)?;
        Ok(stats.pop().expect("one part"))
    }

    /// [`Net::completion_stats_chunked`] of each part of a group's completions, the prompt
    /// run once for all of them (each part's rows attend to its keys and values); the head
    /// only at the positions each part asks for ([`Part::trained`]), zeros elsewhere.
    pub fn parts_stats_chunked(&self, prompt: &[u32], parts: &[Part<'_>], chunk_bytes: u64) -> Result<Vec<TokenStats>> {
        let batches = parts.iter().map(|part| self.part_batch(prompt, part)).collect::<Result<Vec<_>>>()?;
        let frames = batches.iter().map(|b| self.frame(b.prefix, &b.inputs)).collect::<Result<Vec<_>>>()?;
        let (Some(first), Some(prefix_frame)) = (batches.first(), frames.first()) else {
            return Ok(Vec::new());
        };
        let mut px = self.embed_prefix(first.prefix, first.inputs.device())?;
        let mut xs = batches.iter().map(|b| self.embed_rows(&b.inputs)).collect::<Result<Vec<_>>>()?;
        for i in 0..self.config.num_hidden_layers {
            let (next_px, kv) = self.prefix_layer(i, px.as_ref(), prefix_frame)?;
            xs = xs
                .iter()
                .zip(&frames)
                .map(|(x, frame)| self.rows_layer(i, x, kv.as_ref(), frame))
                .collect::<Result<Vec<_>>>()?;
            px = next_px;
        }
        xs.iter()
            .zip(&batches)
            .map(|(hidden, batch)| {
                self.at_kept(hidden, batch, |hidden, targets| {
                    let (rows, width) = (hidden.dim(0)?, hidden.dim(1)?);
                    self.head_stats_by_chunks(hidden, targets, self.head_chunk(rows, width, chunk_bytes))
                })
            })
            .collect()
    }

    /// Positions per head chunk, so that one `[rows, chunk, vocab]` f32 tensor takes at most
    /// `chunk_bytes` (at least one position; all of `width` when it fits).
    pub fn head_chunk(&self, rows: usize, width: usize, chunk_bytes: u64) -> usize {
        let per_position = (rows.max(1) * self.config.vocab_size * 4) as u64;
        ((chunk_bytes / per_position) as usize).clamp(1, width.max(1))
    }

    /// The head's stats over `hidden` (`[rows, width, hidden]`), `chunk` positions at a time,
    /// fused ([`crate::head`]) where the weights are `f32` on the CPU.
    fn head_stats_by_chunks(&self, hidden: &Tensor, targets: &Tensor, chunk: usize) -> Result<TokenStats> {
        let width = hidden.dim(1)?;
        let fused = self.fused_head();
        if chunk >= width && !fused {
            return self.head_stats(hidden, targets);
        }
        let (mut logp, mut entropy) = (Vec::new(), Vec::new());
        for start in (0..width).step_by(chunk) {
            let len = chunk.min(width - start);
            let piece = hidden.narrow(1, start, len)?.contiguous()?;
            let targets = targets.narrow(1, start, len)?.contiguous()?;
            let stats = if fused {
                let chunk = self.fused_chunk(&piece.detach(), &targets)?;
                let rows = piece.dim(0)?;
                let device = piece.device();
                TokenStats {
                    logp: Tensor::from_vec(chunk.stats.logp, (rows, len), device)?,
                    entropy: Tensor::from_vec(chunk.stats.entropy, (rows, len), device)?,
                }
            } else {
                self.head_stats(&piece, &targets)?
            };
            logp.push(stats.logp);
            entropy.push(stats.entropy);
        }
        Ok(TokenStats { logp: Tensor::cat(&logp, 1)?, entropy: Tensor::cat(&entropy, 1)? })
    }

    /// Whether the head runs fused: `f32` weights on the CPU, logits not soft-capped.
    fn fused_head(&self) -> bool {
        self.fast_paths
            && self.compute == DType::F32
            && self.config.logit_softcap().is_none()
            && self.w(self.head_name()).is_ok_and(|w| w.device().is_cpu() && w.dtype() == DType::F32)
    }

    /// The head's weight: its own, or the embeddings' where the model ties them.
    fn head_name(&self) -> &'static str {
        if self.weights.contains_key(OUTPUT_WEIGHT) { OUTPUT_WEIGHT } else { EMBEDDING }
    }

    /// The fused head over one chunk of `hidden` (`[rows, len, hidden]`, before the final
    /// norm): the normed states (with a graph if `hidden` has one), the logits and the stats.
    fn fused_chunk(&self, hidden: &Tensor, targets: &Tensor) -> Result<FusedChunk> {
        let (rows, len, d) = hidden.dims3()?;
        let normed = self.rms_norm(hidden, FINAL_NORM)?.contiguous()?;
        let targets: Vec<u32> = targets.flatten_all()?.to_vec1()?;
        let vocab = self.config.vocab_size;
        if let Some(&token) = targets.iter().find(|&&t| t as usize >= vocab) {
            candle_core::bail!("token {token} is outside the model's {vocab}-token vocabulary");
        }
        let logits = with_f32(&normed, |h| {
            with_f32(self.w(self.head_name())?, |w| Ok(head::logits(h, w, rows * len, d, vocab)))
        })?;
        let stats = head::stats(&logits, &targets, vocab);
        Ok(FusedChunk { normed, targets, logits, stats })
    }

    /// The same net over the same storage, with no gradient tracking (a pass that only
    /// reads, and the recomputing backward's first pass).
    pub fn detached(&self) -> Net {
        let weights = self.weights.iter().map(|(n, t)| (n.clone(), t.detach())).collect();
        Net {
            config: self.config.clone(),
            weights,
            lora_scale: self.lora_scale,
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            local_rope: self.local_rope.clone(),
            fast_paths: self.fast_paths,
            compute: self.compute,
        }
    }

    /// Inputs and targets of one group, as `completion_stats` feeds them.
    fn batch<'p>(&self, prompt: &'p [u32], completions: &[Vec<u32>]) -> Result<Batch<'p>> {
        let device = self.cos.device().clone();
        let groups = completions.len();
        let width = completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let (prefix, last) = prompt.split_at(prompt.len() - 1);
        // Inputs: the prompt's last token, then each completion but its last token (which is
        // only predicted); right-padded with token 0.
        let mut inputs = Vec::with_capacity(groups * width);
        let mut targets = Vec::with_capacity(groups * width);
        for completion in completions {
            let mut row: Vec<u32> = last.iter().chain(completion.iter()).copied().take(width).collect();
            row.resize(width, 0);
            inputs.extend(row);
            let mut target = completion.clone();
            target.resize(width, 0);
            targets.extend(target);
        }
        let inputs = Tensor::from_vec(inputs, (groups, width), &device)?;
        let targets = Tensor::from_vec(targets, (groups, width, 1), &device)?;
        Ok(Batch { prefix, inputs, targets, kept: None })
    }

    /// [`Net::batch`] of a part, with the positions its head computes.
    fn part_batch<'p>(&self, prompt: &'p [u32], part: &Part<'_>) -> Result<Batch<'p>> {
        let mut batch = self.batch(prompt, part.completions)?;
        batch.kept = Kept::of(part, batch.inputs.dim(1)?, batch.inputs.device())?;
        Ok(batch)
    }

    /// `head` (hidden states and targets to stats) over the positions of `batch` that its
    /// part asks for, gathered into one row; the stats put back at their positions, zeros
    /// elsewhere. Differentiable both ways.
    fn at_kept(
        &self,
        hidden: &Tensor,
        batch: &Batch<'_>,
        head: impl FnOnce(&Tensor, &Tensor) -> Result<TokenStats>,
    ) -> Result<TokenStats> {
        let Some(kept) = &batch.kept else { return head(hidden, &batch.targets) };
        let stats = head(&kept.gather(hidden)?, &kept.gather(&batch.targets)?)?;
        Ok(TokenStats { logp: kept.scatter(&stats.logp)?, entropy: kept.scatter(&stats.entropy)? })
    }

    /// Per-token stats from the last layer's hidden states.
    fn head_stats(&self, hidden: &Tensor, targets: &Tensor) -> Result<TokenStats> {
        let (logp, entropy) = self.head_terms(hidden, targets, true)?;
        Ok(TokenStats { logp, entropy: entropy.expect("asked for") })
    }

    /// The targets' log-probabilities and, if `entropy`, each position's entropy.
    fn head_terms(&self, hidden: &Tensor, targets: &Tensor, entropy: bool) -> Result<(Tensor, Option<Tensor>)> {
        let logits = decoder::logits(self, hidden, &self.config)?;
        let log_probs = crate::fused::log_softmax_last_dim(&logits, self.fast_paths)?;
        let logp = log_probs.gather(targets, D::Minus1)?.squeeze(D::Minus1)?;
        let entropy = entropy.then(|| (log_probs.exp()? * &log_probs)?.sum(D::Minus1)?.neg()).transpose()?;
        Ok((logp, entropy))
    }

    /// Hidden states of `inputs` (`[G, width]`, positions after `prefix`), which attend to the
    /// shared `prefix` and causally to themselves.
    fn forward(&self, prefix: &[u32], inputs: &Tensor) -> Result<Tensor> {
        let frame = self.frame(prefix, inputs)?;
        let (mut px, mut x) = self.embed(prefix, inputs)?;
        for i in 0..self.config.num_hidden_layers {
            (px, x) = self.layer(i, px.as_ref(), &x, &frame)?;
        }
        Ok(x)
    }

    /// Embeddings of the prefix (`[1, P, hidden]`, none when empty) and of the inputs.
    fn embed(&self, prefix: &[u32], inputs: &Tensor) -> Result<(Option<Tensor>, Tensor)> {
        Ok((self.embed_prefix(prefix, inputs.device())?, self.embed_rows(inputs)?))
    }

    fn embed_prefix(&self, prefix: &[u32], device: &Device) -> Result<Option<Tensor>> {
        if prefix.is_empty() {
            return Ok(None);
        }
        let ids = Tensor::from_vec(prefix.to_vec(), (1, prefix.len()), device)?;
        Ok(Some(decoder::embed(self.w(EMBEDDING)?, &ids, &self.config)?))
    }

    fn embed_rows(&self, inputs: &Tensor) -> Result<Tensor> {
        decoder::embed(self.w(EMBEDDING)?, inputs, &self.config)
    }

    /// Rotary tables and masks of one group's positions, shared by every layer.
    fn frame(&self, prefix: &[u32], inputs: &Tensor) -> Result<Frame> {
        let device = inputs.device();
        let (_, width) = inputs.dims2()?;
        let p = prefix.len();
        let dtype = self.cos.dtype();
        let part = |cos: &Tensor, sin: &Tensor, window: Option<usize>| -> Result<FramePart> {
            Ok(FramePart {
                pcos: cos.narrow(0, 0, p.max(1))?,
                psin: sin.narrow(0, 0, p.max(1))?,
                cos: cos.narrow(0, p, width)?,
                sin: sin.narrow(0, p, width)?,
                prefix_mask: wirl_model::layer::causal_mask(p, 0, window, device, dtype)?,
                mask: wirl_model::layer::causal_mask(width, p, window, device, dtype)?,
            })
        };
        Frames::new(&self.config, (&self.cos, &self.sin), self.local_rope.as_ref(), part)
    }

    /// Decoder layer `i` over the prefix's hidden states `px` (run once; its keys and values
    /// are shared by the group's rows) and the rows' `x`.
    fn layer(&self, i: usize, px: Option<&Tensor>, x: &Tensor, frame: &Frame) -> Result<(Option<Tensor>, Tensor)> {
        let (px, prefix_kv) = self.prefix_layer(i, px, frame)?;
        Ok((px, self.rows_layer(i, x, prefix_kv.as_ref(), frame)?))
    }

    /// Decoder layer `i` over the prefix alone: its output and its keys and values.
    fn prefix_layer(
        &self,
        i: usize,
        px: Option<&Tensor>,
        frame: &Frame,
    ) -> Result<(Option<Tensor>, Option<KeyValues>)> {
        let Some(h) = px else { return Ok((None, None)) };
        let f = frame.of_layer(self.config.layer_is_sliding(i));
        let mut layer = NetLayer::new(self, i, (&f.pcos, &f.psin, &f.prefix_mask), None);
        let h = decoder::layer(&mut layer, h)?;
        Ok((Some(h), layer.own))
    }

    /// Decoder layer `i` over rows `x` that attend to the prefix's keys and values first.
    fn rows_layer(&self, i: usize, x: &Tensor, prefix_kv: Option<&KeyValues>, frame: &Frame) -> Result<Tensor> {
        let f = frame.of_layer(self.config.layer_is_sliding(i));
        decoder::layer(&mut NetLayer::new(self, i, (&f.cos, &f.sin, &f.mask), prefix_kv), x)
    }

    /// Bytes of attention intermediates that one backward through the whole forward keeps
    /// alive for this group: scores, masked scores, their exponentials and weights (about
    /// five `[heads, rows, keys]` tensors per layer).
    pub fn attention_graph_bytes(&self, prompt_len: usize, group: usize, width: usize) -> u64 {
        let p = prompt_len.saturating_sub(1) as u64;
        let (group, width) = (group as u64, width as u64);
        let per_layer = p * p + group * width * (p + width);
        let scalar = self.cos.dtype().size_in_bytes() as u64;
        5 * scalar * self.config.num_attention_heads as u64 * self.config.num_hidden_layers as u64 * per_layer
    }

    /// Bytes of one layer's graph over a group's prompt (`prompt_len` tokens, the last one
    /// run with the rows) and its parts of `(rows, width)` completions: what a backward
    /// keeps alive per layer. An estimate from the layer's ops (each op's output lives as
    /// long as the graph): per position, ten hidden-wide tensors (norms, projections,
    /// residuals), five key/value-wide ones and four MLP-wide ones; per row, its keys and
    /// values over the prefix as concatenated and repeated for every head; per query, four
    /// score-wide tensors per head (scores, scaled, masked, softmax).
    pub fn layer_graph_bytes(&self, prompt_len: usize, parts: &[(usize, usize)]) -> u64 {
        let c = &self.config;
        let p = prompt_len.saturating_sub(1) as u64;
        let (hidden, heads) = (c.hidden_size as u64, c.num_attention_heads as u64);
        let kv = (c.num_kv_heads() * c.head_dim()) as u64;
        let per_position = 10 * hidden + 5 * kv + 4 * c.intermediate_size as u64;
        let per_key = 2 * (kv + hidden);
        let mut values = p * per_position + 4 * heads * p * p + p * per_key;
        for &(rows, width) in parts {
            let (rows, width) = (rows as u64, width as u64);
            values +=
                rows * width * per_position + 4 * heads * rows * width * (p + width) + rows * (p + width) * per_key;
        }
        values * self.cos.dtype().size_in_bytes() as u64
    }
}

impl decoder::HeadOps for Net {
    type Error = candle_core::Error;

    fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.rms_norm(x, FINAL_NORM)
    }

    fn project(&self, x: &Tensor) -> Result<Tensor> {
        self.times_transposed(x, self.w(self.head_name())?)
    }
}

/// Layer `i` of a group's forward as the composition (`decoder.rs`) sees it: the policy's
/// weights, the rope tables and mask of these positions, and the prompt's keys and values
/// when these are a group's rows (broadcast over the group).
struct NetLayer<'a> {
    net: &'a Net,
    /// The layer's weights' prefix (`model.layers.{i}`).
    l: String,
    cos: &'a Tensor,
    sin: &'a Tensor,
    mask: &'a Tensor,
    prefix: Option<&'a KeyValues>,
    /// This call's own keys and values, after the rope: the prompt's, which its rows reuse.
    own: Option<KeyValues>,
}

impl<'a> NetLayer<'a> {
    fn new(net: &'a Net, i: usize, frame: (&'a Tensor, &'a Tensor, &'a Tensor), prefix: Option<&'a KeyValues>) -> Self {
        let (cos, sin, mask) = frame;
        NetLayer { net, l: family::layer(i), cos, sin, mask, prefix, own: None }
    }

    fn module(&self, module: &str) -> String {
        format!("{}.{module}", self.l)
    }
}

impl LayerOps for NetLayer<'_> {
    type Error = candle_core::Error;

    fn heads(&self) -> Heads {
        let c = &self.net.config;
        Heads { query: c.num_attention_heads, key_value: c.num_kv_heads(), dim: c.head_dim() }
    }

    fn activation(&self) -> Activation {
        self.net.config.activation()
    }

    fn norm(&self, x: &Tensor, at: NormAt) -> Result<Option<Tensor>> {
        let Some(module) = at.module(&self.net.config.family().norms) else { return Ok(None) };
        self.net.rms_norm(x, &family::weight(&self.module(module))).map(Some)
    }

    fn qkv(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        self.net.projections(x, &self.l, self.net.config.family().attention_in)
    }

    fn gate_up(&self, x: &Tensor) -> Result<[Tensor; 2]> {
        self.net.projections(x, &self.l, self.net.config.family().mlp_in)
    }

    fn out(&self, x: &Tensor, sublayer: Sublayer) -> Result<Tensor> {
        let family = self.net.config.family();
        let module = match sublayer {
            Sublayer::Attention => family.attention_out,
            Sublayer::Mlp => family.mlp_out,
        };
        self.net.linear(x, &self.module(module))
    }

    fn rope(&self, x: &Tensor) -> Result<Tensor> {
        crate::fused::rope(x, self.cos, self.sin, self.net.fast_paths)
    }

    fn keys_values(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        self.own = Some((k.clone(), v.clone()));
        let Some((pk, pv)) = self.prefix else { return Ok((k, v)) };
        let (batch, kvh, p, d) = (k.dim(0)?, pk.dim(1)?, pk.dim(2)?, pk.dim(3)?);
        let pk = pk.broadcast_as((batch, kvh, p, d))?;
        let pv = pv.broadcast_as((batch, kvh, p, d))?;
        Ok((Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?))
    }

    fn attend(&self, q: &Tensor, keys: &Tensor, values: &Tensor) -> Result<Tensor> {
        let (net, scale) = (self.net, self.net.config.attention_scale());
        if let Some(out) = crate::fused::attention(q, keys, values, scale as f32, self.mask, net.fast_paths)? {
            return Ok(out);
        }
        let groups = self.heads().query / self.heads().key_value;
        let keys = repeat_kv(keys, groups).map_err(candle_core::Error::wrap)?.contiguous()?;
        let values = repeat_kv(values, groups).map_err(candle_core::Error::wrap)?.contiguous()?;
        let scores = (net.product(q, &keys.t()?)? * scale)?.broadcast_add(self.mask)?;
        let weights = crate::fused::softmax_last_dim(&scores, net.fast_paths)?;
        net.product(&weights, &values)
    }
}

/// A layer's keys and values, `[1, kv_heads, P, head_dim]` each.
type KeyValues = (Tensor, Tensor);

/// One layer of a group: its inputs (the prefix's and each part's) as leaves, and its
/// outputs with the graph back to them.
struct LayerGraph {
    px: Option<Var>,
    xs: Vec<Var>,
    px_out: Option<Tensor>,
    outs: Vec<Tensor>,
}

/// What the layer-by-layer backward keeps of one layer from the forward.
enum Stored {
    Graph(LayerGraph),
    /// Only its inputs: the layer is rebuilt in the backward.
    Inputs {
        px: Option<Tensor>,
        xs: Vec<Tensor>,
    },
}

/// How much memory one group's backward may hold, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct MemoryLimits {
    /// Above this many bytes of attention intermediates ([`Net::attention_graph_bytes`]) the
    /// layers take the layer-by-layer path; at or below it one graph spans the whole
    /// forward (`u64::MAX`: always whole; 0: always layer by layer).
    pub recompute_above: u64,
    /// On the layer-by-layer path, the most bytes of layer graphs
    /// ([`Net::layer_graph_bytes`] each) kept from the forward: the top layers that fit
    /// keep theirs, the others are run again in the backward (0: all are).
    pub keep_layers: u64,
    /// The most bytes one `[rows, positions, vocab]` tensor of the head may take
    /// ([`Net::head_chunk`]; `u64::MAX`: the whole head at once).
    pub head_chunk: u64,
}

impl MemoryLimits {
    /// One graph over the whole forward and the whole head: the textbook backward.
    pub const WHOLE: MemoryLimits =
        MemoryLimits { recompute_above: u64::MAX, keep_layers: u64::MAX, head_chunk: u64::MAX };
}

/// One group's inputs: the prompt but its last token, the rows' input ids and their targets.
struct Batch<'p> {
    prefix: &'p [u32],
    inputs: Tensor,
    targets: Tensor,
    /// The positions the head computes, where not all ([`Kept`]).
    kept: Option<Kept>,
}

/// One chunk of positions through the fused head.
struct FusedChunk {
    /// The final norm's output, `[rows, len, hidden]`.
    normed: Tensor,
    /// Row-major over `[rows, len]`, as are the stats and the logits' rows.
    targets: Vec<u32>,
    logits: Vec<f32>,
    stats: head::HeadStats,
}

/// What every layer of one group's forward shares: the global layers' rope and masks, and
/// Gemma 3's sliding layers' own.
type Frame = Frames<FramePart>;

/// The prefix's and the rows' rotary tables and masks.
struct FramePart {
    pcos: Tensor,
    psin: Tensor,
    cos: Tensor,
    sin: Tensor,
    prefix_mask: Tensor,
    mask: Tensor,
}

/// A scalar whose gradient with respect to each output is the gradient that came down to it
/// from above (`Σ out · g`), to pull those gradients through what made the outputs.
fn pulled<'a>(terms: impl IntoIterator<Item = (&'a Tensor, &'a Tensor)>) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    for (out, grad) in terms {
        let term = (out * grad)?.sum_all()?;
        sum = Some(match sum {
            Some(sum) => (sum + term)?,
            None => term,
        });
    }
    sum.ok_or_else(|| candle_core::Error::Msg("no gradient to pull".into()))
}

/// The policy being trained: its weights as variables (updated in place by the optimizer,
/// so an inference model built from [`Policy::shared_tensors`] sees every update without a
/// copy).
pub struct Policy {
    net: Net,
    vars: Vec<(String, Var)>,
    /// What the adapters are, for a LoRA policy (its variables are their A and B).
    lora: Option<LoraSpec>,
}

impl Policy {
    pub fn new(config: &Config, tensors: &HashMap<String, Tensor>, device: &Device) -> Result<Self> {
        let mut vars: Vec<(String, Var)> =
            tensors.iter().map(|(n, t)| Ok((n.clone(), Var::from_tensor(t)?))).collect::<Result<_>>()?;
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let weights = vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
        Ok(Policy { net: Net::new(config, weights, device)?, vars, lora: None })
    }

    /// A LoRA policy: the base's `tensors` frozen as they are (no gradient, no optimizer
    /// state, no copy), the adapter's matrices the variables.
    pub fn with_adapter(
        config: &Config,
        tensors: HashMap<String, Tensor>,
        adapter: &Adapter,
        device: &Device,
    ) -> Result<Self> {
        let mut vars: Vec<(String, Var)> =
            adapter.tensors.iter().map(|(n, t)| Ok((n.clone(), Var::from_tensor(t)?))).collect::<Result<_>>()?;
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut weights: HashMap<String, Tensor> = tensors.into_iter().map(|(n, t)| (n, t.detach())).collect();
        weights.extend(vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())));
        let mut net = Net::new(config, weights, device)?;
        net.lora_scale = Some(adapter.spec.scale());
        Ok(Policy { net, vars, lora: Some(adapter.spec.clone()) })
    }

    /// A LoRA policy's adapter as it is now (sharing the variables' storage).
    pub fn adapter(&self) -> Option<Adapter> {
        let spec = self.lora.clone()?;
        let tensors = self.vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().detach())).collect();
        Some(Adapter { spec, tensors })
    }

    pub fn net(&self) -> &Net {
        &self.net
    }

    /// See [`Net::set_fast_paths`] (references made after this inherit it).
    pub fn set_fast_paths(&mut self, on: bool) {
        self.net.fast_paths = on;
    }

    /// See [`Net::set_compute_dtype`] (references made after this inherit it).
    pub fn set_compute_dtype(&mut self, dtype: DType) {
        self.net.compute = dtype;
    }

    /// The LoRA scale, when the policy trains adapters.
    pub fn lora_scale(&self) -> Option<f64> {
        self.net.lora_scale
    }

    /// The variables, sorted by name (the optimizer's and checkpoints' order).
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The weights, sharing storage with the variables.
    pub fn shared_tensors(&self) -> &HashMap<String, Tensor> {
        self.net.weights()
    }

    /// The loss of one group, its gradients with respect to the policy's variables added
    /// into `grads`. `loss_of` turns the group's token stats into a scalar loss (plus what
    /// the caller wants back). When a backward through the whole forward would keep more
    /// than `limits.recompute_above` bytes of attention intermediates, it goes layer by
    /// layer instead ([`Policy::parts_loss_and_grads`]: the same ops, the graphs of only as
    /// many layers as `limits.keep_layers` allows kept from the forward, the others rebuilt
    /// one at a time). The flag returned says whether it went layer by layer. The head is
    /// computed `limits.head_chunk` bytes at a time ([`Net::head_chunk`]).
    pub fn loss_and_grads<R>(
        &self,
        prompt: &[u32],
        completions: &[Vec<u32>],
        limits: &MemoryLimits,
        grads: &mut Gradients,
        loss_of: impl FnOnce(&TokenStats) -> Result<(Tensor, R)>,
    ) -> Result<(R, bool)> {
        self.part_loss_and_grads(prompt, Part::every_position(completions), limits, grads, loss_of)
    }

    /// [`Policy::loss_and_grads`] of a part: the head only at the positions it asks for
    /// ([`Part::trained`]); the stats `loss_of` sees are zeros elsewhere.
    pub fn part_loss_and_grads<R>(
        &self,
        prompt: &[u32],
        part: Part<'_>,
        limits: &MemoryLimits,
        grads: &mut Gradients,
        loss_of: impl FnOnce(&TokenStats) -> Result<(Tensor, R)>,
    ) -> Result<(R, bool)> {
        let completions = part.completions;
        let width = completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
        // By chunks (fused where it can be) unless the whole head was asked for.
        let whole_head = limits.head_chunk == u64::MAX;
        let net = &self.net;
        if net.attention_graph_bytes(prompt.len(), completions.len(), width) <= limits.recompute_above {
            let batch = net.part_batch(prompt, &part)?;
            let top = net.forward(batch.prefix, &batch.inputs)?;
            if whole_head {
                let stats = net.at_kept(&top, &batch, |hidden, targets| net.head_stats(hidden, targets))?;
                let (loss, extra) = loss_of(&stats)?;
                self.absorb(&mut loss.backward()?, grads)?;
                return Ok((extra, false));
            }
            // The layers' graph whole, the head by chunks: its gradient with respect to the
            // last hidden states, then pulled through the layers.
            let (extra, grad_top) = self.head_by_chunks(&top.detach(), &batch, limits.head_chunk, grads, loss_of)?;
            self.absorb(&mut pulled([(&top, &grad_top)])?.backward()?, grads)?;
            return Ok((extra, false));
        }
        let mut loss_of = Some(loss_of);
        let mut extras = self.parts_loss_and_grads(prompt, &[part], limits, grads, |_, stats| {
            loss_of.take().expect("one part, one loss")(stats)
        })?;
        Ok((extras.pop().expect("one part"), true))
    }

    /// The recomputing backward of a group trained as `parts` (micro-batches of its
    /// completions): the prompt runs once for all of them — each layer rebuilt once, every
    /// part's rows attending to the prompt's keys and values — so the prompt's gradient
    /// gathers every part's before it goes down, and no part pays for the prompt again.
    /// `loss_of(k, stats)` is part `k`'s loss; returns what each gave. The top layers whose
    /// graphs fit in `limits.keep_layers` keep them from the forward; every other layer is
    /// run again from its kept inputs in the backward, one layer's graph alive at a time.
    /// One function of ~90 lines on purpose: its four commented phases (the forward, keeping
    /// or storing each layer; the heads; the layers' backward; the embeddings) hand `stored`,
    /// the hidden states and their gradients on in order, and the backward pops exactly what
    /// the forward pushed: split, that pairing would span functions.
    pub fn parts_loss_and_grads<R>(
        &self,
        prompt: &[u32],
        parts: &[Part<'_>],
        limits: &MemoryLimits,
        grads: &mut Gradients,
        mut loss_of: impl FnMut(usize, &TokenStats) -> Result<(Tensor, R)>,
    ) -> Result<Vec<R>> {
        let net = &self.net;
        let whole_head = limits.head_chunk == u64::MAX;
        let batches = parts.iter().map(|part| net.part_batch(prompt, part)).collect::<Result<Vec<_>>>()?;
        let frames = batches.iter().map(|b| net.frame(b.prefix, &b.inputs)).collect::<Result<Vec<_>>>()?;
        let (Some(first), Some(prefix_frame)) = (batches.first(), frames.first()) else {
            return Ok(Vec::new());
        };
        let prefix = first.prefix;
        let layers = net.config.num_hidden_layers;
        // The top layers whose graphs fit in the budget keep them from this forward; the
        // others run without a graph, keeping only their inputs (a few MB at most), and are
        // rebuilt in the backward. Kept at the top: their graphs are freed first, before any
        // layer below is rebuilt.
        let shapes: Vec<(usize, usize)> = batches.iter().map(|b| b.inputs.dims2()).collect::<Result<_>>()?;
        let per_layer = net.layer_graph_bytes(prompt.len(), &shapes).max(1);
        let kept = usize::try_from(limits.keep_layers / per_layer).unwrap_or(usize::MAX).min(layers);
        let frozen = net.detached();
        let mut px = frozen.embed_prefix(prefix, first.inputs.device())?;
        let mut xs = batches.iter().map(|b| frozen.embed_rows(&b.inputs)).collect::<Result<Vec<_>>>()?;
        let mut stored = Vec::with_capacity(layers);
        for i in 0..layers {
            if i >= layers - kept {
                let graph = self.layer_graph(i, px.as_ref(), &xs, prefix_frame, &frames)?;
                px = graph.px_out.as_ref().map(Tensor::detach);
                xs = graph.outs.iter().map(Tensor::detach).collect();
                stored.push(Stored::Graph(graph));
                continue;
            }
            let (next_px, kv) = frozen.prefix_layer(i, px.as_ref(), prefix_frame)?;
            let next_xs = xs
                .iter()
                .zip(&frames)
                .map(|(x, frame)| frozen.rows_layer(i, x, kv.as_ref(), frame))
                .collect::<Result<Vec<_>>>()?;
            stored.push(Stored::Inputs { px, xs });
            (px, xs) = (next_px, next_xs);
        }
        // The heads: each part's loss from its last hidden states, a leaf whose gradient goes
        // down.
        let mut extras = Vec::with_capacity(parts.len());
        let mut x_grads = Vec::with_capacity(parts.len());
        for (k, (top, batch)) in xs.iter().zip(&batches).enumerate() {
            let (extra, grad_top) = if whole_head {
                let top = Var::from_tensor(top)?;
                let stats = net.at_kept(top.as_tensor(), batch, |hidden, targets| net.head_stats(hidden, targets))?;
                let (loss, extra) = loss_of(k, &stats)?;
                (extra, self.take_grads(&mut loss.backward()?, grads, top.as_tensor())?)
            } else {
                self.head_by_chunks(top, batch, limits.head_chunk, grads, |stats| loss_of(k, stats))?
            };
            extras.push(extra);
            x_grads.push(grad_top);
        }
        // Layers from the top: its graph (kept, or rebuilt), the upstream gradients pulled
        // through it.
        let mut px_grad: Option<Tensor> = None;
        for i in (0..layers).rev() {
            let LayerGraph { px, xs, px_out, outs } = match stored.pop().expect("one entry per layer") {
                Stored::Graph(graph) => graph,
                Stored::Inputs { px, xs } => self.layer_graph(i, px.as_ref(), &xs, prefix_frame, &frames)?,
            };
            let prefix_term = px_out.as_ref().zip(px_grad.as_ref());
            let mut store = pulled(outs.iter().zip(&x_grads).chain(prefix_term))?.backward()?;
            px_grad = px.map(|px| self.take_grads(&mut store, grads, px.as_tensor())).transpose()?;
            x_grads = xs.iter().map(|x| self.take_grads(&mut store, grads, x.as_tensor())).collect::<Result<_>>()?;
        }
        // The embeddings (tied to the head in many models: their gradients add up); frozen
        // in a LoRA policy.
        if self.var(EMBEDDING).is_err() {
            return Ok(extras);
        }
        if net.fused_head() {
            let prefix_rows = px_grad.as_ref().map(|g| (prefix, g));
            self.add_embedding_grads(prefix_rows, batches.iter().map(|b| &b.inputs).zip(&x_grads), grads)?;
        } else {
            let px = net.embed_prefix(prefix, first.inputs.device())?;
            let xs = batches.iter().map(|b| net.embed_rows(&b.inputs)).collect::<Result<Vec<_>>>()?;
            let prefix_term = px.as_ref().zip(px_grad.as_ref());
            self.absorb(&mut pulled(xs.iter().zip(&x_grads).chain(prefix_term))?.backward()?, grads)?;
        }
        Ok(extras)
    }

    /// Layer `i` over leaves holding `px` (the prefix's hidden states) and `xs` (each
    /// part's), with the graph from them to its outputs.
    fn layer_graph(
        &self,
        i: usize,
        px: Option<&Tensor>,
        xs: &[Tensor],
        prefix_frame: &Frame,
        frames: &[Frame],
    ) -> Result<LayerGraph> {
        let px = px.map(Var::from_tensor).transpose()?;
        let xs = xs.iter().map(Var::from_tensor).collect::<Result<Vec<_>>>()?;
        let (px_out, kv) = self.net.prefix_layer(i, px.as_ref().map(Var::as_tensor), prefix_frame)?;
        let outs = xs
            .iter()
            .zip(frames)
            .map(|(x, frame)| self.net.rows_layer(i, x.as_tensor(), kv.as_ref(), frame))
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerGraph { px, xs, px_out, outs })
    }

    /// The embeddings' gradient: each position's upstream gradient added into its token's
    /// row — the prefix's (its ids and `[1, P, hidden]` gradient) and each part's rows (ids
    /// `[rows, width]`, gradient `[rows, width, hidden]`). By hand because candle's backward
    /// of the lookup builds a zeroed copy of the whole table (113 MB for SmolLM2's) per
    /// lookup and adds it to the sum.
    fn add_embedding_grads<'a>(
        &self,
        prefix: Option<(&[u32], &Tensor)>,
        rows: impl IntoIterator<Item = (&'a Tensor, &'a Tensor)>,
        grads: &mut Gradients,
    ) -> Result<()> {
        // Frozen embeddings (a LoRA policy): nothing to add.
        let Ok(embed) = self.var(EMBEDDING) else { return Ok(()) };
        let d = self.net.config.hidden_size;
        let (mut ids, mut values): (Vec<u32>, Vec<f32>) = (Vec::new(), Vec::new());
        if let Some((prefix, grad)) = prefix {
            ids.extend_from_slice(prefix);
            values.extend(grad.flatten_all()?.to_vec1::<f32>()?);
        }
        for (inputs, grad) in rows {
            ids.extend(inputs.flatten_all()?.to_vec1::<u32>()?);
            values.extend(grad.flatten_all()?.to_vec1::<f32>()?);
        }
        // Gemma's embeddings were scaled on the way in: so is their gradient.
        if let Some(scale) = self.net.config.embed_scale() {
            values.iter_mut().for_each(|v| *v *= scale as f32);
        }
        if values.len() != ids.len() * d {
            candle_core::bail!("{} gradient values for {} positions of width {d}", values.len(), ids.len());
        }
        let vocab = embed.dim(0)?;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            candle_core::bail!("token {id} is outside the {vocab}-row embedding table");
        }
        grads.add_with(embed, |sum| {
            for (&id, row) in ids.iter().zip(values.chunks_exact(d)) {
                for (s, g) in sum[id as usize * d..][..d].iter_mut().zip(row) {
                    *s += g;
                }
            }
        })
    }

    /// The variable called `name`.
    fn var(&self, name: &str) -> Result<&Var> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, var)| var)
            .ok_or_else(|| candle_core::Error::Msg(format!("no variable `{name}`")))
    }

    /// The loss over the head's stats of `top` (`[rows, width, hidden]`, no graph), `chunk`
    /// positions at a time: the stats without a graph, the loss's gradient with respect to
    /// them, then each chunk's share of it pulled through the head (its weights' gradients
    /// into `grads`). Returns what `loss_of` gave and the gradient with respect to `top`.
    fn head_by_chunks<R>(
        &self,
        top: &Tensor,
        batch: &Batch<'_>,
        chunk_bytes: u64,
        grads: &mut Gradients,
        loss_of: impl FnOnce(&TokenStats) -> Result<(Tensor, R)>,
    ) -> Result<(R, Tensor)> {
        // Only the positions the part asks for, gathered into one row (all where none is
        // skipped); their gradient put back at its positions at the end.
        let (top, targets) = match &batch.kept {
            Some(kept) => (kept.gather(top)?, kept.gather(&batch.targets)?),
            None => (top.clone(), batch.targets.clone()),
        };
        let (rows, width) = (top.dim(0)?, top.dim(1)?);
        let chunk = self.net.head_chunk(rows, width, chunk_bytes);
        let stats = self.net.detached().head_stats_by_chunks(&top, &targets, chunk)?;
        let (logp, entropy) = (Var::from_tensor(&stats.logp)?, Var::from_tensor(&stats.entropy)?);
        let leaves = TokenStats { logp: logp.as_tensor().clone(), entropy: entropy.as_tensor().clone() };
        let leaves = match &batch.kept {
            Some(kept) => TokenStats { logp: kept.scatter(&leaves.logp)?, entropy: kept.scatter(&leaves.entropy)? },
            None => leaves,
        };
        let (loss, extra) = loss_of(&leaves)?;
        let leaf_grads = loss.backward()?;
        let (d_logp, d_entropy) =
            (leaf_grads.get(logp.as_tensor()).cloned(), leaf_grads.get(entropy.as_tensor()).cloned());
        let fused = self.net.fused_head();
        let mut grad_top = Vec::new();
        for start in (0..width).step_by(chunk) {
            let len = chunk.min(width - start);
            let piece = Var::from_tensor(&top.narrow(1, start, len)?.contiguous()?)?;
            let targets = targets.narrow(1, start, len)?.contiguous()?;
            let (d_logp, d_entropy) = (
                d_logp.as_ref().map(|d| d.narrow(1, start, len)).transpose()?,
                d_entropy.as_ref().map(|d| d.narrow(1, start, len)).transpose()?,
            );
            if d_logp.is_none() && d_entropy.is_none() {
                grad_top.push(piece.as_tensor().zeros_like()?);
                continue;
            }
            let sum = if fused {
                self.fused_chunk_backward(piece.as_tensor(), &targets, d_logp.as_ref(), d_entropy.as_ref(), grads)?
            } else {
                let (logp, entropy) = self.net.head_terms(piece.as_tensor(), &targets, d_entropy.is_some())?;
                let mut terms = Vec::new();
                if let Some(d) = &d_logp {
                    terms.push((logp * d)?.sum_all()?);
                }
                if let (Some(entropy), Some(d)) = (entropy, &d_entropy) {
                    terms.push((entropy * d)?.sum_all()?);
                }
                let first = terms.pop().expect("a gradient reached the stats");
                terms.into_iter().try_fold(first, |a, b| a + b)?
            };
            grad_top.push(self.take_grads(&mut sum.backward()?, grads, piece.as_tensor())?);
        }
        let grad_top = Tensor::cat(&grad_top, 1)?;
        let grad_top = match &batch.kept {
            Some(kept) => kept.scatter(&grad_top)?,
            None => grad_top,
        };
        Ok((extra, grad_top))
    }

    /// One chunk of the fused head's backward: the head weight's gradient added into
    /// `grads` by the product itself; returned, a scalar whose backward pulls the gradient
    /// with respect to the normed states through the final norm (to `piece` and the norm's
    /// weight).
    fn fused_chunk_backward(
        &self,
        piece: &Tensor,
        targets: &Tensor,
        d_logp: Option<&Tensor>,
        d_entropy: Option<&Tensor>,
        grads: &mut Gradients,
    ) -> Result<Tensor> {
        let net = &self.net;
        let FusedChunk { normed, targets, mut logits, stats } = net.fused_chunk(piece, targets)?;
        let (rows, len, d) = normed.dims3()?;
        let (n, vocab) = (rows * len, net.config.vocab_size);
        let as_vec = |t: Option<&Tensor>| t.map(|t| t.flatten_all()?.to_vec1::<f32>()).transpose();
        let (d_logp, d_entropy) = (as_vec(d_logp)?, as_vec(d_entropy)?);
        let d_logp = d_logp.unwrap_or_else(|| vec![0.0; n]);
        head::logits_grad_in_place(&mut logits, &targets, &stats, &d_logp, d_entropy.as_deref(), vocab);
        // A frozen head (a LoRA policy) takes no gradient; the states below it still do.
        let head_var = self.var(net.head_name()).ok();
        let d_normed = with_f32(&normed.detach(), |h| {
            with_f32(net.w(net.head_name())?, |w| {
                if let Some(head_var) = head_var {
                    grads.add_with(head_var, |dw| head::add_weight_grad(dw, &logits, h, n, d, vocab))?;
                }
                Ok(head::input_grad(&logits, w, n, d, vocab))
            })
        })?;
        let d_normed = Tensor::from_vec(d_normed, (rows, len, d), normed.device())?;
        (normed * d_normed)?.sum_all()
    }

    /// Add the variables' gradients from `store` into `grads` and return the gradient of
    /// `leaf` (zeros if nothing reached it).
    fn take_grads(&self, store: &mut GradStore, grads: &mut Gradients, leaf: &Tensor) -> Result<Tensor> {
        self.absorb(store, grads)?;
        match store.remove(leaf) {
            Some(grad) => Ok(grad),
            None => leaf.zeros_like(),
        }
    }

    fn absorb(&self, store: &mut GradStore, grads: &mut Gradients) -> Result<usize> {
        grads.absorb(store, self.vars.iter().map(|(_, var)| var))
    }

    /// The KL reference: for a LoRA policy, the base with the adapters off (the same
    /// storage, no copy); otherwise a frozen copy of the weights.
    pub fn reference(&self, device: &Device) -> Result<Net> {
        if self.lora.is_some() {
            // Every weight but the variables (the adapters).
            let trained = |name: &str| self.vars.iter().any(|(n, _)| n == name);
            let base = self.net.weights.iter().filter(|(n, _)| !trained(n)).map(|(n, t)| (n.clone(), t.detach()));
            let mut reference = Net::new(self.net.config(), base.collect(), device)?;
            reference.fast_paths = self.net.fast_paths;
            reference.compute = self.net.compute;
            return Ok(reference);
        }
        self.frozen_copy(device)
    }

    /// A frozen copy (the KL reference).
    pub fn frozen_copy(&self, device: &Device) -> Result<Net> {
        let weights =
            self.vars.iter().map(|(n, v)| Ok((n.clone(), v.as_tensor().copy()?.detach()))).collect::<Result<_>>()?;
        let mut copy = Net::new(self.net.config(), weights, device)?;
        copy.fast_paths = self.net.fast_paths;
        copy.compute = self.net.compute;
        Ok(copy)
    }
}
