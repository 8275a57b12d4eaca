//! Llama-style decoders: Llama, SmolLM2, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms),
//! Gemma 3 (sandwich norms, sliding-window layers; `Config`'s family questions). Grouped-query
//! attention, rotary embeddings (with Llama 3 scaling), tied embeddings.
//!
//! Batched: every row has its own positions and a padding mask, so ragged prompts share a
//! batch (left-padded). Tensor-parallel: a model loaded with a [`Comm`] of `size` ranks keeps
//! its share of the heads, the MLP width and the vocabulary (see `comm.rs`). On the CPU in
//! f32 its products, norms and attention are `invariant.rs`'s, which the trainer's forward
//! also computes (with gradients): the same bits for a token's log-prob on both sides.
//! Elsewhere it uses candle's fused `rms_norm` and `softmax_last_dim`.

use crate::block_matmul::BlockMatrix;
use crate::comm::{Comm, Solo};
use crate::config::{Activation, Config};
use crate::decode_attention::{DecodeAttention, RopeTables, StoreToken};
use crate::decode_matmul::{self, FewRowMatmul, SwiGluMatmul};
use crate::decoder::{self, Heads, NormAt, Qkv, Sublayer};
use crate::family::{self, Family, Part, Projection};
use crate::invariant::Mask;
use crate::layer::Frames;
use crate::{Error, Result};
use candle_core::quantized::QMatMul;
use candle_core::{D, DType, Device, Module, Tensor};
use std::sync::Arc;
pub use wirl_model::ops::{LoraPair, computed_as, local_rope_tables, repeat_kv, rope_tables, rotate_half_rope};

/// A weight matrix `[out, in]`: plain (f32 / bf16, trainable) or quantized (inference only).
#[derive(Clone, Debug)]
pub enum Weight {
    Dense(Tensor),
    /// candle's quantized matmul (any GGUF type; activations quantized to 8 bits).
    Quantized(Arc<QMatMul>),
    /// Q4_1 / Q8_0 blocks as stored, multiplied by wirl's CPU kernel (`block_matmul.rs`).
    Blocks(Arc<BlockMatrix>),
}

/// Up to this many rows, a dense linear multiplies `W · xᵀ` (see `Linear::forward`).
const SMALL_BATCH_ROWS: usize = 32;

/// Rows of a matmul input: every dimension but the last.
fn rows(x: &Tensor) -> usize {
    x.dims()[..x.rank().saturating_sub(1)].iter().product()
}

/// `y = x Wᵀ + b`, plus a LoRA adapter's `scale·(x Aᵀ) Bᵀ` where one is loaded (applied
/// beside the base, never merged into it: a trainer updates A and B in place).
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
    pub adapter: Option<LoraPair>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            // One order of summation at every row count: a prompt's prefill, a decoding
            // step and the learner's pass give each element the same bits (issue 61).
            Weight::Dense(w) if crate::invariant::applies(x, w) => crate::invariant::matmul_t(x, w)?,
            Weight::Dense(w) if rows(x) <= SMALL_BATCH_ROWS => few_rows_matmul(x, w)?,
            Weight::Dense(w) => x.broadcast_matmul(&computed_as(w, x)?.t()?)?,
            Weight::Quantized(q) => q.forward(x)?,
            Weight::Blocks(m) => m.forward(x)?,
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        Ok(match &self.adapter {
            Some(adapter) => (y + adapter.forward(x)?)?,
            None => y,
        })
    }
}

/// `x · Wᵀ` for the few rows of decoding. On a CPU with AVX2, f32: the decoding kernel, which
/// reads each weight row once for all rows. Otherwise gemm's `W · xᵀ` rather than `x · Wᵀ`:
/// gemm repacks its right-hand side on every call, and with W on the left it does not copy
/// the whole weight matrix per step (group-of-8 decoding ran 1.4× faster).
fn few_rows_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let kernel = decoding_kernel(x, w);
    Ok(decode_matmul::on_rows(x, w.dim(0)?, |x2| {
        if kernel {
            x2.apply_op2_no_bwd(&w.contiguous()?, &FewRowMatmul)
        } else {
            computed_as(w, x2)?.matmul(&x2.t()?)?.t()?.contiguous()
        }
    })?)
}

/// Whether `x · wᵀ` goes to the CPU decoding kernels (`decode_matmul.rs`): few rows, f32
/// activations and f32 or bf16 weights, on a CPU with AVX2 and FMA.
fn decoding_kernel(x: &Tensor, w: &Tensor) -> bool {
    rows(x) <= SMALL_BATCH_ROWS
        && w.device().is_cpu()
        && matches!(w.dtype(), DType::F32 | DType::BF16)
        && x.dtype() == DType::F32
        && decode_matmul::available()
}

/// Where weights come from: the loader maps HF tensor names to its file's tensors.
pub trait WeightSource {
    /// The matrix stored under the HF name `name` (e.g. `model.layers.0.mlp.up_proj.weight`).
    fn linear_weight(&mut self, name: &str) -> Result<Weight>;
    /// A vector or matrix always needed dense (norms, biases, the embedding table).
    fn dense(&mut self, name: &str) -> Result<Tensor>;
    /// Whether `name` exists.
    fn contains(&self, name: &str) -> bool;
    /// The LoRA adapter of the projection `module` (its HF name without `.weight`), if the
    /// source holds one.
    fn adapter(&mut self, _module: &str) -> Result<Option<LoraPair>> {
        Ok(None)
    }
    /// Whether the matrix `name` (a q or k projection) produces llama.cpp's interleaved rope
    /// layout, which the model reorders to the HF (rotate-half) layout after projecting.
    fn interleaved(&self, _name: &str) -> bool {
        false
    }
    /// The tensors `parts` (read as `names`, each `[out_i, ..]`, one dtype) as one tensor of
    /// `[Σ out_i, ..]`, when the model may keep its own copy of them in that form: where
    /// several projections read the same input (q/k/v, gate/up) one product then does the
    /// work of several — on a GPU, one kernel launch instead of three. `None` (the default):
    /// keep them apart — a trainer's weights, which the model shares so that every update is
    /// seen in place.
    fn fuse(&mut self, _names: &[String], _parts: &[&Tensor]) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

/// Projections that read the same input (q/k/v, gate/up), each checkpoint module's rows
/// holding one part or several ([`crate::family::Projection`]: Llama's `q_proj`, or a fused
/// `qkv_proj`): a product per module, or one product on the model's own fused copy of
/// several modules ([`WeightSource::fuse`]). The outputs are split into the `N` parts by
/// `widths` either way, with the same values: each output is the same dot product.
#[derive(Clone, Debug)]
struct Projections<const N: usize> {
    /// One product each.
    modules: Vec<Linear>,
    /// How many parts each module's output holds, in order.
    parts: Vec<usize>,
    /// Each part's width (this rank's share).
    widths: [usize; N],
    /// Whether `modules` is the model's own fused copy of several checkpoint modules.
    fused: bool,
}

impl<const N: usize> Projections<N> {
    /// `modules` (read as `names`, each with its number of parts) fused when the source
    /// allows it and they can be: several, dense, one dtype, no adapter (applied beside
    /// each base), biases on all or none.
    fn new(
        source: &mut dyn WeightSource,
        names: Vec<String>,
        modules: Vec<(Linear, usize)>,
        widths: [usize; N],
    ) -> Result<Self> {
        let (modules, parts): (Vec<Linear>, Vec<usize>) = modules.into_iter().unzip();
        let weights: Vec<&Tensor> = modules
            .iter()
            .filter_map(|p| match (&p.weight, &p.adapter) {
                (Weight::Dense(w), None) => Some(w),
                _ => None,
            })
            .collect();
        let biases: Vec<&Tensor> = modules.iter().filter_map(|p| p.bias.as_ref()).collect();
        let dtype = weights.first().map(|w| w.dtype());
        // One dtype for weights and biases alike: a source then fuses both or neither (a
        // trainer's copies are made by dtype), never the weights alone.
        let fusable = modules.len() > 1
            && weights.len() == modules.len()
            && (biases.is_empty() || biases.len() == modules.len())
            && weights.iter().chain(&biases).all(|t| Some(t.dtype()) == dtype);
        let named = |suffix: &str| names.iter().map(|n| format!("{n}.{suffix}")).collect::<Vec<_>>();
        let weight = match fusable {
            true => source.fuse(&named("weight"), &weights)?,
            false => None,
        };
        let bias = match (&weight, biases.is_empty()) {
            (Some(_), false) => source.fuse(&named("bias"), &biases)?.map(Some),
            _ => Some(None),
        };
        let (Some(weight), Some(bias)) = (weight, bias) else {
            return Ok(Projections { modules, parts, widths, fused: false });
        };
        let linear = Linear { weight: Weight::Dense(weight), bias, adapter: None };
        Ok(Projections { modules: vec![linear], parts: vec![N], widths, fused: true })
    }

    /// Each part of `x`'s projections, in order: views of a module's output where it holds
    /// several.
    fn forward(&self, x: &Tensor) -> Result<[Tensor; N]> {
        let mut outputs = Vec::with_capacity(N);
        let mut widths = self.widths.iter();
        for (module, &parts) in self.modules.iter().zip(&self.parts) {
            let y = module.forward(x)?;
            if parts == 1 {
                widths.next();
                outputs.push(y);
                continue;
            }
            let mut start = 0;
            for &width in widths.by_ref().take(parts) {
                outputs.push(y.narrow(D::Minus1, start, width)?);
                start += width;
            }
        }
        Ok(outputs.try_into().unwrap_or_else(|_| unreachable!("N parts")))
    }

    /// Each part's plain dense matrix, when every module is one without bias or adapter.
    fn dense_parts(&self) -> Result<Option<[Tensor; N]>> {
        let mut matrices = Vec::with_capacity(N);
        let mut widths = self.widths.iter();
        for (module, &parts) in self.modules.iter().zip(&self.parts) {
            let Linear { weight: Weight::Dense(w), bias: None, adapter: None } = module else { return Ok(None) };
            let mut start = 0;
            for &width in widths.by_ref().take(parts) {
                matrices.push(if parts == 1 { w.clone() } else { w.narrow(0, start, width)? });
                start += width;
            }
        }
        Ok(Some(matrices.try_into().unwrap_or_else(|_| unreachable!("N parts"))))
    }
}

#[derive(Clone, Debug)]
struct Attention {
    /// q, k and v.
    qkv: Projections<3>,
    o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The q / k projections' outputs are in llama.cpp's interleaved order.
    q_interleaved: bool,
    k_interleaved: bool,
    /// Qwen3 and Gemma 3: each head's query and key RMS-normed (over `head_dim`) before the
    /// rotary embedding.
    qk_norm: Option<QkNorm>,
    /// What scores are multiplied by (`head_dim^-1/2`; Gemma 3: `query_pre_attn_scalar^-1/2`).
    scale: f64,
    /// Gemma 3's sliding layers: keys within the window only, with the local rope.
    sliding: bool,
}

#[derive(Clone, Debug)]
struct QkNorm {
    q: Norm,
    k: Norm,
}

/// An RMS norm: its weight, `eps`, and what the weight is offset by (Gemma: `1 + w`).
#[derive(Clone, Debug)]
struct Norm {
    weight: Tensor,
    eps: f64,
    offset: f64,
}

impl Norm {
    fn load(source: &mut dyn WeightSource, name: &str, config: &Config) -> Result<Norm> {
        Ok(Norm { weight: source.dense(name)?, eps: config.rms_norm_eps, offset: config.norm_offset() })
    }

    /// `x` normed over its last dimension. The offset is added on every call: the weight's
    /// storage may be a trainer's, updated in place.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        if x.dtype() == DType::F32 && x.device().is_cpu() && crate::invariant::available() {
            // The learner's norm, to the bit (`invariant.rs`).
            return Ok(crate::invariant::rms_norm(&x, &self.weight()?, self.eps)?);
        }
        Ok(candle_nn::ops::rms_norm(&x, &self.weight()?, self.eps as f32)?)
    }

    /// The weight as the family applies it (`layer::norm_weight`: Gemma's `1 + w`).
    fn weight(&self) -> Result<Tensor> {
        Ok(crate::layer::norm_weight(&self.weight, self.offset)?)
    }

    /// A decoding step's projection (`[.., heads · head_dim]`), normed head by head.
    fn forward_flat(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let head_dim = x.dim(D::Minus1)? / heads;
        let rows = x.elem_count() / head_dim;
        Ok(self.forward(&x.reshape((rows, head_dim))?)?.reshape(x.shape())?)
    }
}

#[derive(Clone, Debug)]
struct Mlp {
    /// gate and up.
    gate_up: Projections<2>,
    down: Linear,
    activation: Activation,
}

#[derive(Clone, Debug)]
struct Block {
    attn_norm: Norm,
    attn: Attention,
    /// Gemma's norm of the attention's output, before the residual.
    post_attn_norm: Option<Norm>,
    mlp_norm: Norm,
    mlp: Mlp,
    /// Gemma's norm of the MLP's output, before the residual.
    post_mlp_norm: Option<Norm>,
}

/// Keys and values of every layer for the rows of one batch: buffers `[batch, kv_heads,
/// capacity, dim]` of which the first `len` positions are filled. Decoding writes each
/// step's keys and values in place; a buffer grows (with room to spare) only when full, so
/// a step does not copy the whole cache as concatenating would (by arithmetic ~2 MB per
/// layer per step for 8 rows at 190 positions; on the H100, 64 rows ran 2.2× faster).
/// Not `Clone`: two owners appending into shared buffers would overwrite each other's
/// positions.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize) -> Self {
        KvCache { layers: vec![None; layers], len: 0 }
    }

    /// Positions stored so far (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Rows of the buffers (slots, some perhaps left by finished rows); `None` while empty.
    pub fn rows(&self) -> Option<usize> {
        self.layers.iter().flatten().next().and_then(|(k, _)| k.dim(0).ok())
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep (or repeat) the rows named in `rows`: a prompt's row is repeated for its samples,
    /// and finished rows leave the batch. The buffers keep their spare room.
    pub fn select_rows(&self, rows: &Tensor) -> Result<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok(Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?))),
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len: self.len })
    }

    /// Every layer's filled keys and values, `[batch, kv_heads, len, dim]`, through `f`,
    /// which returns them with `len` positions.
    fn map(&self, len: usize, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok(Some((f(&k.narrow(2, 0, self.len)?)?, f(&v.narrow(2, 0, self.len)?)?))),
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len })
    }

    /// `n` zero positions before every row's (the rows' pads grow by `n`), so that a cache
    /// lines up with a longer one.
    pub fn left_pad(&self, n: usize) -> Result<KvCache> {
        self.map(self.len + n, |t| {
            let (batch, heads, _, dim) = t.dims4()?;
            let zeros = Tensor::zeros((batch, heads, n, dim), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[&zeros, t], 2)?)
        })
    }

    /// A one-row cache of `span` (per layer `[kv_heads, ≥ len, dim]`): its first `len`
    /// positions, in buffers of its own.
    pub fn from_span(span: &[(Tensor, Tensor)], len: usize) -> Result<KvCache> {
        let layers = span
            .iter()
            // `force_contiguous`: storage of its own, laid out as appending in place needs.
            .map(|(k, v)| {
                let own = |t: &Tensor| t.narrow(1, 0, len)?.unsqueeze(0)?.force_contiguous();
                Ok(Some((own(k)?, own(v)?)))
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len })
    }

    /// Row `row`'s keys and values of positions `start..start + len`, per layer
    /// `[kv_heads, len, dim]` (views of this cache's buffers).
    pub fn row_span(&self, row: usize, start: usize, len: usize) -> Result<Vec<(Tensor, Tensor)>> {
        if start + len > self.len {
            return Err(Error::Input(format!("positions {start}..{} of a cache of {}", start + len, self.len)));
        }
        self.layers
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok((k.get(row)?.narrow(1, start, len)?, v.get(row)?.narrow(1, start, len)?)),
                None => Err(Error::Input("positions of an empty cache".into())),
            })
            .collect()
    }

    /// A one-row cache of `len` zero positions (all padding), shaped like this one's rows.
    pub fn zeros_like(&self, len: usize) -> Result<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                Some((k, _)) => {
                    let (_, heads, _, dim) = k.dims4()?;
                    let zeros = || Tensor::zeros((1, heads, len, dim), k.dtype(), k.device());
                    Ok(Some((zeros()?, zeros()?)))
                }
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len })
    }

    /// Drop the first `n` positions of every row (padding that all rows share).
    pub fn drop_front(&self, n: usize) -> Result<KvCache> {
        let len = self.len - n;
        self.map(len, |t| Ok(t.narrow(2, n, len)?.contiguous()?))
    }

    /// The rows of `self`, then those of `other` (both of the same length).
    pub fn cat_rows(&self, other: &KvCache) -> Result<KvCache> {
        if self.len != other.len {
            return Err(Error::Input(format!("joining KV caches of {} and {} positions", self.len, other.len)));
        }
        let layers = self
            .layers
            .iter()
            .zip(&other.layers)
            .map(|pair| match pair {
                (Some((k1, v1)), Some((k2, v2))) => {
                    let filled = |t: &Tensor| t.narrow(2, 0, self.len);
                    Ok(Some((
                        Tensor::cat(&[filled(k1)?, filled(k2)?], 0)?,
                        Tensor::cat(&[filled(v1)?, filled(v2)?], 0)?,
                    )))
                }
                (None, None) => Ok(None),
                _ => Err(Error::Input("joining a filled KV cache with an empty one".into())),
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len: self.len })
    }
}

/// A layer's key and value buffers of `batch` rows with room for `new` positions after
/// `past`, grown (with room to spare) when full; `like` (`[.., kv_heads, new, dim]`) gives
/// the rest of their shape.
fn reserve_kv(
    slot: &mut Option<(Tensor, Tensor)>,
    past: usize,
    batch: usize,
    like: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (_, heads, new, dim) = like.dims4()?;
    let total = past + new;
    match slot {
        Some((kb, _)) if kb.dim(2)? >= total => {}
        _ => {
            // Room for half as many positions again (at least 32): growing copies the cache
            // once per ~1.5× its length instead of once per step.
            let room = new + (total / 2).max(32);
            let grow = |buffer: Option<&Tensor>| -> Result<Tensor> {
                let room = Tensor::zeros((batch, heads, room, dim), like.dtype(), like.device())?;
                Ok(match buffer {
                    Some(buffer) => Tensor::cat(&[&buffer.narrow(2, 0, past)?, &room], 2)?,
                    None => room,
                })
            };
            let grown = match slot.as_ref() {
                Some((kb, vb)) => (grow(Some(kb))?, grow(Some(vb))?),
                None => (grow(None)?, grow(None)?),
            };
            *slot = Some(grown);
        }
    }
    let (kb, vb) = slot.as_ref().expect("filled above");
    Ok((kb.clone(), vb.clone()))
}

/// Write a layer's new keys and values (`[batch, kv_heads, new, dim]`) at position `past`
/// of its buffers and return views of all `past + new` positions.
fn append_kv(slot: &mut Option<(Tensor, Tensor)>, past: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let total = past + k.dim(2)?;
    let (kb, vb) = reserve_kv(slot, past, k.dim(0)?, k)?;
    kb.slice_set(&k.contiguous()?, 2, past)?;
    vb.slice_set(&v.contiguous()?, 2, past)?;
    Ok((kb.narrow(2, 0, total)?, vb.narrow(2, 0, total)?))
}

/// The rows of one forward step: their tokens, padding and (decoding in slots) cache slots,
/// as [`Model::forward_in_slots`] takes them.
struct StepRows<'a> {
    tokens: &'a Tensor,
    pads: &'a [usize],
    slots: Option<&'a [usize]>,
}

/// What every layer's attention needs of one forward step.
struct Step<'a> {
    /// Positions in the cache before this step's tokens.
    past: usize,
    kind: StepKind<'a>,
}

enum StepKind<'a> {
    /// Any number of tokens, any device: candle ops, with each token's rotary angles
    /// (`[batch, len, dim/2]`) and the additive mask; sliding layers' own beside them.
    Tensors(Box<Frames<TensorFrame>>),
    /// One token per row on the CPU (f32): the decoding kernels.
    Decode {
        rope: &'a RopeTables,
        /// Per row: the first position it attends to (those before are its padding).
        first: Vec<usize>,
        /// Per row: the new token's rotary position.
        positions: Vec<usize>,
        /// Per row: its slot of the cache's buffers.
        slots: Vec<usize>,
    },
}

/// A step's rotary angles and mask, for the global or the sliding layers.
struct TensorFrame {
    cos: Tensor,
    sin: Tensor,
    mask: Option<Mask>,
}

/// A Llama-family decoder.
#[derive(Clone, Debug)]
pub struct Model {
    config: Config,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Norm,
    lm_head: Linear,
    /// The output projection holds this rank's slice of the vocabulary (gathered after).
    vocab_parallel: bool,
    cos: Tensor,
    sin: Tensor,
    /// Gemma 3's sliding layers' rope tables (their own base).
    local_rope: Option<(Tensor, Tensor)>,
    /// The rope tables as host floats, for the CPU decoding kernels: f32 on the CPU, q and
    /// k projections in HF order (not llama.cpp's interleaved quantized ones).
    host_rope: Option<Arc<RopeTables>>,
    device: Device,
    dtype: DType,
    comm: Arc<dyn Comm>,
}

impl Model {
    /// Build the model from `source`, which names tensors as HF does.
    pub fn load(config: &Config, source: &mut dyn WeightSource, device: &Device) -> Result<Self> {
        Self::load_shard(config, source, device, Arc::new(Solo))
    }

    /// Build rank `comm.rank()`'s shard of a model split over `comm.size()` ranks: q/k/v and
    /// gate/up split by output rows (column-parallel), o and down by input columns
    /// (row-parallel, summed by an all-reduce), the output projection by vocabulary when it
    /// divides evenly (gathered), else kept whole. Norms and embeddings are replicated.
    pub fn load_shard(
        config: &Config,
        source: &mut dyn WeightSource,
        device: &Device,
        comm: Arc<dyn Comm>,
    ) -> Result<Self> {
        config.validate().map_err(|crate::Refused(message)| Error::Config { field: "config".into(), message })?;
        let (rank, size) = (comm.rank(), comm.size());
        let heads = config.num_attention_heads;
        let kv_heads = config.num_kv_heads();
        for (field, value) in [
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("intermediate_size", config.intermediate_size),
        ] {
            if !value.is_multiple_of(size) {
                return Err(Error::Config {
                    field: field.into(),
                    message: format!("{value} does not split over {size} tensor-parallel ranks"),
                });
            }
        }
        let shard = Shard { config, family: config.family(), rank, size };
        let embed = source.dense(family::EMBEDDING)?;
        let dtype = embed.dtype();
        let blocks = (0..config.num_hidden_layers).map(|i| shard.block(source, i)).collect::<Result<Vec<_>>>()?;
        let norm = Norm::load(source, family::FINAL_NORM, config)?;
        let classifier = config.classifier_labels().is_some();
        let vocab_parallel = size > 1 && config.vocab_size.is_multiple_of(size) && !classifier;
        let head_split = if vocab_parallel { Split::Rows } else { Split::Whole };
        let lm_head = if classifier {
            // A classifier's few scores: the whole head on every rank.
            shard.linear(source, family::SCORE, false, Split::Whole)?
        } else if source.contains(family::OUTPUT_WEIGHT) && !config.tie_word_embeddings {
            shard.linear(source, family::OUTPUT, false, head_split)?
        } else {
            // Tied embeddings: the output projection is the embedding table.
            let name = family::EMBEDDING;
            Linear {
                weight: head_split.weight(source.linear_weight(name)?, rank, size, name)?,
                bias: None,
                adapter: None,
            }
        };
        let (cos, sin) = rope_tables(config, device, dtype)?;
        let local_rope = local_rope_tables(config, device, dtype)?;
        let interleaved = blocks.iter().any(|b| b.attn.q_interleaved || b.attn.k_interleaved);
        let host_rope = match (device, dtype) {
            // Not for Gemma 3: the decoding kernels know neither its windows, its second
            // rope nor its score scale; its steps take the general path.
            _ if !config.family().plain_attention() => None,
            (Device::Cpu, DType::F32) if !interleaved => {
                Some(Arc::new(RopeTables::from_tensors(&cos, &sin)?)).filter(|t| t.fits(config.head_dim()))
            }
            _ => None,
        };
        Ok(Model {
            config: config.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            vocab_parallel,
            cos,
            sin,
            local_rope,
            host_rope,
            device: device.clone(),
            dtype,
            comm,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ranks this model is split over (one: [`Solo`]).
    pub fn comm(&self) -> &Arc<dyn Comm> {
        &self.comm
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// How many of the layers' projection groups (q/k/v, gate/up) are fused into one product
    /// ([`WeightSource::fuse`]).
    pub fn fused_projections(&self) -> usize {
        let fused = |fused: bool| usize::from(fused);
        self.blocks.iter().map(|b| fused(b.attn.qkv.fused) + fused(b.mlp.gate_up.fused)).sum()
    }

    /// Bytes of keys and values one cache position takes (every layer, this rank's heads).
    pub fn kv_bytes_per_position(&self) -> usize {
        let kv_heads = self.blocks.first().map_or(0, |b| b.attn.kv_heads);
        self.blocks.len() * 2 * kv_heads * self.config.head_dim() * self.dtype.size_in_bytes()
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.len())
    }

    /// Run `tokens` (`[batch, len]`, u32) through the decoder, appending to `cache`.
    /// `pads[b]` is the number of left-padding positions of row `b` since the cache began
    /// (masked, and not counted in positions). Returns logits of the last position only
    /// (`[batch, vocab]`) unless `all_positions`, then `[batch, len, vocab]`.
    pub fn forward(&self, tokens: &Tensor, pads: &[usize], cache: &mut KvCache, all_positions: bool) -> Result<Tensor> {
        self.forward_in_slots(tokens, pads, None, cache, all_positions)
    }

    /// Whether a decoding step can run rows that sit in any slots of the cache's buffers
    /// ([`forward_in_slots`](Self::forward_in_slots)): the CPU's decoding kernels read and
    /// write each row's slot in place, so a row that finishes leaves its slot behind instead
    /// of every other row being copied into new buffers.
    pub fn decodes_in_slots(&self) -> bool {
        self.host_rope.is_some()
    }

    /// [`forward`](Self::forward) where row `b` of `tokens` is row `slots[b]` of the cache's
    /// buffers (`None`: row `b`). Slots other than in order take one token per row and
    /// [`decodes_in_slots`](Self::decodes_in_slots).
    pub fn forward_in_slots(
        &self,
        tokens: &Tensor,
        pads: &[usize],
        slots: Option<&[usize]>,
        cache: &mut KvCache,
        all_positions: bool,
    ) -> Result<Tensor> {
        if self.comm.size() == 1 && self.device.is_cpu() {
            // Run the whole step on one of candle's rayon threads, so that the caller joins
            // each matmul's work instead of handing every one to the pool and sleeping until
            // it is done (two thread wake-ups per op, ~200 ops per step). Not with several
            // ranks: each rank's step blocks in the all-reduce waiting for the others, and
            // the pool may have fewer threads than ranks.
            return rayon::scope(|_| self.forward_here(StepRows { tokens, pads, slots }, cache, all_positions));
        }
        self.forward_here(StepRows { tokens, pads, slots }, cache, all_positions)
    }

    fn forward_here(&self, rows: StepRows, cache: &mut KvCache, all_positions: bool) -> Result<Tensor> {
        let StepRows { tokens, pads, slots } = rows;
        let (batch, len) = tokens.dims2()?;
        if pads.len() != batch {
            return Err(Error::Input(format!("{} padding counts for a batch of {batch}", pads.len())));
        }
        let in_order = slots.is_none_or(|s| s.iter().copied().eq(0..batch)) && cache.rows().is_none_or(|r| r == batch);
        if !in_order && (len != 1 || !self.decodes_in_slots() || slots.is_some_and(|s| s.len() != batch)) {
            return Err(Error::Input(format!(
                "rows in slots {slots:?} of a cache of {:?} rows: only one token per row on the CPU's decoding path",
                cache.rows()
            )));
        }
        if cache.layers.len() != self.blocks.len() {
            return Err(Error::Input(format!(
                "a key/value cache of {} layers for a model of {}: a cache belongs to one model",
                cache.layers.len(),
                self.blocks.len()
            )));
        }
        let past = cache.len();
        // Padding does not count: a row's positions start after its pads.
        let longest = (0..batch).map(|b| (past + len).saturating_sub(pads[b])).max().unwrap_or(0);
        if longest > self.config.context() {
            return Err(Error::Input(format!(
                "{longest} positions exceed the model's context of {} (max_position_embeddings, within this \
                 engine's limits)",
                self.config.context()
            )));
        }
        let kind = match &self.host_rope {
            Some(rope) if len == 1 => StepKind::Decode {
                rope,
                first: pads.iter().map(|&p| p.min(past)).collect(),
                positions: pads.iter().map(|&p| past.saturating_sub(p)).collect(),
                slots: slots.map_or_else(|| (0..batch).collect(), <[usize]>::to_vec),
            },
            _ => {
                let positions: Vec<u32> =
                    (0..batch).flat_map(|b| (0..len).map(move |t| (past + t).saturating_sub(pads[b]) as u32)).collect();
                let positions = Tensor::from_vec(positions, batch * len, &self.device)?;
                let angles = |table: &Tensor| -> Result<Tensor> {
                    Ok(table.index_select(&positions, 0)?.reshape((batch, len, ()))?)
                };
                let frames =
                    Frames::new(&self.config, (&self.cos, &self.sin), self.local_rope.as_ref(), |cos, sin, window| {
                        Ok::<_, Error>(TensorFrame {
                            cos: angles(cos)?,
                            sin: angles(sin)?,
                            mask: self.mask(batch, len, past, pads, window)?,
                        })
                    })?;
                StepKind::Tensors(Box::new(frames))
            }
        };
        let step = Step { past, kind };

        let mut x = decoder::embed(&self.embed, tokens, &self.config)?;
        for (block, layer_cache) in self.blocks.iter().zip(&mut cache.layers) {
            x = block.forward(x, &step, layer_cache, self.comm.as_ref())?;
        }
        cache.len = past + len;
        self.logits(x, all_positions)
    }

    /// The logits of `x` (`[batch, len, hidden]`, the last layer's output): at every position,
    /// or at the last one only.
    fn logits(&self, x: Tensor, all_positions: bool) -> Result<Tensor> {
        let len = x.dim(1)?;
        let x = if all_positions { x } else { x.narrow(1, len - 1, 1)?.contiguous()? };
        let logits = decoder::logits(self, &x, &self.config)?;
        Ok(if all_positions { logits } else { logits.squeeze(1)? })
    }

    /// Additive mask `[batch, 1, len, past + len]`: causal, padding keys hidden, and with a
    /// `window` the keys `window` or more positions behind the query. None when nothing is
    /// masked (one new token, no padding, all within the window).
    fn mask(
        &self,
        batch: usize,
        len: usize,
        past: usize,
        pads: &[usize],
        window: Option<usize>,
    ) -> Result<Option<Mask>> {
        let total = past + len;
        if len == 1 && pads.iter().all(|&p| p == 0) && total <= window.unwrap_or(usize::MAX) {
            return Ok(None);
        }
        let values: Vec<f32> =
            pads.iter().take(batch).flat_map(|&pad| crate::layer::mask_values(len, past, pad, window)).collect();
        Ok(Some(Mask::new(values, (batch, 1, len, total), &self.device, self.dtype)?))
    }
}

impl decoder::HeadOps for Model {
    type Error = Error;

    fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    fn project(&self, x: &Tensor) -> Result<Tensor> {
        let logits = self.lm_head.forward(x)?;
        if !self.vocab_parallel {
            return Ok(logits);
        }
        Ok(self.comm.all_gather(&logits.contiguous()?, logits.rank() - 1)?)
    }
}

/// One layer of one step as the composition (`decoder.rs`) sees it: the layer's weights,
/// the step's positions and mask, and the layer's slot of the cache.
struct LayerStep<'a> {
    block: &'a Block,
    step: &'a Step<'a>,
    cache: &'a mut Option<(Tensor, Tensor)>,
    comm: &'a dyn Comm,
}

impl Block {
    /// The layer over `x` (`decoder::layer`).
    fn forward(&self, x: Tensor, step: &Step, cache: &mut Option<(Tensor, Tensor)>, comm: &dyn Comm) -> Result<Tensor> {
        decoder::layer(&mut LayerStep { block: self, step, cache, comm }, &x)
    }
}

impl LayerStep<'_> {
    /// The rope tables and mask of this layer (its own for a sliding layer). A decoding
    /// step has none: its attention is `fused_attention`'s whole.
    fn frame(&self) -> Result<&TensorFrame> {
        match &self.step.kind {
            StepKind::Tensors(frames) => Ok(frames.of_layer(self.block.attn.sliding)),
            StepKind::Decode { .. } => Err(Error::Internal("a decoding step's layer reached the tensor path".into())),
        }
    }
}

impl decoder::LayerOps for LayerStep<'_> {
    type Error = Error;

    fn heads(&self) -> Heads {
        let attn = &self.block.attn;
        Heads { query: attn.heads, key_value: attn.kv_heads, dim: attn.head_dim }
    }

    fn activation(&self) -> Activation {
        self.block.mlp.activation
    }

    fn norm(&self, x: &Tensor, at: NormAt) -> Result<Option<Tensor>> {
        let block = self.block;
        let norm = match at {
            NormAt::In(Sublayer::Attention) => Some(&block.attn_norm),
            NormAt::Out(Sublayer::Attention) => block.post_attn_norm.as_ref(),
            NormAt::In(Sublayer::Mlp) => Some(&block.mlp_norm),
            NormAt::Out(Sublayer::Mlp) => block.post_mlp_norm.as_ref(),
            NormAt::Query => block.attn.qk_norm.as_ref().map(|n| &n.q),
            NormAt::Key => block.attn.qk_norm.as_ref().map(|n| &n.k),
        };
        norm.map(|norm| norm.forward(x)).transpose()
    }

    fn qkv(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        self.block.attn.qkv.forward(x)
    }

    fn gate_up(&self, x: &Tensor) -> Result<[Tensor; 2]> {
        self.block.mlp.gate_up.forward(x)
    }

    fn out(&self, x: &Tensor, sublayer: Sublayer) -> Result<Tensor> {
        match sublayer {
            Sublayer::Attention => self.block.attn.o.forward(x),
            Sublayer::Mlp => self.block.mlp.down.forward(x),
        }
    }

    fn split_heads(&self, y: &Tensor, part: Qkv) -> Result<Tensor> {
        let attn = &self.block.attn;
        let interleaved = match part {
            Qkv::Query => attn.q_interleaved,
            Qkv::Key => attn.k_interleaved,
            Qkv::Value => false,
        };
        attn.heads_of(y, self.heads().of(part), interleaved)
    }

    fn rope(&self, x: &Tensor) -> Result<Tensor> {
        // candle's fused rotary kernel (one op where the composed one launches ~8 kernels
        // for q and for k each: a GPU's decoding step is launch-bound); inference only, it
        // has no backward. Each row has its own positions: the tables are `[batch, len, dim/2]`.
        let frame = self.frame()?;
        Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, &frame.cos, &frame.sin)?)
    }

    fn keys_values(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        append_kv(self.cache, self.step.past, &k, &v)
    }

    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let mask = self.frame()?.mask.as_ref();
        let attn = &self.block.attn;
        if q.dtype() == DType::F32 && q.device().is_cpu() && crate::invariant::available() {
            // The learner's attention, to the bit (`invariant.rs`): keys summed one by one.
            return Ok(crate::invariant::attention(q, k, v, attn.scale as f32, mask)?);
        }
        // Grouped-query attention without copying keys and values per query head: the query
        // heads that share a key/value head are folded into its rows, `[b, kv, groups·len, d]`
        // (query heads are grouped contiguously), so k and v are used as they are cached.
        let (batch, _, len, _) = q.dims4()?;
        let groups = attn.heads / attn.kv_heads;
        let total = k.dim(2)?;
        let q = q.reshape((batch, attn.kv_heads, groups * len, attn.head_dim))?;
        let scores = (q.matmul(&k.t()?)? * attn.scale)?;
        let mut scores = scores.reshape((batch, attn.heads, len, total))?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(&mask.tensor(scores.device(), scores.dtype())?)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let weights = weights.reshape((batch, attn.kv_heads, groups * len, total))?;
        Ok(weights.matmul(v)?.reshape((batch, attn.heads, len, attn.head_dim))?)
    }

    fn fused_attention(&mut self, x: &Tensor) -> Result<Option<Tensor>> {
        match &self.step.kind {
            StepKind::Decode { rope, first, positions, slots } => {
                let attn = &self.block.attn;
                attn.forward_decoding(x, self.step.past, rope, (first, positions, slots), self.cache).map(Some)
            }
            StepKind::Tensors(_) => Ok(None),
        }
    }

    fn fused_mlp(&self, x: &Tensor) -> Result<Option<Tensor>> {
        self.block.mlp.fused(x)
    }

    fn sum_across_ranks(&self, x: Tensor) -> Result<Tensor> {
        Ok(self.comm.all_reduce_sum(&x)?)
    }
}

impl Attention {
    /// One new token per row on the CPU (f32): the projections, then the new key and value
    /// written into the cache and the attention in one op each (`decode_attention.rs`).
    fn forward_decoding(
        &self,
        x: &Tensor,
        past: usize,
        rope: &RopeTables,
        (first, positions, slots): (&[usize], &[usize], &[usize]),
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let batch = x.dim(0)?;
        // The buffers keep their rows (slots) whichever rows run.
        let buffer_rows = match cache {
            Some((kb, _)) => kb.dim(0)?,
            None => batch,
        };
        let [q, k, v] = self.qkv.forward(x)?;
        let (mut q, mut k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        if let Some(norm) = &self.qk_norm {
            q = norm.q.forward_flat(&q, self.heads)?;
            k = norm.k.forward_flat(&k, self.kv_heads)?;
        }
        let like = k.reshape((batch, self.kv_heads, 1, self.head_dim))?;
        let (kb, vb) = reserve_kv(cache, past, buffer_rows, &like)?;
        kb.inplace_op2(&k, &StoreToken { at: past, slots, rope: Some((rope, positions)) })?;
        vb.inplace_op2(&v, &StoreToken { at: past, slots, rope: None })?;
        let attention = DecodeAttention {
            heads: self.heads,
            total: past + 1,
            slots,
            first,
            positions,
            rope,
            scale: self.scale as f32,
        };
        let out = q.apply_op3_no_bwd(&kb, &vb, &attention)?;
        self.o.forward(&out)
    }

    /// A projection's output `[batch, len, heads · head_dim]` split into heads:
    /// `[batch, heads, len, head_dim]`.
    fn heads_of(&self, y: &Tensor, heads: usize, interleaved: bool) -> Result<Tensor> {
        let (batch, len, _) = y.dims3()?;
        let y = if interleaved {
            // llama.cpp stores q/k rows as interleaved pairs; reorder each head's outputs
            // (pairs (2i, 2i+1)) to HF's halves (i, i + dim/2).
            y.reshape((batch, len, heads, self.head_dim / 2, 2))?.transpose(3, 4)?.reshape((
                batch,
                len,
                heads,
                self.head_dim,
            ))?
        } else {
            y.reshape((batch, len, heads, self.head_dim))?
        };
        Ok(y.transpose(1, 2)?.contiguous()?)
    }
}

impl Mlp {
    /// The CPU's decoding kernel computes silu(gate) · up in one pass over both matrices (the
    /// fused matrix's halves are contiguous views); the base's only: not with adapters or
    /// biases. `None` where it does not apply (the composition's `decoder::mlp` then runs).
    fn fused(&self, x: &Tensor) -> Result<Option<Tensor>> {
        if let Some((gate, up)) = self.dense_gate_up()?
            && self.activation == Activation::Silu
            && decoding_kernel(x, &gate)
        {
            let hidden = decode_matmul::on_rows(x, gate.dim(0)?, |x2| {
                x2.apply_op3_no_bwd(&gate.contiguous()?, &up.contiguous()?, &SwiGluMatmul)
            })?;
            return self.down.forward(&hidden).map(Some);
        }
        Ok(None)
    }

    /// The gate and up matrices, when both are plain dense weights without bias or adapter.
    fn dense_gate_up(&self) -> Result<Option<(Tensor, Tensor)>> {
        Ok(self.gate_up.dense_parts()?.map(|[gate, up]| (gate, up)))
    }
}

/// How a rank takes its share of a matrix `[out, in]`.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// Column-parallel: a slice of the output rows (and of the bias).
    Rows,
    /// Row-parallel: a slice of the input columns; the partial outputs are summed.
    Columns,
    /// Replicated.
    Whole,
}

impl Split {
    fn weight(self, weight: Weight, rank: usize, size: usize, name: &str) -> Result<Weight> {
        if size == 1 || matches!(self, Split::Whole) {
            return Ok(weight);
        }
        let Weight::Dense(w) = weight else {
            return Err(Error::Config {
                field: name.into(),
                message: "quantized weights cannot be split for tensor parallelism; load dense weights".into(),
            });
        };
        let dim = if matches!(self, Split::Rows) { 0 } else { 1 };
        let part = w.dim(dim)? / size;
        Ok(Weight::Dense(w.narrow(dim, rank * part, part)?.contiguous()?))
    }

    fn bias(self, bias: Tensor, rank: usize, size: usize) -> Result<Tensor> {
        match self {
            _ if size == 1 => Ok(bias),
            Split::Rows => {
                let part = bias.dim(0)? / size;
                Ok(bias.narrow(0, rank * part, part)?.contiguous()?)
            }
            // The partial outputs are summed, so only one rank adds the bias.
            Split::Columns if rank != 0 => Ok(bias.zeros_like()?),
            Split::Columns | Split::Whole => Ok(bias),
        }
    }
}

/// What loading rank `rank`'s shard of a model of `config` reads each layer with.
struct Shard<'a> {
    config: &'a Config,
    family: &'static Family,
    rank: usize,
    size: usize,
}

impl Shard<'_> {
    /// Module `name`'s linear layer, this rank's share of it.
    fn linear(&self, source: &mut dyn WeightSource, name: &str, bias: bool, split: Split) -> Result<Linear> {
        let (rank, size) = (self.rank, self.size);
        let weight = split.weight(source.linear_weight(&family::weight(name))?, rank, size, name)?;
        let bias = if bias { Some(split.bias(source.dense(&family::bias(name))?, rank, size)?) } else { None };
        let adapter = source.adapter(name)?;
        if adapter.is_some() && size > 1 {
            return Err(Error::Config {
                field: name.into(),
                message: "LoRA adapters cannot be split for tensor parallelism yet; merge them first \
                          (`wirl model merge`)"
                    .into(),
            });
        }
        Ok(Linear { weight, bias, adapter })
    }

    /// Module `name` whose rows hold several parts (`widths`, every rank's rows): this rank's
    /// share of each part, stacked — what splitting the parts' own matrices by rows gives (a
    /// plain split by rows would hand rank 0 all of the query and none of the values).
    fn parts_linear(&self, source: &mut dyn WeightSource, name: &str, bias: bool, widths: &[usize]) -> Result<Linear> {
        if self.size == 1 {
            return self.linear(source, name, bias, Split::Rows);
        }
        let (rank, size) = (self.rank, self.size);
        let cut = |t: &Tensor| -> Result<Tensor> {
            let mut pieces = Vec::with_capacity(widths.len());
            let mut start = 0;
            for &width in widths {
                let share = width / size;
                pieces.push(t.narrow(0, start + rank * share, share)?);
                start += width;
            }
            Ok(Tensor::cat(&pieces, 0)?.contiguous()?)
        };
        let Weight::Dense(weight) = source.linear_weight(&family::weight(name))? else {
            return Err(Error::Config {
                field: name.into(),
                message: "quantized weights cannot be split for tensor parallelism; load dense weights".into(),
            });
        };
        if source.adapter(name)?.is_some() {
            return Err(Error::Config {
                field: name.into(),
                message: "LoRA adapters cannot be split for tensor parallelism yet; merge them first \
                          (`wirl model merge`)"
                    .into(),
            });
        }
        let bias = if bias { Some(cut(&source.dense(&family::bias(name))?)?) } else { None };
        Ok(Linear { weight: Weight::Dense(cut(&weight)?), bias, adapter: None })
    }

    /// The projections `declared` of layer `l` (column-parallel), their `N` parts' widths
    /// this rank's share.
    fn projections<const N: usize>(
        &self,
        source: &mut dyn WeightSource,
        l: &str,
        declared: &[Projection],
        bias: bool,
    ) -> Result<Projections<N>> {
        let mut names = Vec::with_capacity(declared.len());
        let mut modules = Vec::with_capacity(declared.len());
        let mut widths = Vec::with_capacity(N);
        let sizes = self.config.sizes();
        for projection in declared {
            let name = format!("{l}.{}", projection.module);
            let whole: Vec<usize> = projection.parts.iter().map(|part| part.width(&sizes)).collect();
            let linear = match whole.len() {
                1 => self.linear(source, &name, bias, Split::Rows)?,
                _ => self.parts_linear(source, &name, bias, &whole)?,
            };
            widths.extend(whole.iter().map(|width| width / self.size));
            modules.push((linear, projection.parts.len()));
            names.push(name);
        }
        let widths = widths.try_into().map_err(|widths: Vec<usize>| {
            Error::Internal(format!("{} declares {} parts where {N} are read", self.family.model_type, widths.len()))
        })?;
        Projections::new(source, names, modules, widths)
    }

    /// Layer `i`'s block.
    fn block(&self, source: &mut dyn WeightSource, i: usize) -> Result<Block> {
        let (config, family) = (self.config, self.family);
        let l = family::layer(i);
        let norm = |source: &mut dyn WeightSource, module: &str| {
            Norm::load(source, &family::weight(&format!("{l}.{module}")), config)
        };
        let interleaved = |source: &dyn WeightSource, part: Part| {
            family.module_of(part).is_some_and(|m| source.interleaved(&family::weight(&format!("{l}.{m}"))))
        };
        let norms = &family.norms;
        Ok(Block {
            attn_norm: norm(source, norms.attention_in)?,
            attn: Attention {
                qkv: self.projections(source, &l, family.attention_in, config.qkv_bias())?,
                o: self.linear(source, &format!("{l}.{}", family.attention_out), false, Split::Columns)?,
                heads: config.num_attention_heads / self.size,
                kv_heads: config.num_kv_heads() / self.size,
                head_dim: config.head_dim(),
                q_interleaved: interleaved(source, Part::Query),
                k_interleaved: interleaved(source, Part::Key),
                qk_norm: match norms.query_key {
                    Some((q, k)) => Some(QkNorm { q: norm(source, q)?, k: norm(source, k)? }),
                    None => None,
                },
                scale: config.attention_scale(),
                sliding: config.layer_is_sliding(i),
            },
            post_attn_norm: norms.attention_out.map(|n| norm(source, n)).transpose()?,
            mlp_norm: norm(source, norms.mlp_in)?,
            mlp: Mlp {
                gate_up: self.projections(source, &l, family.mlp_in, false)?,
                down: self.linear(source, &format!("{l}.{}", family.mlp_out), false, Split::Columns)?,
                activation: config.activation(),
            },
            post_mlp_norm: norms.mlp_out.map(|n| norm(source, n)).transpose()?,
        })
    }
}
