//! Each model family declared once: the tensors its checkpoints hold (by their Hugging Face
//! names), their shapes, and what the family does differently from the plain Llama layer
//! (norms, biases, activation, windows, llama.cpp's names). The engine's loader and forward
//! (`wirl_engine::llama`, `wirl_engine::load`), the trainer's `Net`, LoRA's targets
//! (`crate::lora`), export and `wirl model inspect` read these declarations: no other file
//! spells a weight's name, and a new family is one new file here (plus its fixture).
//!
//! Every family here is a decoder of the same skeleton: an embedding table, layers of
//! (norm → attention → residual, norm → gated MLP → residual), a final norm and an output
//! head (its own matrix, or the embeddings where tied). What a family declares is how its
//! layers name and group their tensors, and which variant of each part it runs.
//!
//! What this module must not know: how a forward is computed (candle, ranks, caches) — it
//! answers names, shapes and variants, and the code that computes asks it.

mod gemma3;
mod llama;
mod mistral;
mod phi3;
mod qwen2;
mod qwen3;

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// A model's sizes, as its config gives them (`Config::sizes`): what names and shapes
/// depend on. (This module does not read configs: `config.rs` asks it.)
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// What the last layer's states are projected to.
    pub head: Head,
    /// q, k and v carry biases (the config's `attention_bias`, else the family's).
    pub qkv_bias: bool,
}

/// What a checkpoint's head projects the last layer's states to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// The vocabulary's logits, by `lm_head` (`tied`: by the embedding table, no
    /// `lm_head.weight`): a causal language model.
    Vocabulary { tied: bool },
    /// `labels` scores, by `score` (no bias): a sequence classifier (transformers'
    /// `...ForSequenceClassification`, a reward model), read at a text's last token.
    Scores { labels: usize },
}

pub use gemma3::GEMMA3;
pub use llama::LLAMA;
pub use mistral::MISTRAL;
pub use phi3::PHI3;
pub use qwen2::QWEN2;
pub use qwen3::QWEN3;

/// The families this engine runs, by `model_type`.
pub const FAMILIES: [&Family; 6] = [&LLAMA, &QWEN2, &QWEN3, &MISTRAL, &GEMMA3, &PHI3];

/// The embedding table, `[vocab, hidden]`.
pub const EMBEDDING: &str = "model.embed_tokens.weight";
/// The norm after the last layer, `[hidden]`.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The output head's module (absent where tied to the embeddings).
pub const OUTPUT: &str = "lm_head";
/// The output head's matrix, `[vocab, hidden]`.
pub const OUTPUT_WEIGHT: &str = "lm_head.weight";
/// A sequence classifier's head module (instead of `lm_head`).
pub const SCORE: &str = "score";
/// A sequence classifier's head matrix, `[labels, hidden]`.
pub const SCORE_WEIGHT: &str = "score.weight";

/// The prefix of layer `i`'s tensors (`model.layers.{i}`).
pub fn layer(i: usize) -> String {
    format!("model.layers.{i}")
}

/// `module`'s weight matrix (`{module}.weight`).
pub fn weight(module: &str) -> String {
    format!("{module}.weight")
}

/// `module`'s bias (`{module}.bias`).
pub fn bias(module: &str) -> String {
    format!("{module}.bias")
}

/// The family of `model_type`, if this engine runs it.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.into_iter().find(|f| f.model_type == model_type)
}

/// The family whose GGUF files name `architecture` (`general.architecture`), if read.
pub fn by_gguf_architecture(architecture: &str) -> Option<&'static Family> {
    FAMILIES.into_iter().find(|f| f.gguf.is_some_and(|g| g.architecture == architecture))
}

/// The `model_type`s this engine runs, in [`FAMILIES`]' order.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.model_type).collect()
}

/// The GGUF architectures this engine reads.
pub fn gguf_architectures() -> Vec<&'static str> {
    FAMILIES.iter().filter_map(|f| f.gguf.map(|g| g.architecture)).collect()
}

/// What one output of a projection is. A checkpoint stores each in a matrix of its own
/// (Llama's `q_proj`, `k_proj`, `v_proj`) or several stacked by rows in one (a fused
/// `qkv_proj`): [`Projection::parts`] says which, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Query,
    Key,
    Value,
    Gate,
    Up,
}

impl Part {
    /// Rows of this part in a model of `sizes` (all ranks together).
    pub fn width(self, sizes: &Sizes) -> usize {
        match self {
            Part::Query => sizes.heads * sizes.head_dim,
            Part::Key | Part::Value => sizes.kv_heads * sizes.head_dim,
            Part::Gate | Part::Up => sizes.intermediate,
        }
    }
}

/// A projection that reads a layer's normed input: its module (relative to the layer) and
/// the parts its rows hold, in order.
#[derive(Clone, Copy, Debug)]
pub struct Projection {
    pub module: &'static str,
    pub parts: &'static [Part],
}

/// A layer's RMS norms, by module (relative to the layer).
#[derive(Clone, Copy, Debug)]
pub struct Norms {
    /// Before attention.
    pub attention_in: &'static str,
    /// After attention, before the residual (Gemma's sandwich).
    pub attention_out: Option<&'static str>,
    /// Before the MLP.
    pub mlp_in: &'static str,
    /// After the MLP, before the residual (Gemma's sandwich).
    pub mlp_out: Option<&'static str>,
    /// Each head's query and key normed over `head_dim` before the rope (Qwen3, Gemma 3).
    pub query_key: Option<(&'static str, &'static str)>,
    /// What every norm adds to its weight (Gemma stores `w` and scales by `1 + w`).
    pub offset: f64,
}

/// Which layers attend through a sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// None: every layer attends to every earlier position.
    None,
    /// Every layer, through `sliding_window` (Mistral): this engine runs such a model
    /// within one window (its context capped there), where sliding changes nothing.
    CapsContext,
    /// Layers by `layer_types` or `sliding_window_pattern` (Gemma 3), with a rope of their own.
    ByLayer,
}

/// What a family's GGUF files are called and how llama.cpp stored them.
#[derive(Clone, Copy, Debug)]
pub struct Gguf {
    /// `general.architecture`.
    pub architecture: &'static str,
    /// llama.cpp's name of each layer tensor (relative to `blk.{i}`), by HF name (relative to
    /// the layer), in tables.
    pub layer_names: &'static [&'static [(&'static str, &'static str)]],
    /// Whether llama.cpp permuted the q and k rows for its interleaved rope (not for
    /// NeoX-style ropes, which are HF's layout).
    pub permuted_rope: bool,
}

/// A model family: its layer's tensors and the variant of each part it runs.
#[derive(Debug)]
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// What people call it (`wirl model inspect`).
    pub title: &'static str,
    /// The projections of the attention's input, whose parts are query, key and value.
    pub attention_in: &'static [Projection],
    /// The attention's output projection (`[hidden, heads · head_dim]`).
    pub attention_out: &'static str,
    /// The projections of the MLP's input, whose parts are gate and up.
    pub mlp_in: &'static [Projection],
    /// The MLP's output projection (`[hidden, intermediate]`).
    pub mlp_out: &'static str,
    pub norms: Norms,
    /// Whether q, k and v carry biases when `attention_bias` is not in the config.
    pub qkv_bias: bool,
    /// The MLP's activation when the config names none.
    pub activation: Activation,
    /// Embeddings multiplied by `√hidden_size` (Gemma).
    pub scaled_embedding: bool,
    /// Whether the config's `query_pre_attn_scalar` and `final_logit_softcapping` apply
    /// (Gemma's keys: ignored for other families, as transformers does).
    pub gemma_scaling: bool,
    pub windows: Windows,
    /// `layer_types` this family runs.
    pub layer_types: &'static [&'static str],
    /// GGUF files of this family, where read.
    pub gguf: Option<Gguf>,
}

impl Family {
    /// Every projection module of a layer (relative to it): the attention's inputs and
    /// output, the MLP's inputs and output — LoRA's targets, by their last name component.
    pub fn projections(&self) -> Vec<&'static str> {
        let inputs = |p: &'static [Projection]| p.iter().map(|p| p.module);
        inputs(self.attention_in).chain([self.attention_out]).chain(inputs(self.mlp_in)).chain([self.mlp_out]).collect()
    }

    /// A projection module's short name, as LoRA's `target_modules` names it (`q_proj`).
    pub fn target_name(module: &str) -> &str {
        module.rsplit('.').next().unwrap_or(module)
    }

    /// The projection module (relative to a layer) whose short name is `target`.
    pub fn projection_named(&self, target: &str) -> Option<&'static str> {
        self.projections().into_iter().find(|m| Self::target_name(m) == target)
    }

    /// A projection module's `(out, in)` sizes in a model of `sizes`.
    pub fn projection_shape(&self, sizes: &Sizes, module: &str) -> Option<(usize, usize)> {
        let (hidden, q) = (sizes.hidden, Part::Query.width(sizes));
        let rows = |p: &Projection| p.parts.iter().map(|part| part.width(sizes)).sum::<usize>();
        if let Some(p) = self.attention_in.iter().chain(self.mlp_in).find(|p| p.module == module) {
            return Some((rows(p), hidden));
        }
        if module == self.attention_out {
            return Some((hidden, q));
        }
        (module == self.mlp_out).then_some((hidden, sizes.intermediate))
    }

    /// The module (relative to a layer) that holds `part` alone, if one does (not a fused one).
    pub fn module_of(&self, part: Part) -> Option<&'static str> {
        self.attention_in.iter().chain(self.mlp_in).find(|p| p.parts == [part]).map(|p| p.module)
    }

    /// Whether attention is the plain kind the CPU's decoding kernels run: no sliding layers
    /// with a rope of their own, scores scaled by `head_dim^-1/2`.
    pub fn plain_attention(&self) -> bool {
        self.windows != Windows::ByLayer && !self.gemma_scaling
    }

    /// Every norm module of a layer (relative to it).
    pub fn layer_norms(&self) -> Vec<&'static str> {
        let n = &self.norms;
        let mut norms = vec![n.attention_in];
        norms.extend(n.attention_out);
        norms.push(n.mlp_in);
        norms.extend(n.mlp_out);
        if let Some((q, k)) = n.query_key {
            norms.extend([q, k]);
        }
        norms
    }

    /// The HF names of every tensor a checkpoint of `sizes` stores (what loading reads and
    /// export writes), in layer order.
    pub fn tensor_names(&self, sizes: &Sizes) -> Vec<String> {
        let mut names = vec![EMBEDDING.to_string()];
        let biased = sizes.qkv_bias;
        for i in 0..sizes.layers {
            let l = layer(i);
            for module in self.layer_norms().into_iter().chain(self.projections()) {
                names.push(weight(&format!("{l}.{module}")));
            }
            if biased {
                names.extend(self.attention_in.iter().map(|p| bias(&format!("{l}.{}", p.module))));
            }
        }
        names.push(FINAL_NORM.into());
        match sizes.head {
            Head::Vocabulary { tied: true } => {}
            Head::Vocabulary { tied: false } => names.push(OUTPUT_WEIGHT.into()),
            Head::Scores { .. } => names.push(SCORE_WEIGHT.into()),
        }
        names
    }

    /// The shape tensor `name` has in a checkpoint of `sizes` (`None`: a name this family's
    /// checkpoints do not hold).
    pub fn expected_shape(&self, sizes: &Sizes, name: &str) -> Option<Vec<usize>> {
        let hidden = sizes.hidden;
        if name == EMBEDDING || name == OUTPUT_WEIGHT {
            return Some(vec![sizes.vocab, hidden]);
        }
        if name == FINAL_NORM {
            return Some(vec![hidden]);
        }
        if let (SCORE_WEIGHT, Head::Scores { labels }) = (name, sizes.head) {
            return Some(vec![labels, hidden]);
        }
        let (_, within) = name.strip_prefix("model.layers.")?.split_once('.')?;
        if let Some(module) = within.strip_suffix(".bias") {
            return self.attention_in.iter().any(|p| p.module == module).then(|| {
                let (rows, _) = self.projection_shape(sizes, module).unwrap_or_default();
                vec![rows]
            });
        }
        let module = within.strip_suffix(".weight")?;
        if let Some((out, input)) = self.projection_shape(sizes, module) {
            return Some(vec![out, input]);
        }
        let n = &self.norms;
        if n.query_key.is_some_and(|(q, k)| module == q || module == k) {
            return Some(vec![sizes.head_dim]);
        }
        self.layer_norms().contains(&module).then(|| vec![hidden])
    }

    /// Whether `name` is a projection's weight matrix in some layer (what the loader keeps in
    /// the matrices' dtype, or quantized).
    pub fn is_projection_weight(&self, name: &str) -> bool {
        let Some((_, within)) = name.strip_prefix("model.layers.").and_then(|rest| rest.split_once('.')) else {
            return false;
        };
        within.strip_suffix(".weight").is_some_and(|module| self.projections().contains(&module))
    }

    /// llama.cpp's name of the HF tensor `name` (unchanged where it has none).
    pub fn gguf_name(&self, name: &str) -> String {
        match name {
            EMBEDDING => return "token_embd.weight".into(),
            FINAL_NORM => return "output_norm.weight".into(),
            OUTPUT_WEIGHT => return "output.weight".into(),
            _ => {}
        }
        let Some((layer, within)) = name.strip_prefix("model.layers.").and_then(|rest| rest.split_once('.')) else {
            return name.into();
        };
        let names = self.gguf.map_or(&[][..], |g| g.layer_names).iter().flat_map(|table| table.iter());
        let mapped = names.into_iter().find(|(hf, _)| *hf == within).map_or(within, |(_, gguf)| gguf);
        format!("blk.{layer}.{mapped}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(family: &Family) -> Sizes {
        Sizes {
            vocab: 64,
            hidden: 32,
            intermediate: 48,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            head: Head::Vocabulary { tied: false },
            qkv_bias: family.qkv_bias,
        }
    }

    #[test]
    fn every_family_holds_each_part_once_in_order() {
        for family in FAMILIES {
            let parts: Vec<Part> =
                family.attention_in.iter().chain(family.mlp_in).flat_map(|p| p.parts.iter().copied()).collect();
            assert_eq!(parts, [Part::Query, Part::Key, Part::Value, Part::Gate, Part::Up], "{}", family.model_type);
        }
    }

    #[test]
    fn every_name_a_family_stores_has_a_shape() {
        for family in FAMILIES {
            let config = config(family);
            let names = family.tensor_names(&config);
            let unique: std::collections::HashSet<_> = names.iter().collect();
            assert_eq!(unique.len(), names.len(), "{}: a name twice", family.model_type);
            for name in &names {
                assert!(family.expected_shape(&config, name).is_some(), "{}: {name} has no shape", family.model_type);
            }
            assert_eq!(family.expected_shape(&config, "model.layers.1.mlp.down_proj.weight"), Some(vec![32, 48]));
            assert_eq!(family.expected_shape(&config, "model.layers.1.mlp.nonsense.weight"), None);
            assert!(family.is_projection_weight("model.layers.3.self_attn.o_proj.weight"));
            assert!(!family.is_projection_weight("model.layers.3.input_layernorm.weight"));
        }
    }

    #[test]
    fn a_fused_projection_holds_its_parts_rows() {
        let (llama, phi3) = (config(&LLAMA), config(&PHI3));
        assert_eq!(LLAMA.expected_shape(&llama, "model.layers.0.self_attn.q_proj.weight"), Some(vec![64, 32]));
        assert_eq!(LLAMA.expected_shape(&llama, "model.layers.0.self_attn.k_proj.weight"), Some(vec![32, 32]));
        // q (4 heads · 16) + k and v (2 heads · 16 each); gate and up (48 each).
        assert_eq!(PHI3.expected_shape(&phi3, "model.layers.0.self_attn.qkv_proj.weight"), Some(vec![128, 32]));
        assert_eq!(PHI3.expected_shape(&phi3, "model.layers.1.mlp.gate_up_proj.weight"), Some(vec![96, 32]));
        assert_eq!(PHI3.expected_shape(&phi3, "model.layers.0.self_attn.q_proj.weight"), None);
        assert_eq!(PHI3.projections(), ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]);
        assert_eq!(PHI3.module_of(Part::Query), None, "no matrix of the query alone");
    }

    #[test]
    fn gguf_names_are_llama_cpps() {
        assert_eq!(LLAMA.gguf_name("model.layers.2.post_attention_layernorm.weight"), "blk.2.ffn_norm.weight");
        assert_eq!(
            GEMMA3.gguf_name("model.layers.2.post_attention_layernorm.weight"),
            "blk.2.post_attention_norm.weight"
        );
        assert_eq!(GEMMA3.gguf_name("model.layers.0.pre_feedforward_layernorm.weight"), "blk.0.ffn_norm.weight");
        assert_eq!(LLAMA.gguf_name(EMBEDDING), "token_embd.weight");
        assert_eq!(LLAMA.gguf_name("lm_head.weight"), "output.weight");
        assert_eq!(gguf_architectures(), ["llama", "gemma3"]);
    }
}
