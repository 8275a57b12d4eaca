//! One decoder layer's composition, written once for the engine's decoder (`llama.rs`) and
//! the learner's forward (`wirl-grpo`'s `policy.rs`): which norms wrap which sublayer, the
//! residual sums, the attention's order (projections, heads, Qwen3's q/k norms, rope, keys
//! and values, attention, output), and the MLP's gate. Each side supplies the ops
//! ([`LayerOps`]) — the engine its key/value cache, decoding kernels and cross-rank sums, the
//! learner its differentiable products, LoRA variables and the prompt's keys shared by a
//! group — and both run [`layer`]. A family variant in the composition is one change here;
//! the variants' own math (masks, windows, Gemma's offsets and caps) is `layer.rs`'s, the
//! reductions `invariant.rs`'s.

use crate::config::{Activation, Config};
use crate::family::Norms;
use candle_core::Tensor;

/// The two parts of a layer, each normed in, optionally normed out, added to the residual.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sublayer {
    Attention,
    Mlp,
}

/// Where a norm sits in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormAt {
    /// Before the sublayer (every family).
    In(Sublayer),
    /// After the sublayer, before the residual (Gemma's sandwich).
    Out(Sublayer),
    /// Each head's query, before the rope (Qwen3, Gemma 3).
    Query,
    /// Each head's key, before the rope.
    Key,
}

impl NormAt {
    /// The module name of the family's norm here (`None`: the family has none here).
    pub fn module(self, norms: &Norms) -> Option<&'static str> {
        match self {
            NormAt::In(Sublayer::Attention) => Some(norms.attention_in),
            NormAt::Out(Sublayer::Attention) => norms.attention_out,
            NormAt::In(Sublayer::Mlp) => Some(norms.mlp_in),
            NormAt::Out(Sublayer::Mlp) => norms.mlp_out,
            NormAt::Query => norms.query_key.map(|(q, _)| q),
            NormAt::Key => norms.query_key.map(|(_, k)| k),
        }
    }
}

/// The attention's three projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qkv {
    Query,
    Key,
    Value,
}

/// This side's head counts (per rank under tensor parallelism) and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub query: usize,
    pub key_value: usize,
    pub dim: usize,
}

impl Heads {
    /// The heads of `part`.
    pub fn of(&self, part: Qkv) -> usize {
        match part {
            Qkv::Query => self.query,
            Qkv::Key | Qkv::Value => self.key_value,
        }
    }
}

/// What one side computes a layer with. Every method is a kernel or a lookup: the order they
/// are called in, and what is added to what, is [`layer`]'s.
pub trait LayerOps {
    /// The side's error (tensor errors convert into it; the engine's carry its own kinds,
    /// such as a full cache, through the composition unchanged).
    type Error: From<candle_core::Error>;
    /// This layer's head counts and width.
    fn heads(&self) -> Heads;
    /// The MLP's gate activation.
    fn activation(&self) -> Activation;
    /// `x` through the norm at `at`; `None` where the family has none there.
    fn norm(&self, x: &Tensor, at: NormAt) -> Result<Option<Tensor>, Self::Error>;
    /// The query, key and value projections of `x` (`[batch, len, hidden]`), each `[batch,
    /// len, heads · dim]`.
    fn qkv(&self, x: &Tensor) -> Result<[Tensor; 3], Self::Error>;
    /// The MLP's gate and up projections of `x`.
    fn gate_up(&self, x: &Tensor) -> Result<[Tensor; 2], Self::Error>;
    /// A sublayer's output projection (`o_proj`, `down_proj`).
    fn out(&self, x: &Tensor, sublayer: Sublayer) -> Result<Tensor, Self::Error>;
    /// A projection `[batch, len, heads · dim]` as heads `[batch, heads, len, dim]`.
    fn split_heads(&self, y: &Tensor, part: Qkv) -> Result<Tensor, Self::Error> {
        Ok(split_heads(y, self.heads().of(part), self.heads().dim)?)
    }
    /// `x` (`[batch, heads, len, dim]`) rotated by its positions.
    fn rope(&self, x: &Tensor) -> Result<Tensor, Self::Error>;
    /// The keys and values this layer's queries attend to, given its own new ones: a cache's
    /// earlier positions and these, or a shared prompt's and these.
    fn keys_values(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor), Self::Error>;
    /// Attention of `q` over `keys` and `values` under this step's mask, `[batch, heads, len,
    /// dim]` (grouped query heads share their key/value head).
    fn attend(&self, q: &Tensor, keys: &Tensor, values: &Tensor) -> Result<Tensor, Self::Error>;
    /// The attention whole by a kernel of this side's own (the engine's one-token decoding
    /// step), or `None` for the composition.
    fn fused_attention(&mut self, _x: &Tensor) -> Result<Option<Tensor>, Self::Error> {
        Ok(None)
    }
    /// The MLP whole by a kernel of this side's own (the engine's SwiGLU decoding kernel).
    fn fused_mlp(&self, _x: &Tensor) -> Result<Option<Tensor>, Self::Error> {
        Ok(None)
    }
    /// A sublayer's output summed across tensor-parallel ranks (one rank: itself).
    fn sum_across_ranks(&self, x: Tensor) -> Result<Tensor, Self::Error> {
        Ok(x)
    }
}

/// One decoder layer over `x` (`[batch, len, hidden]`): for the attention, then the MLP, the
/// input normed, the sublayer, its output summed across ranks and normed where the family
/// norms twice, added to the residual.
pub fn layer<O: LayerOps + ?Sized>(ops: &mut O, x: &Tensor) -> Result<Tensor, O::Error> {
    let mut x = x.clone();
    for sublayer in [Sublayer::Attention, Sublayer::Mlp] {
        let input = normed(ops, &x, NormAt::In(sublayer))?;
        let h = match sublayer {
            Sublayer::Attention => attention(ops, &input)?,
            Sublayer::Mlp => mlp(ops, &input)?,
        };
        let h = ops.sum_across_ranks(h)?;
        let h = normed(ops, &h, NormAt::Out(sublayer))?;
        x = (x + h)?;
    }
    Ok(x)
}

/// `x` through the norm at `at`, or `x` where the family has none.
fn normed<O: LayerOps + ?Sized>(ops: &O, x: &Tensor, at: NormAt) -> Result<Tensor, O::Error> {
    Ok(ops.norm(x, at)?.unwrap_or_else(|| x.clone()))
}

/// The attention sublayer of `x`, output-projected.
pub fn attention<O: LayerOps + ?Sized>(ops: &mut O, x: &Tensor) -> Result<Tensor, O::Error> {
    if let Some(out) = ops.fused_attention(x)? {
        return Ok(out);
    }
    let (batch, len, _) = x.dims3()?;
    let heads = ops.heads();
    let [q, k, v] = ops.qkv(x)?;
    let q = ops.split_heads(&q, Qkv::Query)?;
    let k = ops.split_heads(&k, Qkv::Key)?;
    let v = ops.split_heads(&v, Qkv::Value)?.contiguous()?;
    // Qwen3 and Gemma 3: each head's query and key normed over its width, before the rope.
    let q = normed(ops, &q, NormAt::Query)?;
    let k = normed(ops, &k, NormAt::Key)?;
    let q = ops.rope(&q)?;
    let k = ops.rope(&k)?;
    let (keys, values) = ops.keys_values(k, v)?;
    let out = ops.attend(&q, &keys, &values)?;
    let out = out.transpose(1, 2)?.reshape((batch, len, heads.query * heads.dim))?;
    ops.out(&out, Sublayer::Attention)
}

/// The MLP sublayer of `x`: the activated gate times up, projected down.
pub fn mlp<O: LayerOps + ?Sized>(ops: &O, x: &Tensor) -> Result<Tensor, O::Error> {
    if let Some(out) = ops.fused_mlp(x)? {
        return Ok(out);
    }
    let [gate, up] = ops.gate_up(x)?;
    let gate = crate::layer::gate_activation(&gate, ops.activation())?;
    ops.out(&(gate * up)?, Sublayer::Mlp)
}

/// `y` (`[batch, len, heads · dim]`) as `[batch, heads, len, dim]`.
pub fn split_heads(y: &Tensor, heads: usize, dim: usize) -> candle_core::Result<Tensor> {
    let (batch, len, _) = y.dims3()?;
    y.reshape((batch, len, heads, dim))?.transpose(1, 2)
}

/// The embeddings of `tokens` (`[batch, len]`) from `table`, as the family scales them:
/// `[batch, len, hidden]`. What both sides' first layer reads.
pub fn embed(table: &Tensor, tokens: &Tensor, config: &Config) -> candle_core::Result<Tensor> {
    let (batch, len) = tokens.dims2()?;
    let x = table.index_select(&tokens.flatten_all()?, 0)?.reshape((batch, len, ()))?;
    crate::layer::scale_embeddings(x, config)
}

/// What one side computes the head with.
pub trait HeadOps {
    type Error: From<candle_core::Error>;
    /// The final norm of the last layer's output.
    fn final_norm(&self, x: &Tensor) -> Result<Tensor, Self::Error>;
    /// The output projection (gathered across ranks where each holds a slice of the
    /// vocabulary).
    fn project(&self, x: &Tensor) -> Result<Tensor, Self::Error>;
}

/// The logits of the last layer's output `x`: normed, projected, capped as the family caps
/// them (`layer::softcap`).
pub fn logits<O: HeadOps + ?Sized>(ops: &O, x: &Tensor, config: &Config) -> Result<Tensor, O::Error> {
    let logits = ops.project(&ops.final_norm(x)?)?;
    Ok(crate::layer::softcap(logits, config)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::cell::RefCell;

    /// Ops that record what the composition asks of them, with a sandwich-normed family's
    /// norms (Gemma's four, plus q/k), each op adding a mark to its input so that the result
    /// says what was added to what.
    struct Recording {
        calls: RefCell<Vec<String>>,
        sandwich: bool,
    }

    impl Recording {
        fn note(&self, what: impl Into<String>) {
            self.calls.borrow_mut().push(what.into());
        }
    }

    impl LayerOps for Recording {
        type Error = candle_core::Error;
        fn heads(&self) -> Heads {
            Heads { query: 2, key_value: 1, dim: 2 }
        }
        fn activation(&self) -> Activation {
            Activation::Silu
        }
        fn norm(&self, x: &Tensor, at: NormAt) -> candle_core::Result<Option<Tensor>> {
            if matches!(at, NormAt::Out(_)) && !self.sandwich {
                return Ok(None);
            }
            self.note(format!("norm {at:?}"));
            Ok(Some(x.clone()))
        }
        fn qkv(&self, x: &Tensor) -> candle_core::Result<[Tensor; 3]> {
            self.note("qkv");
            let (b, l, _) = x.dims3()?;
            let q = Tensor::ones((b, l, 4), candle_core::DType::F32, x.device())?;
            let kv = Tensor::ones((b, l, 2), candle_core::DType::F32, x.device())?;
            Ok([q, kv.clone(), kv])
        }
        fn gate_up(&self, x: &Tensor) -> candle_core::Result<[Tensor; 2]> {
            self.note("gate_up");
            Ok([x.clone(), x.clone()])
        }
        fn out(&self, x: &Tensor, sublayer: Sublayer) -> candle_core::Result<Tensor> {
            self.note(format!("out {sublayer:?}"));
            let (b, l, _) = x.dims3()?;
            // The hidden width is 4: a sublayer adds 1 to the residual.
            Tensor::ones((b, l, 4), candle_core::DType::F32, x.device())
        }
        fn rope(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            self.note(format!("rope {}", x.dim(1)?));
            Ok(x.clone())
        }
        fn keys_values(&mut self, k: Tensor, v: Tensor) -> candle_core::Result<(Tensor, Tensor)> {
            self.note("keys_values");
            Ok((k, v))
        }
        fn attend(&self, q: &Tensor, keys: &Tensor, _values: &Tensor) -> candle_core::Result<Tensor> {
            self.note(format!("attend {} over {}", q.dim(1)?, keys.dim(1)?));
            Ok(q.clone())
        }
        fn sum_across_ranks(&self, x: Tensor) -> candle_core::Result<Tensor> {
            self.note("sum");
            Ok(x)
        }
    }

    #[test]
    fn a_layer_norms_attends_and_adds_in_the_familys_order() {
        let x = Tensor::zeros((1, 3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        for sandwich in [false, true] {
            let mut ops = Recording { calls: RefCell::new(Vec::new()), sandwich };
            let y = layer(&mut ops, &x).unwrap();
            // Each sublayer's output (ones) added to the residual once.
            assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![2.0; 12]);
            let out = |s: &str| if sandwich { vec![format!("norm Out({s})")] } else { vec![] };
            let mut want: Vec<String> = ["norm In(Attention)", "qkv", "norm Query", "norm Key", "rope 2", "rope 1"]
                .into_iter()
                .chain(["keys_values", "attend 2 over 1", "out Attention", "sum"])
                .map(String::from)
                .collect();
            want.extend(out("Attention"));
            want.extend(["norm In(Mlp)", "gate_up", "out Mlp", "sum"].map(String::from));
            want.extend(out("Mlp"));
            assert_eq!(*ops.calls.borrow(), want, "sandwich {sandwich}");
        }
    }
}
