//! The trainable policy: the engine's weights as variables, and a forward pass built only of
//! differentiable ops (candle's fused softmax, rms_norm and rope carry no gradients).
//!
//! A group's G completions share one prompt, so the prompt runs once and the completions
//! attend to its keys and values (broadcast over the group); the gradient through the shared
//! prefix is the sum over the group, as it would be with G copies. Completions are
//! right-padded: under the causal mask no real token attends to padding, so no padding mask
//! is needed, and padding positions get zero loss weight.

use candle_core::{D, DType, Device, Result, Tensor, Var};
use std::collections::HashMap;
use wirl_engine::Config;
use wirl_engine::llama::{repeat_kv, rope_tables, rotate_half_rope};

/// Weights by HF name, and the forward math over them. The same code runs the trainable
/// policy (variables: gradients flow) and the frozen reference (plain tensors).
pub struct Net {
    config: Config,
    weights: HashMap<String, Tensor>,
    cos: Tensor,
    sin: Tensor,
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
        let dtype = weights.get("model.embed_tokens.weight").map_or(DType::F32, |t| t.dtype());
        let (cos, sin) = rope_tables(config, device, dtype).map_err(candle_core::Error::wrap)?;
        Ok(Net { config: config.clone(), weights, cos, sin })
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
        let y = x.broadcast_matmul(&self.w(&format!("{name}.weight"))?.t()?)?;
        match self.weights.get(&format!("{name}.bias")) {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    fn rms_norm(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        let scale = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
        x.broadcast_mul(&scale)?.broadcast_mul(self.w(name)?)
    }

    /// Log-probabilities and entropies of `completions` after `prompt`.
    pub fn completion_stats(&self, prompt: &[u32], completions: &[Vec<u32>]) -> Result<TokenStats> {
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
        let hidden = self.forward(prefix, &inputs)?;
        let hidden = self.rms_norm(&hidden, "model.norm.weight")?;
        let head = if self.weights.contains_key("lm_head.weight") { "lm_head" } else { "model.embed_tokens" };
        let logits = hidden.broadcast_matmul(&self.w(&format!("{head}.weight"))?.t()?)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let logp = log_probs.gather(&targets, D::Minus1)?.squeeze(D::Minus1)?;
        let entropy = (log_probs.exp()? * &log_probs)?.sum(D::Minus1)?.neg()?;
        Ok(TokenStats { logp, entropy })
    }

    /// Hidden states of `inputs` (`[G, width]`, positions after `prefix`), which attend to the
    /// shared `prefix` and causally to themselves.
    fn forward(&self, prefix: &[u32], inputs: &Tensor) -> Result<Tensor> {
        let device = inputs.device();
        let (groups, width) = inputs.dims2()?;
        let p = prefix.len();
        let embed = self.w("model.embed_tokens.weight")?;
        let mut x = embed.index_select(&inputs.flatten_all()?, 0)?.reshape((groups, width, ()))?;
        let mut px = if p > 0 {
            let ids = Tensor::from_vec(prefix.to_vec(), p, device)?;
            Some(embed.index_select(&ids, 0)?.unsqueeze(0)?)
        } else {
            None
        };
        let (pcos, psin) = (self.cos.narrow(0, 0, p.max(1))?, self.sin.narrow(0, 0, p.max(1))?);
        let (cos, sin) = (self.cos.narrow(0, p, width)?, self.sin.narrow(0, p, width)?);
        let prefix_mask = causal_mask(p, 0, device, x.dtype())?;
        let mask = causal_mask(width, p, device, x.dtype())?;
        for i in 0..self.config.num_hidden_layers {
            let l = format!("model.layers.{i}");
            // The prefix runs once; its keys and values are shared by the group's rows.
            let prefix_kv = match &px {
                Some(h) => {
                    let normed = self.rms_norm(h, &format!("{l}.input_layernorm.weight"))?;
                    let (out, k, v) = self.attention(&normed, &l, &pcos, &psin, None, &prefix_mask)?;
                    let h = (h + self.linear(&out, &format!("{l}.self_attn.o_proj"))?)?;
                    let normed = self.rms_norm(&h, &format!("{l}.post_attention_layernorm.weight"))?;
                    px = Some((&h + self.mlp(&normed, &l)?)?);
                    Some((k, v))
                }
                None => None,
            };
            let normed = self.rms_norm(&x, &format!("{l}.input_layernorm.weight"))?;
            let (out, _, _) = self.attention(&normed, &l, &cos, &sin, prefix_kv.as_ref(), &mask)?;
            x = (x + self.linear(&out, &format!("{l}.self_attn.o_proj"))?)?;
            let normed = self.rms_norm(&x, &format!("{l}.post_attention_layernorm.weight"))?;
            x = (&x + self.mlp(&normed, &l)?)?;
        }
        Ok(x)
    }

    /// Attention of `x` (`[B, T, hidden]`) with keys/values of `prefix` (`[1, kv, P, dim]`)
    /// before its own. Returns the output before `o_proj`, and this call's own k and v.
    fn attention(
        &self,
        x: &Tensor,
        l: &str,
        cos: &Tensor,
        sin: &Tensor,
        prefix: Option<&(Tensor, Tensor)>,
        mask: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (batch, len, _) = x.dims3()?;
        let heads = self.config.num_attention_heads;
        let kv_heads = self.config.num_kv_heads();
        let dim = self.config.head_dim();
        let split = |y: Tensor, h: usize| -> Result<Tensor> { y.reshape((batch, len, h, dim))?.transpose(1, 2) };
        let q = split(self.linear(x, &format!("{l}.self_attn.q_proj"))?, heads)?;
        let k = split(self.linear(x, &format!("{l}.self_attn.k_proj"))?, kv_heads)?;
        let v = split(self.linear(x, &format!("{l}.self_attn.v_proj"))?, kv_heads)?.contiguous()?;
        let (cos, sin) = (cos.unsqueeze(0)?.unsqueeze(0)?, sin.unsqueeze(0)?.unsqueeze(0)?);
        let q = rotate_half_rope(&q.contiguous()?, &cos, &sin).map_err(candle_core::Error::wrap)?;
        let k = rotate_half_rope(&k.contiguous()?, &cos, &sin).map_err(candle_core::Error::wrap)?;
        let (keys, values) = match prefix {
            Some((pk, pv)) => {
                let (_, kvh, p, d) = pk.dims4()?;
                let pk = pk.broadcast_as((batch, kvh, p, d))?;
                let pv = pv.broadcast_as((batch, kvh, p, d))?;
                (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?)
            }
            None => (k.clone(), v.clone()),
        };
        let groups = heads / kv_heads;
        let keys = repeat_kv(&keys, groups).map_err(candle_core::Error::wrap)?.contiguous()?;
        let values = repeat_kv(&values, groups).map_err(candle_core::Error::wrap)?.contiguous()?;
        let scores = (q.matmul(&keys.t()?)? / (dim as f64).sqrt())?.broadcast_add(mask)?;
        let weights = softmax(&scores)?;
        let out = weights.matmul(&values)?.transpose(1, 2)?.reshape((batch, len, heads * dim))?;
        Ok((out, k, v))
    }

    fn mlp(&self, x: &Tensor, l: &str) -> Result<Tensor> {
        let gate = self.linear(x, &format!("{l}.mlp.gate_proj"))?.silu()?;
        let up = self.linear(x, &format!("{l}.mlp.up_proj"))?;
        self.linear(&(gate * up)?, &format!("{l}.mlp.down_proj"))
    }
}

/// Softmax over the last dimension from differentiable ops (the max is a constant shift).
fn softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let e = shifted.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// `[len, past + len]`: query `q` sees every past key and its own and earlier positions.
fn causal_mask(len: usize, past: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    let values: Vec<f32> = (0..len)
        .flat_map(|q| (0..past + len).map(move |k| if k > past + q { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(values, (len.max(1), past + len), device)?.to_dtype(dtype)
}

/// The policy being trained: its weights as variables (updated in place by the optimizer,
/// so an inference model built from [`Policy::shared_tensors`] sees every update without a
/// copy).
pub struct Policy {
    net: Net,
    vars: Vec<(String, Var)>,
}

impl Policy {
    pub fn new(config: &Config, tensors: &HashMap<String, Tensor>, device: &Device) -> Result<Self> {
        let mut vars: Vec<(String, Var)> =
            tensors.iter().map(|(n, t)| Ok((n.clone(), Var::from_tensor(t)?))).collect::<Result<_>>()?;
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let weights = vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
        Ok(Policy { net: Net::new(config, weights, device)?, vars })
    }

    pub fn net(&self) -> &Net {
        &self.net
    }

    /// The variables, sorted by name (the optimizer's and checkpoints' order).
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The weights, sharing storage with the variables.
    pub fn shared_tensors(&self) -> &HashMap<String, Tensor> {
        self.net.weights()
    }

    /// A frozen copy (the KL reference).
    pub fn frozen_copy(&self, device: &Device) -> Result<Net> {
        let weights =
            self.vars.iter().map(|(n, v)| Ok((n.clone(), v.as_tensor().copy()?.detach()))).collect::<Result<_>>()?;
        Net::new(self.net.config(), weights, device)
    }
}
