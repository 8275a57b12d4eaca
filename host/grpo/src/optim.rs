//! AdamW with global gradient-norm clipping and a learning-rate schedule. Written here rather
//! than taken from candle-nn so that its moments can be checkpointed and restored exactly.

use crate::grads::{GradSum, Gradients, update_in_place, with_f32};
use candle_core::{Result, Tensor, Var};
use serde::{Deserialize, Serialize};

/// Learning rate over steps: linear warmup from 0, then constant or cosine decay to 0.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    Constant,
    Cosine,
}

pub fn learning_rate(peak: f64, step: usize, warmup: usize, total: usize, schedule: Schedule) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    match schedule {
        Schedule::Constant => peak,
        Schedule::Cosine => {
            let span = total.saturating_sub(warmup).max(1) as f64;
            let progress = ((step - warmup) as f64 / span).min(1.0);
            peak * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// AdamW over a fixed list of variables.
pub struct Optimizer {
    vars: Vec<Var>,
    /// First and second moments, one pair per variable; allocated by the first update (an
    /// optimizer that never steps, as in `wirl eval`, costs no memory).
    moments: Vec<(Tensor, Tensor)>,
    /// Updates applied so far.
    pub steps: usize,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Update f32 CPU variables in place with loops (the default); false, or on another
    /// device: with candle's tensor ops, the new values copied into each variable's storage.
    pub fast_paths: bool,
}

impl Optimizer {
    pub fn new(vars: Vec<Var>, weight_decay: f64) -> Result<Self> {
        Ok(Optimizer {
            vars,
            moments: Vec::new(),
            steps: 0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            fast_paths: true,
        })
    }

    /// The moments, in variable order (for checkpoints); empty before the first update.
    pub fn moments(&self) -> &[(Tensor, Tensor)] {
        &self.moments
    }

    /// Restore moments saved by a checkpoint (read on the CPU): each pair goes to its
    /// variable's device, where the update reads it (a GPU's update is tensor ops).
    pub fn set_moments(&mut self, moments: Vec<(Tensor, Tensor)>, steps: usize) -> Result<()> {
        if moments.len() != self.vars.len() {
            candle_core::bail!("{} moment pairs for {} variables", moments.len(), self.vars.len());
        }
        let mut placed = Vec::with_capacity(moments.len());
        for (i, ((m, v), var)) in moments.into_iter().zip(&self.vars).enumerate() {
            if m.shape() != var.shape() || v.shape() != var.shape() {
                candle_core::bail!(
                    "the moments of variable {i} are {:?} and {:?}, the variable {:?}",
                    m.dims(),
                    v.dims(),
                    var.dims()
                );
            }
            let device = var.device();
            placed.push((m.to_device(device)?.to_dtype(var.dtype())?, v.to_device(device)?.to_dtype(var.dtype())?));
        }
        self.moments = placed;
        self.steps = steps;
        Ok(())
    }

    /// The global L2 norm of the gradients of every variable.
    pub fn grad_norm(&self, grads: &Gradients) -> Result<f64> {
        let mut sum = 0.0;
        for var in &self.vars {
            if let Some(g) = grads.sum(var) {
                sum += g.sum_of_squares()?;
            }
        }
        Ok(sum.sqrt())
    }

    /// One update with learning rate `lr`, the gradients scaled down so that their global
    /// norm is at most `max_norm` (if given). Returns the norm before clipping.
    /// One AdamW update from `grads`, skipped (weights and moments untouched) when the
    /// gradient is not finite.
    pub fn step(&mut self, grads: &Gradients, lr: f64, max_norm: Option<f64>) -> Result<Update> {
        let norm = self.grad_norm(grads)?;
        let scale = match max_norm {
            Some(max) if norm > max && norm.is_finite() => max / (norm + 1e-6),
            _ => 1.0,
        };
        if !norm.is_finite() {
            // A NaN or infinite gradient would poison every weight and both moments.
            return Ok(Update { grad_norm: norm, applied: false });
        }
        if self.moments.is_empty() {
            self.moments = self.vars.iter().map(|v| Ok((v.zeros_like()?, v.zeros_like()?))).collect::<Result<_>>()?;
        }
        self.steps += 1;
        let t = self.steps as i32;
        let (c1, c2) = ((1.0 - self.beta1.powi(t)) as f32, (1.0 - self.beta2.powi(t)) as f32);
        let (b1, b2, eps, scale) = (self.beta1 as f32, self.beta2 as f32, self.eps as f32, scale as f32);
        let (lr, decay) = (lr as f32, (1.0 - lr * self.weight_decay) as f32);
        // On the CPU in place, a loop each (the weights' storage is the engine's too): three
        // passes over memory where tensor ops made ten temporary copies of every weight.
        // Elsewhere candle's ops, the result copied into the variable's own storage.
        for (var, (m, v)) in self.vars.iter().zip(self.moments.iter_mut()) {
            let Some(sum) = grads.sum(var) else { continue };
            if sum.len() != var.elem_count() {
                candle_core::bail!("a gradient of {} values for a variable of {}", sum.len(), var.elem_count());
            }
            let host = match sum {
                GradSum::Host(g)
                    if self.fast_paths && var.device().is_cpu() && var.dtype() == candle_core::DType::F32 =>
                {
                    g
                }
                _ => {
                    let g = (sum.to_tensor(var.shape(), var.device())?.to_dtype(var.dtype())? * f64::from(scale))?;
                    *m = ((&*m * f64::from(b1))? + (&g * f64::from(1.0 - b1))?)?;
                    *v = ((&*v * f64::from(b2))? + (g.sqr()? * f64::from(1.0 - b2))?)?;
                    let step = ((&*m / f64::from(c1))? / ((&*v / f64::from(c2))?.sqrt()? + f64::from(eps))?)?;
                    var.set(&((var.as_tensor().detach() * f64::from(decay))? - (step * f64::from(lr))?)?)?;
                    continue;
                }
            };
            let g = host;
            update_in_place(m, |start, m| {
                for (m, &g) in m.iter_mut().zip(&g[start..]) {
                    *m = *m * b1 + g * scale * (1.0 - b1);
                }
            })?;
            update_in_place(v, |start, v| {
                for (v, &g) in v.iter_mut().zip(&g[start..]) {
                    let g = g * scale;
                    *v = *v * b2 + g * g * (1.0 - b2);
                }
            })?;
            with_f32(m, |m| {
                with_f32(v, |v| {
                    update_in_place(var.as_tensor(), |start, w| {
                        for ((w, &m), &v) in w.iter_mut().zip(&m[start..]).zip(&v[start..]) {
                            let step = (m / c1) / ((v / c2).sqrt() + eps);
                            *w = *w * decay - step * lr;
                        }
                    })
                })
            })?;
        }
        Ok(Update { grad_norm: norm, applied: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::backprop::GradStore;
    use candle_core::{DType, Device};

    fn gradients(store: GradStore, var: &Var) -> Gradients {
        gradients_into(Gradients::new(), store, var)
    }

    fn gradients_into(mut grads: Gradients, mut store: GradStore, var: &Var) -> Gradients {
        grads.absorb(&mut store, [var]).unwrap();
        grads
    }

    #[test]
    fn restored_moments_must_fit_their_variables() {
        let var = Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let mut optimizer = Optimizer::new(vec![var], 0.0).unwrap();
        let pair = |n: usize| {
            (Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap(), Tensor::ones(n, DType::F32, &Device::Cpu).unwrap())
        };
        let error = optimizer.set_moments(vec![pair(3)], 5).unwrap_err().to_string();
        assert!(error.contains("variable 0 are [3]") && error.contains("the variable [2]"), "{error}");
        assert!(optimizer.moments().is_empty() && optimizer.steps == 0, "nothing taken from a refused checkpoint");
        assert!(optimizer.set_moments(vec![], 5).is_err());
        optimizer.set_moments(vec![pair(2)], 5).unwrap();
        assert_eq!(optimizer.steps, 5);
        assert_eq!(optimizer.moments()[0].1.device().location(), optimizer.vars[0].device().location());
    }

    #[test]
    fn schedule_by_hand() {
        assert_eq!(learning_rate(1.0, 0, 4, 10, Schedule::Constant), 0.25);
        assert_eq!(learning_rate(1.0, 3, 4, 10, Schedule::Constant), 1.0);
        assert_eq!(learning_rate(1.0, 7, 4, 10, Schedule::Constant), 1.0);
        assert!((learning_rate(1.0, 4, 4, 10, Schedule::Cosine) - 1.0).abs() < 1e-12);
        assert!((learning_rate(1.0, 7, 4, 10, Schedule::Cosine) - 0.5).abs() < 1e-12);
        assert!(learning_rate(1.0, 10, 4, 10, Schedule::Cosine).abs() < 1e-12);
    }

    #[test]
    fn adamw_first_step_and_clipping_by_hand() {
        // The first Adam step moves each weight by lr × sign(g) (m̂ / √v̂ = g / |g|).
        let var = Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(vec![var.clone()], 0.0).unwrap();
        let loss = (var.as_tensor() * Tensor::new(&[3.0f32, -4.0], &Device::Cpu).unwrap()).unwrap().sum_all().unwrap();
        let grads = gradients(loss.backward().unwrap(), &var);
        let update = opt.step(&grads, 0.1, Some(1.0)).unwrap();
        assert!(update.applied && (update.grad_norm - 5.0).abs() < 1e-6);
        let w: Vec<f32> = var.as_tensor().to_vec1().unwrap();
        assert!((w[0] - 0.9).abs() < 1e-5 && (w[1] + 1.9).abs() < 1e-5, "{w:?}");
        // Weight decay shrinks the weight by lr × wd × w before the step.
        let var = Var::new(&[1.0f32], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(vec![var.clone()], 0.5).unwrap();
        let grads = gradients((var.as_tensor() * 2.0).unwrap().sum_all().unwrap().backward().unwrap(), &var);
        opt.step(&grads, 0.1, None).unwrap();
        let w: Vec<f32> = var.as_tensor().to_vec1().unwrap();
        assert!((w[0] - (0.95 - 0.1)).abs() < 1e-5, "{w:?}");
    }

    /// The composed-ops update (what other devices run, from sums kept as tensors as a GPU
    /// keeps them) equals the in-place loops, with weight decay and clipping, over several
    /// steps.
    #[test]
    fn the_tensor_ops_update_equals_the_in_place_one() {
        let values: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let run = |fast: bool| {
            let var = Var::new(values.as_slice(), &Device::Cpu).unwrap();
            let mut opt = Optimizer::new(vec![var.clone()], 0.1).unwrap();
            opt.fast_paths = fast;
            for step in 0..3 {
                let factor: Vec<f32> = (0..300).map(|i| ((i + step * 7) % 13) as f32 - 6.0).collect();
                let factor = Tensor::new(factor.as_slice(), &Device::Cpu).unwrap();
                let loss = (var.as_tensor().sqr().unwrap() * factor).unwrap().sum_all().unwrap();
                let sums = if fast { Gradients::new() } else { Gradients::as_tensors() };
                let grads = gradients_into(sums, loss.backward().unwrap(), &var);
                assert_eq!(matches!(grads.sum(&var), Some(GradSum::Device(_))), !fast);
                assert!(opt.step(&grads, 0.01, Some(5.0)).unwrap().applied);
            }
            (var.as_tensor().to_vec1::<f32>().unwrap(), opt.moments()[0].1.to_vec1::<f32>().unwrap())
        };
        let ((fast, fast_v), (generic, generic_v)) = (run(true), run(false));
        let worst = fast.iter().zip(&generic).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "weights differ by {worst}");
        let worst = fast_v.iter().zip(&generic_v).map(|(a, b)| (a - b).abs() / a.abs().max(1e-6)).fold(0f32, f32::max);
        assert!(worst < 1e-5, "second moments differ by {worst} (relative)");
        assert_ne!(fast, values, "the weights moved");
    }

    #[test]
    fn a_non_finite_gradient_is_skipped_and_leaves_weights_and_moments_alone() {
        let var = Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(vec![var.clone()], 0.1).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let factor = Tensor::new(&[bad, 1.0], &Device::Cpu).unwrap();
            let grads = gradients((var.as_tensor() * factor).unwrap().sum_all().unwrap().backward().unwrap(), &var);
            let update = opt.step(&grads, 0.1, Some(1.0)).unwrap();
            assert!(!update.applied && !update.grad_norm.is_finite());
            assert_eq!(var.as_tensor().to_vec1::<f32>().unwrap(), [1.0, -2.0]);
            assert_eq!(opt.steps, 0);
        }
        // A finite one after them applies.
        let grads = gradients((var.as_tensor() * 3.0).unwrap().sum_all().unwrap().backward().unwrap(), &var);
        assert!(opt.step(&grads, 0.1, None).unwrap().applied);
        assert_eq!(opt.steps, 1);
    }
}

/// What an optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Update {
    /// The gradient's global norm before clipping.
    pub grad_norm: f64,
    /// False when the gradient was not finite and the update was skipped.
    pub applied: bool,
}
